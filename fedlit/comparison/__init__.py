"""Comparisons: recipes x settings x seeds run one after another, and their report: the spec
(:mod:`~fedlit.comparison.spec`), its runs (:mod:`~fedlit.comparison.plan`), running them
(:mod:`~fedlit.comparison.runner`) and the report (:mod:`~fedlit.comparison.report`); a
tuned comparison's studies (:mod:`~fedlit.comparison.tune`, :mod:`~fedlit.comparison.studies`).

The spec and the plan import neither torch nor Lightning (``fedlit compare --help`` reads the
spec); running and its runs are imported when first used (PEP 562)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedlit.comparison.plan import PlannedRun, plan, run_state
from fedlit.comparison.spec import Comparison, SourceRun, WandbSettings
from fedlit.comparison.tune import TuneSettings
from fedlit.run_layout import RUN_FILE

if TYPE_CHECKING:
    from fedlit.comparison.runner import run_comparison
    from fedlit.comparison.runs import execute

__all__ = [
    "RUN_FILE",
    "Comparison",
    "PlannedRun",
    "SourceRun",
    "TuneSettings",
    "WandbSettings",
    "execute",
    "plan",
    "run_comparison",
    "run_state",
]

#: Where each name imported on first use is defined.
_HOME_OF = {"run_comparison": "fedlit.comparison.runner", "execute": "fedlit.comparison.runs"}


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME_OF[name]), name)
