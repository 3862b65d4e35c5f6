"""What every ``fedlit`` command shares: how config files are read (YAML, a key given
twice refused, a group that is not a mapping refused) and results printed as JSON. It imports
neither torch nor Lightning."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

from fedlit.cli.paths import config_paths
from fedlit.refusals import (
    DuplicateKey,
    refuse_duplicate_keys,
)

#: The parser mode of fedlit's parsers: YAML, with a config's ``trainer`` group read tolerantly
#: (:func:`~fedlit.cli.trainer_group.without_lightning_defaults`).
CONFIG_MODE = "fedlit_yaml"


def load_config(text: str) -> Any:
    """jsonargparse's YAML loader, refusing a key given twice in one mapping
    (:class:`~fedlit.refusals.DuplicateKey`), a config's ``trainer`` group read tolerantly
    (:func:`~fedlit.cli.trainer_group.without_lightning_defaults`, imported only for a config
    that has one: a comparison spec's help and parsing need no Lightning)."""
    refuse_duplicate_keys(text)
    value = get_loader("yaml")(text)
    if isinstance(value, dict) and isinstance(value.get("trainer"), dict):
        from fedlit.cli.trainer_group import without_lightning_defaults

        value["trainer"] = without_lightning_defaults(value["trainer"])
    return value


set_loader(CONFIG_MODE, load_config, exceptions=(yaml.YAMLError, ValueError))


def json_line(values: dict[str, Any]) -> str:
    """``values`` as one line of strict JSON: a NaN or infinite number (a diagnostic such as
    ``diag/weight_diversity`` that could not be computed) is written as ``null``."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(values), allow_nan=False)


#: The groups of ``fit``'s settings a config gives as a mapping (``model`` may also be a
#: class name, which its parser checks).
FIT_GROUPS = ("trainer", "data", "federation", "federation.pool", "federation.ray")


def config_file_error(argv: Sequence[str], groups: Sequence[str] = FIT_GROUPS) -> str | None:
    """What is wrong with a config file named in ``argv`` (a YAML error with its file and line,
    a key given twice in one mapping with its lines, an empty file, a file that is not a
    mapping of settings, one of ``groups`` that is not a mapping), or None. Names that are
    not files are left to the parser."""
    for name in config_paths(argv):
        path = Path(name)
        if not path.is_file():
            continue
        try:
            text = path.read_text()
            refuse_duplicate_keys(text)
            loaded = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError) as err:
            return f"--config {path}: cannot read it: {err}"
        except DuplicateKey as err:
            return f"--config {path}, {err}; give each setting once"
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err)
            return f"--config {path}{where}: not valid YAML ({problem})"
        if loaded is None:
            return f"--config {path}: the file is empty (expected a YAML mapping of settings)"
        if not isinstance(loaded, dict):
            return (
                f"--config {path}: expected a YAML mapping of settings, "
                f"got a {type(loaded).__name__}"
            )
        for group in groups:
            error = not_a_group(group, _nested(loaded, group))
            if error:
                return f"--config {path}: {error}"
    return None


def not_a_group(key: str, value: Any) -> str | None:
    """The refusal of ``value`` given for ``key``, a group of settings, where it is not a
    mapping (None: unset), or None."""
    if value is None or isinstance(value, dict):
        return None
    kind = type(value).__name__
    return (
        f"{key}={value!r}: a group of settings is a mapping (key: value), not "
        f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    )


def _nested(config: dict[str, Any], key: str) -> Any:
    """The value of dotted ``key`` in a nested mapping (None where any part is absent)."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def closing_lines(
    history: Sequence[dict[str, float]], run_dir: Path, trains_clients: bool
) -> list[str]:
    """What ``fedlit fit`` says in words after its JSON line: the rounds run, the last
    round's test accuracy and the best validation accuracy's round, in percent; and, for a
    method that trains clients, how to run the baseline it must beat (Server-SL on the same
    labels: the same command with ``--model=fedlit.methods.ServerSL``)."""
    rounds = [row for row in history if row.get("round", 0) >= 1]
    if not rounds:
        return []
    last = rounds[-1]
    text = f"fedlit fit: {int(last['round'])} rounds in {run_dir}"
    if "test/acc" in last:
        text += f": test/acc {100 * last['test/acc']:.2f}% at the last round"
    vals = [row for row in rounds if "val/acc" in row]
    if vals:
        best = max(vals, key=lambda row: row["val/acc"])  # the first best round
        text += f", val/acc best {100 * best['val/acc']:.2f}% (round {int(best['round'])})"
    lines = [text + "."]
    if trains_clients:
        lines.append(
            "fedlit fit: the baseline to beat is Server-SL on the same labels: the same command "
            f"with --model=fedlit.methods.ServerSL --trainer.default_root_dir={run_dir}_server_sl "
            "(docs: Which method?)"
        )
    return lines
