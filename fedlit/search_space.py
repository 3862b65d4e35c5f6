"""What a tuning may vary: a setting's range (:class:`Distribution`), and the ranges every
method shares (:data:`SERVER_SPACE`, :data:`CLIENT_SPACE`).

A search space maps a dotted ``fedlit fit`` key (``model.init_args.optim.server_lr``) to its
distribution. Each method declares its own (``FederatedMethod.search_space``); a comparison's
``tune.spaces`` narrows or replaces it (:mod:`fedlit.comparison.tune`). This module imports
neither torch nor Optuna: a spec is checked before either loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The keys of a distribution given as a mapping (a comparison spec's ``tune.spaces``).
FIELDS = ("low", "high", "log", "integer", "choices")


@dataclass(frozen=True)
class Distribution:
    """One setting's range: a float in [low, high] (``log``: uniform in its logarithm), an
    integer in [low, high] (``integer``), or one of ``choices``.

    Args:
        low: the smallest value (with ``high``).
        high: the largest value, not below ``low``.
        log: draw uniformly in log space (``low`` > 0).
        integer: draw integers.
        choices: the values to choose from (instead of ``low`` and ``high``).
    """

    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.choices is not None:
            if self.low is not None or self.high is not None or not self.choices:
                raise ValueError("give either choices (at least one) or low and high")
            return
        if self.low is None or self.high is None:
            raise ValueError("give low and high (or choices)")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"low and high must be finite, got {self.low}, {self.high}")
        if self.low > self.high:
            raise ValueError(f"low={self.low} is above high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low}")
        if self.integer and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"an integer range needs integer ends, got {self.low}, {self.high}")

    @classmethod
    def parse(cls, value: Any) -> Distribution:
        """A distribution from a spec's mapping (``{low: 0.001, high: 0.1, log: true}``,
        ``{choices: [a, b]}``); a ValueError names what is wrong."""
        if isinstance(value, Distribution):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"give a mapping of {FIELDS}, got {value!r}")
        unknown = [k for k in value if k not in FIELDS]
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} (fields: {FIELDS})")
        choices = value.get("choices")
        if choices is not None and not isinstance(choices, (list, tuple)):
            raise ValueError(f"choices: give a list, got {choices!r}")
        return cls(
            low=_number(value.get("low"), "low"),
            high=_number(value.get("high"), "high"),
            log=bool(value.get("log", False)),
            integer=bool(value.get("integer", False)),
            choices=tuple(choices) if choices is not None else None,
        )

    def describe(self) -> str:
        """The range in words, as the docs' method pages list it."""
        if self.choices is not None:
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        kind = "integer" if self.integer else "log-uniform" if self.log else "uniform"
        assert self.low is not None and self.high is not None
        low, high = (int(self.low), int(self.high)) if self.integer else (self.low, self.high)
        return f"{kind} in [{low}, {high}]"

    def to_optuna(self) -> Any:
        """Optuna's distribution of this range."""
        import optuna.distributions as od

        if self.choices is not None:
            return od.CategoricalDistribution(self.choices)
        assert self.low is not None and self.high is not None
        if self.integer:
            return od.IntDistribution(int(self.low), int(self.high), log=self.log)
        return od.FloatDistribution(float(self.low), float(self.high), log=self.log)


def _number(value: Any, name: str) -> float | None:
    """A range's end: a number (a string YAML left unread, as ``1e-3``, read as one); another
    value refused naming ``name``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} is not a number")
    return value


def log_uniform(low: float, high: float) -> Distribution:
    return Distribution(low, high, log=True)


def uniform(low: float, high: float) -> Distribution:
    return Distribution(low, high)


def integer(low: int, high: int) -> Distribution:
    return Distribution(low, high, integer=True)


SERVER_LR = "model.init_args.optim.server_lr"
CLIENT_LR = "model.init_args.optim.client_lr"
SERVER_EPOCHS = "federation.server_epochs"

#: What every method tunes, the baseline included: the server's learning rate (SGD with
#: momentum: FixMatch's and paper 002's 0.03 near the middle, in log scale) and epochs a round.
SERVER_SPACE: dict[str, Distribution] = {
    SERVER_LR: log_uniform(0.001, 0.1),
    SERVER_EPOCHS: integer(1, 3),
}
#: What every method with clients adds: the clients' learning rate (papers 000-004: 0.01-0.05).
CLIENT_SPACE: dict[str, Distribution] = {**SERVER_SPACE, CLIENT_LR: log_uniform(0.001, 0.1)}


def space_table(space: Mapping[str, Distribution]) -> str:
    """A search space as the Markdown table the docs' method pages show."""
    lines = ["| setting | range |", "|---|---|"]
    lines += [f"| `{key}` | {dist.describe()} |" for key, dist in space.items()]
    return "\n".join(lines)
