"""A comparison's tuning (its spec's ``tune`` section, :class:`TuneSettings`): what each
recipe's study varies, how many trials it runs, on which seeds and by which score, checked
before anything runs. The studies themselves: :mod:`fedlit.comparison.studies`."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedlit.run_layout import MAX_SEED, VAL_ACC
from fedlit.search_space import Distribution

#: The pruners a spec may name: Optuna's median rule and successive halving, over rounds.
PRUNERS = ("median", "halving", "none")

#: The scores a study may maximise: the ``val/*`` metrics every run logs each round that grow
#: with a better model (``val/loss`` shrinks).
OBJECTIVES = (VAL_ACC,)

#: The most trials a study may be given (each is a run on each tuning seed).
MAX_TRIALS = 10_000


@dataclass(frozen=True)
class TuneSettings:
    """How a comparison tunes each recipe in each setting before scoring it (``tune``).

    Each recipe x setting gets a study with the same budget of rounds, ``trials`` unpruned
    trials' worth, for every recipe, the baseline and the oracle included (a pruned trial
    leaves its unrun rounds to more trials: :mod:`fedlit.comparison.studies`). A trial is the
    recipe's run with settings drawn from its method's search space
    (``FederatedMethod.search_space``), once per tuning seed;
    its score is ``objective`` on the server's validation set. The best trial's settings are
    then run on the comparison's ``seeds``, which the tuning never sees.

    Args:
        trials: the budget per recipe and setting, in unpruned trials (1 to
            :data:`MAX_TRIALS`): ``trials`` x a run's rounds x the tuning seeds rounds; at
            least ``trials`` trials run.
        seeds: the tuning's run seeds, none of them one of the comparison's ``seeds``.
        objective: the validation metric a trial is scored by (``val/acc``, the one the runs
            log each round that a study maximises); a ``test/*`` metric is refused.
        last_k: a trial's score is the mean of its last ``last_k`` rounds' objective.
        pruner: "median" (Optuna's MedianPruner), "halving" (SuccessiveHalvingPruner) or
            "none": a trial stops early when the rule says so after a round.
        startup_trials: trials drawn at random before TPE models the results, and before the
            median rule prunes (None: a third of ``trials``, at least 1).
        warmup_rounds: rounds a trial runs before the median rule may stop it.
        sampler_seed: the seed of Optuna's TPE sampler (trial n's draw is seeded by it and n).
        spaces: recipe stem -> dotted key -> range (``{low, high, log, integer}`` or
            ``{choices}``): narrows its method's search space key by key, or adds a key of its
            ``optional_space`` (e.g. FedProx's mu).
        replace: recipe stems whose space is their ``spaces`` entry alone (any keys of the
            recipe's config, checked by ``fedlit fit``'s parser before anything runs).
        runner_up: also run each study's runner-up settings on the scoring seeds
            (``<out>/<setting>/<recipe>_runner_up/seed<k>``), and report their test score
            minus the chosen settings', paired by seed: the selection noise measured on the
            test set (:mod:`fedlit.comparison.runner_up`). It doubles the scored runs.
    """

    trials: int = 12
    seeds: list[int] = field(default_factory=lambda: [100])
    objective: str = VAL_ACC
    last_k: int = 1
    pruner: str = "median"
    startup_trials: int | None = None
    warmup_rounds: int = 1
    sampler_seed: int = 0
    spaces: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    replace: list[str] = field(default_factory=list)
    runner_up: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.runner_up, bool):
            raise ValueError(f"tune.runner_up must be true or false, got {self.runner_up!r}")
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"tune.trials must be a positive integer, got {self.trials!r}")
        if self.trials > MAX_TRIALS:
            raise ValueError(
                f"tune.trials={self.trials}: at most {MAX_TRIALS} trials a study (each trial "
                "is a whole run on each tuning seed)"
            )
        if not isinstance(self.objective, str) or not self.objective.startswith("val/"):
            raise ValueError(
                f"tune.objective={self.objective!r}: tune on a validation metric (val/acc); a "
                "test metric would choose the settings on the test set the results are scored on"
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"tune.objective={self.objective!r}: not a validation metric the runs log "
                f"that a study maximises; give one of {list(OBJECTIVES)} (val/loss is a loss)"
            )
        if not isinstance(self.seeds, (list, tuple)) or not self.seeds:
            raise ValueError(f"tune.seeds: give a list of distinct seeds, got {self.seeds!r}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise ValueError(
                    f"tune.seeds: {seed!r} is not a seed (an integer in [0, {MAX_SEED}])"
                )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"tune.seeds: give distinct seeds, got {self.seeds}")
        seed = self.sampler_seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ValueError(
                f"tune.sampler_seed={seed!r}: a seed is an integer in [0, {MAX_SEED}]"
            )
        startup = self.startup_trials
        if startup is not None and (isinstance(startup, bool) or not isinstance(startup, int)):
            raise ValueError(f"tune.startup_trials must be an integer or null, got {startup!r}")
        for key in ("last_k", "warmup_rounds"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"tune.{key} must be a non-negative integer, got {value!r}")
        if self.last_k < 1:
            raise ValueError(f"tune.last_k must be a positive integer, got {self.last_k!r}")
        if self.startup_trials is not None and self.startup_trials < 1:
            raise ValueError(f"tune.startup_trials must be >= 1, got {self.startup_trials!r}")
        if self.pruner not in PRUNERS:
            raise ValueError(f"tune.pruner must be one of {PRUNERS}, got {self.pruner!r}")
        if not isinstance(self.spaces, Mapping):
            raise ValueError(f"tune.spaces: a mapping of recipe stems, got {self.spaces!r}")
        if not isinstance(self.replace, (list, tuple)):
            raise ValueError(f"tune.replace: a list of recipe stems, got {self.replace!r}")
        for stem, space in self.spaces.items():
            if not isinstance(space, Mapping):
                raise ValueError(f"tune.spaces.{stem}: a mapping of keys to ranges, got {space!r}")
            if not space:
                raise ValueError(f"tune.spaces.{stem}: an empty space (give at least one key)")
            for key, value in space.items():
                if not key or not key.strip():
                    raise ValueError(f"tune.spaces.{stem}: an empty key")
                try:
                    Distribution.parse(value)
                except ValueError as err:
                    raise ValueError(f"tune.spaces.{stem}.{key}: {err}") from None
        missing = [stem for stem in self.replace if stem not in self.spaces]
        if missing:
            raise ValueError(f"tune.replace: {missing[0]!r} has no space in tune.spaces")

    @property
    def startup(self) -> int:
        """Trials drawn at random (and not pruned) before TPE and the median rule start."""
        return self.startup_trials or max(1, self.trials // 3)

    def check(self, recipes: Sequence[str], seeds: Sequence[int]) -> None:
        """Refuse (ValueError naming it) tuning seeds that are also scoring ``seeds``, and a
        space for no recipe or with a key its method does not declare."""
        if importlib.util.find_spec("optuna") is None:
            raise ValueError("tune: needs Optuna (pip install 'fedlit[tune]')")
        overlap = sorted(set(self.seeds) & set(seeds))
        if overlap:
            raise ValueError(
                f"tune.seeds: {overlap} are also the comparison's seeds; the results must be "
                "scored on seeds the tuning never saw"
            )
        stems = {Path(r).stem: r for r in recipes}
        for stem in [*self.spaces, *self.replace]:
            if stem not in stems:
                raise ValueError(f"tune.spaces: {stem!r} is not one of the recipes {list(stems)}")
        for stem, recipe in stems.items():
            if not self.space(recipe):
                raise ValueError(
                    f"tune: {method_class(recipe).__name__} ({stem}) declares no search space, "
                    f"so its trials would all be the same run; give its keys in tune.spaces.{stem} "
                    "and list it in tune.replace"
                )
        for stem, space in self.spaces.items():
            if stem in self.replace:
                continue
            method = method_class(stems[stem])
            known = {**method.search_space, **method.optional_space}
            for key in space:
                if key not in known:
                    raise ValueError(
                        f"tune.spaces.{stem}.{key}: not a setting {method.__name__} tunes "
                        f"(its keys: {sorted(known)}); list the recipe in tune.replace to "
                        "give a space of your own"
                    )

    def space(self, recipe: str) -> dict[str, Distribution]:
        """The search space of ``recipe``'s study: its method's, narrowed (or replaced) by
        ``spaces``."""
        stem = Path(recipe).stem
        own = {key: Distribution.parse(v) for key, v in self.spaces.get(stem, {}).items()}
        if stem in self.replace:
            return own
        return {**method_class(recipe).search_space, **own}


def method_class(recipe: str) -> Any:
    """The method class a recipe file names (``model.class_path``)."""
    loaded = yaml.safe_load(Path(recipe).read_text()) or {}
    model = loaded.get("model") if isinstance(loaded, Mapping) else None
    path = model.get("class_path") if isinstance(model, Mapping) else None
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"{recipe}: names no model.class_path; give its space in tune.replace")
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def overrides(params: Mapping[str, Any]) -> list[str]:
    """A trial's settings as ``fedlit fit`` overrides (``--key=value``)."""
    return [f"--{key}={value}" for key, value in params.items()]
