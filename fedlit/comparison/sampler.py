"""A tuning study's one sampler (:func:`number_seeded_sampler`): Optuna's TPE, each trial's
draw seeded by the sampler's seed and the trial's number alone. A study stopped and run again
then draws what an unstopped one draws, and the trials drawn together in a batch draw what
they would one by one. Optuna (the ``tune`` extra) is imported when a sampler is made."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def draw_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s draw in a study whose sampler's seed is ``seed``."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def number_seeded_sampler(seed: int, startup: int) -> Any:
    """An Optuna sampler (a ``BaseSampler``) whose draw for trial ``n`` is that of Optuna's
    TPE sampler (``startup`` random trials first) seeded with :func:`draw_seed` ``(seed, n)``,
    on the study's trials as they stand: it depends on the trial's number and the study,
    never on how many draws the sampler made before."""
    return _sampler_class()(seed, startup)


@functools.cache
def _sampler_class() -> Any:
    """The sampler's class (built on first use, so that Optuna is imported only when used)."""
    from optuna.samplers import BaseSampler, TPESampler

    class NumberSeededSampler(BaseSampler):
        def __init__(self, seed: int, startup: int) -> None:
            self.seed, self.startup = seed, startup
            self._by_number: dict[int, TPESampler] = {}

        def _tpe(self, trial: Any) -> TPESampler:
            if trial.number not in self._by_number:
                seeded = TPESampler(
                    seed=draw_seed(self.seed, trial.number), n_startup_trials=self.startup
                )
                self._by_number[trial.number] = seeded
            return self._by_number[trial.number]

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return self._tpe(trial).infer_relative_search_space(study, trial)

        def sample_relative(
            self, study: Any, trial: Any, search_space: dict[str, Any]
        ) -> dict[str, Any]:
            return self._tpe(trial).sample_relative(study, trial, search_space)

        def sample_independent(
            self, study: Any, trial: Any, param_name: str, param_distribution: Any
        ) -> Any:
            tpe = self._tpe(trial)
            return tpe.sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study: Any, trial: Any) -> None:
            self._tpe(trial).before_trial(study, trial)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self._tpe(trial).after_trial(study, trial, state, values)
            self._by_number.pop(trial.number, None)

    return NumberSeededSampler
