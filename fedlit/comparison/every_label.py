"""A comparison's row *Server-SL on every label* (``every_label``): the baseline's recipe (at
its study's chosen settings in a tuned comparison), trained on the server's training and
validation labels together, untuned, on the scoring seeds. The labels are one budget: the
validation set is carved from it, and what the tuning spent on choosing (or an untuned
comparison held back to watch) is what this row trains on more. The row beside the baseline
shows what that cost (Oliver et al., arXiv 1804.09170)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlit.comparison.plan import ROOT_DIR_ARG, PlannedRun
from fedlit.comparison.spec import Comparison

#: The row's name: the baseline's, then this.
SUFFIX = "_every_label"
LABELED = "data.labeled_per_class"
VAL = "data.val_per_class"


@dataclass(frozen=True)
class EveryLabelRun(PlannedRun):
    """A run of the row: the baseline's recipe, named (``run.json``'s method) by the row."""

    row: str = ""

    @property
    def method(self) -> str:
        return self.row


def row_name(comparison: Comparison) -> str:
    """The row's name: ``<baseline>_every_label``."""
    assert comparison.baseline is not None
    return f"{comparison.baseline}{SUFFIX}"


def label_budget(flat: dict[str, Any], where: str) -> tuple[int, int]:
    """A run's training and validation labels per class (its flat config's
    ``data.labeled_per_class`` and ``data.val_per_class``); ValueError naming the key where
    the row cannot be made: labels given as a fraction, or no validation set."""
    labeled, val = flat.get(LABELED), flat.get(VAL)
    if not isinstance(labeled, int) or isinstance(labeled, bool):
        raise ValueError(
            f"every_label: {where} gives {LABELED}={labeled!r}; the row needs a number of "
            "labels per class to add the validation labels to"
        )
    if not isinstance(val, int) or isinstance(val, bool) or val < 1:
        raise ValueError(
            f"every_label: {where} gives {VAL}={val!r}; with no validation labels the row "
            "would be the baseline"
        )
    return labeled, val


def budget_line(labeled: int, val: int) -> str:
    """The report's line on the label budget, flagged where the validation set is larger than
    the training labels."""
    line = (
        f"- *labels*: one budget of {labeled + val} per class: {labeled} to train on, {val} "
        "carved from it to choose on"
    )
    if val > labeled:
        line += (
            " (**the validation set is larger than the training labels**: a practitioner "
            "holding these labels would train on them; Oliver et al.)"
        )
    return line + "."


def every_label_runs(
    comparison: Comparison,
    runs: Sequence[PlannedRun],
    flat: Callable[[Sequence[str]], dict[str, Any]] | None = None,
) -> dict[EveryLabelRun, PlannedRun]:
    """The row's runs, each with the baseline's scored run it is made from (``runs``: the
    comparison's scored runs with their chosen settings; ``flat``: a run's flat config): the
    same arguments, its warm start included, with ``data.labeled_per_class`` the training and
    validation labels together and no validation set, in ``<out>/<setting>/<row>/seed<k>``."""
    name = row_name(comparison)
    flat = flat or flat_config
    out: dict[EveryLabelRun, PlannedRun] = {}
    for run in runs:
        if run.method != comparison.baseline:
            continue
        labeled, val = label_budget(flat(run.args), f"{run.setting}/{run.method}")
        run_dir = comparison.run_dir(run.setting, name, run.seed)
        seed_at = next(i for i, a in enumerate(run.args) if a.startswith("--seed_everything="))
        more = [f"--{LABELED}={labeled + val}", f"--{VAL}=0"]
        args = [*run.args[:seed_at], *more, *run.args[seed_at:]]
        args = [_renamed(a, run, run_dir, name) for a in args]
        extra = EveryLabelRun(run.recipe, run.setting, run.seed, run_dir, tuple(args), row=name)
        out[extra] = run
    return out


def _renamed(arg: str, run: PlannedRun, run_dir: Path, name: str) -> str:
    """An argument of the baseline's run as the row's run takes it: its directory the row's,
    and a W&B logger's name, job type, tags and config naming the row."""
    if arg.startswith(ROOT_DIR_ARG):
        return f"{ROOT_DIR_ARG}{run_dir}"
    if not arg.startswith("--trainer.logger"):
        return arg
    method = run.method
    arg = arg.replace(str(run.run_dir), str(run_dir))
    for old, new in (
        (f"/{method}/seed", f"/{name}/seed"),
        (f"job_type={method}", f"job_type={name}"),
        (f" {method}, ", f" {name}, "),
        (f"method: {method},", f"method: {name},"),
    ):
        arg = arg.replace(old, new)
    return arg


def flat_config(args: Sequence[str]) -> dict[str, Any]:
    """A run's flat config from its ``fedlit fit`` arguments, as the run records it."""
    from fedlit.resolver import resolve

    return resolve(args).flat_config()


def check_every_label(
    comparison: Comparison, flat: Callable[[Sequence[str]], dict[str, Any]] | None = None
) -> None:
    """Refuse (ValueError naming the key) an ``every_label`` whose baseline's runs give no
    number of labels per class or no validation set, before anything runs."""
    from fedlit.comparison.plan import plan

    if not comparison.every_label:
        return
    runs = [r for r in plan(comparison) if r.method == comparison.baseline]
    seen = set()
    for run in runs:
        if run.setting not in seen:
            seen.add(run.setting)
            label_budget((flat or flat_config)(run.args), f"{run.setting}/{run.method}")


def with_every_label(
    comparison: Comparison,
    runs: Sequence[PlannedRun],
    per_run: dict[PlannedRun, int],
    flat: Callable[[Sequence[str]], dict[str, Any]] | None = None,
) -> tuple[list[PlannedRun], list[str]]:
    """A comparison's scored ``runs`` with the row's after them where ``every_label`` asks
    for it (``per_run`` learns their rounds: their baseline run's), and the report's lines on
    the label budget where the comparison is tuned or has the row (from the baseline's first
    run; none where it gives its labels as a fraction)."""
    flat = flat or flat_config
    base = [r for r in runs if r.method == comparison.baseline]
    if (comparison.tune is None and not comparison.every_label) or not base:
        return list(runs), []
    lines = []
    try:
        labeled, val = label_budget(flat(base[0].args), base[0].method)
        lines.append(budget_line(labeled, val))
    except ValueError:
        pass
    if not comparison.every_label:
        return list(runs), lines
    extra = every_label_runs(comparison, runs, flat)
    for run, made_from in extra.items():
        per_run[run] = per_run[made_from]
    lines.append(
        f"- *{row_name(comparison)}*: {comparison.baseline} on every label, the training and "
        "validation labels together (no validation set)"
        + (", at its study's chosen settings, untuned" if comparison.tune else "")
        + ", from the same warm start: what holding the validation labels back cost. Its "
        "server's epochs hold more labels (the budget table gives its steps)."
    )
    return [*runs, *extra], lines
