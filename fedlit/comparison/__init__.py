"""Comparisons: recipes x settings x seeds run one after another, and their report: the spec
(:mod:`~fedlit.comparison.spec`), its runs (:mod:`~fedlit.comparison.plan`), running them
(:mod:`~fedlit.comparison.runner`) and the report (:mod:`~fedlit.comparison.report`); a
tuned comparison's studies (:mod:`~fedlit.comparison.tune`, :mod:`~fedlit.comparison.studies`)."""

from fedlit.comparison.plan import PlannedRun, plan, run_state
from fedlit.comparison.runner import run_comparison
from fedlit.comparison.runs import execute
from fedlit.comparison.spec import Comparison, SourceRun, WandbSettings
from fedlit.comparison.tune import TuneSettings
from fedlit.run_layout import RUN_FILE

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
