"""Which runs are seeds of one row: the flat-config keys in which a setting's runs differ, and
each run's config group (its row's label) from them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import import_module
from pathlib import Path

from fedlit.reporting.runs import RunRecord
from fedlit.run_layout import NOT_SETTING_KEYS


def under(key: str, groups: Sequence[str]) -> bool:
    """Whether flat-config ``key`` is one of ``groups`` or a setting inside one (``data`` holds
    ``data.batch_size``)."""
    return any(key == group or key.startswith(group + ".") for group in groups)


def setting_differences(runs: Sequence[RunRecord]) -> dict[str, list[tuple[object, Path]]]:
    """The flat-config keys in which ``runs`` differ, other than the seed, the run directory
    and display settings (:data:`~fedlit.run_layout.NOT_SETTING_KEYS`): key -> (value, run
    directory) for each run that has the key. Keys some runs lack are not compared."""
    keys = sorted({key for run in runs for key in run.config})
    out: dict[str, list[tuple[object, Path]]] = {}
    for key in keys:
        if under(key, NOT_SETTING_KEYS):
            continue
        values = [(run.config[key], run.run_dir) for run in runs if key in run.config]
        if len({repr(value) for value, _ in values}) > 1 and not one_class(v for v, _ in values):
            out[key] = values
    return out


def one_class(values: Iterable[object]) -> bool:
    """Whether ``values`` are paths of fedlit's that import one class, spelt two ways
    (``fedlit.data.partition.IID`` as recipes write it, ``fedlit.data.IID`` as the parser
    writes a name it resolved): one setting. Only ``fedlit.`` modules are imported."""
    listed = list(values)
    paths = {p for p in listed if isinstance(p, str) and p.startswith("fedlit.")}
    if len(paths) < 2 or not all(isinstance(p, str) and p in paths for p in listed):
        return False
    if not all(_CLASS_PATH.fullmatch(path) for path in paths):
        return False
    found = set()
    for path in paths:
        module, name = path.rsplit(".", 1)
        try:
            found.add(id(getattr(import_module(module), name)))
        except (ImportError, AttributeError):
            return False
    return len(found) == 1


#: A class path as a value: its class's name is what a label writes.
_CLASS_PATH = re.compile(r"(?:[A-Za-z_]\w*\.)+([A-Z]\w*)")


def _short_key(key: str) -> str:
    """A flat-config key as a row's label writes it: without ``model.init_args.`` (the
    method's own arguments), the other ``init_args`` parts and a last ``.class_path``
    (``model.init_args.network.backbone`` -> ``network.backbone``)."""
    return (
        key.removeprefix("model.init_args.").replace(".init_args.", ".").removesuffix(".class_path")
    )


def short_value(value: str) -> str:
    """A value (its ``repr``) as a row's label writes it: a class path as its class's name,
    a string without quotes."""
    try:
        plain = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
    if isinstance(plain, str):
        match = _CLASS_PATH.fullmatch(plain)
        return match.group(1) if match else plain
    return str(plain)


@dataclass(frozen=True)
class ConfigGroup:
    """Where a run's row is: its setting, and its values of the keys that split the setting.

    Attributes:
        label: the row's setting as tables write it: the setting, then the run's values of
            the keys that split it, shortly (``iid [data.dataset=folder,
            network.backbone=resnet18]``); the setting alone where its runs agree.
        values: (key, the ``repr`` of the run's value) for each key that splits its setting
            and that the run has, or that the runs of its method that have it agree on.
    """

    label: str
    values: tuple[tuple[str, str], ...]


def _splitting_values(runs: Sequence[RunRecord]) -> dict[int, tuple[tuple[str, str], ...]]:
    """id(run) -> its (key, ``repr`` of value) pairs for the keys that split the setting of
    ``runs`` (one setting's runs): those in which the runs of some method differ. A run that
    lacks such a key takes the value its method's runs that have it agree on, if they do."""
    by_method: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_method.setdefault(run.method, []).append(run)
    keys = sorted({key for group in by_method.values() for key in setting_differences(group)})
    values: dict[int, tuple[tuple[str, str], ...]] = {}
    for group in by_method.values():
        agreed = {}
        for key in keys:
            seen = {repr(run.config[key]) for run in group if key in run.config}
            if len(seen) == 1:
                agreed[key] = seen.pop()
        for run in group:
            values[id(run)] = tuple(
                (key, repr(run.config[key]) if key in run.config else agreed[key])
                for key in keys
                if key in run.config or key in agreed
            )
    return values


def _label(setting: str, pairs: Sequence[tuple[str, str]], short: Mapping[str, str] | None) -> str:
    """A row's setting as tables write it: ``setting [key=value, ...]``, the keys as
    ``short`` names them and the values shortly (:func:`short_value`), or with ``short``
    None the full keys and values; the setting alone without pairs."""
    if not pairs:
        return setting
    shown = [
        f"{key}={value}" if short is None else f"{short[key]}={short_value(value)}"
        for key, value in pairs
    ]
    return f"{setting} [{', '.join(shown)}]"


def config_groups(runs: Sequence[RunRecord]) -> list[ConfigGroup]:
    """Each run's ConfigGroup, in the order of ``runs``: the runs of one (setting, method)
    whose flat configs differ in more than the seed (:func:`setting_differences`) are not
    seeds of one row. The keys that split a setting are those in which the runs of some
    method of it differ; every run of the setting is labelled by its values of them, so that
    the rows of one data set or network share a table. A run that lacks such a key takes
    the value the other runs of its method agree on, if they do.

    A label writes keys without ``model.init_args.`` (:func:`_short_key`), class paths as
    their class's name and strings without quotes, or, where that would make two rows of a
    method one, the full keys and values (``repr``)."""
    by_setting: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run)
    out: dict[int, ConfigGroup] = {}
    for setting, setting_runs in by_setting.items():
        values = _splitting_values(setting_runs)
        keys = {key for pairs in values.values() for key, _ in pairs}
        short = {key: _short_key(key) for key in keys}
        rows: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        for run in setting_runs:
            rows.setdefault(run.method, set()).add(values[id(run)])
        # the short form, unless two keys or two rows of a method would read as one
        full = len(set(short.values())) < len(keys) or any(
            len({_label(setting, pairs, short) for pairs in method_rows}) < len(method_rows)
            for method_rows in rows.values()
        )
        for run in setting_runs:
            pairs = values[id(run)]
            out[id(run)] = ConfigGroup(_label(setting, pairs, None if full else short), pairs)
    return [out[id(run)] for run in runs]


def split_settings(runs: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs, each with its row's label (:func:`config_groups`) as its setting: what the
    plots group by, as the tables do."""
    return [
        replace(run, setting=group.label)
        for run, group in zip(runs, config_groups(runs), strict=True)
    ]


def values_agree(row: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """Whether two runs' splitting values agree on every key both have."""
    return all(other[key] == value for key, value in row.items() if key in other)
