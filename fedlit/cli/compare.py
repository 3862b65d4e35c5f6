"""``fedlit compare``: recipes x settings x seeds, then a report (:mod:`fedlit.comparison`)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jsonargparse import ActionConfigFile, DefaultHelpFormatter

from fedlit.cli.common import CONFIG_MODE, config_file_error
from fedlit.refusals import (
    OneLineParser,
)

if TYPE_CHECKING:
    import numpy as np

    from fedlit.cli.fit import FedlitCLI

#: A reST role (``:func:`~a.b.c` ``) or a double-backtick literal in a docstring.
_ROLE = re.compile(r":[\w:]+:`~?([^`<]*?)(?: <[^`]*>)?`|``([^`]*)``")


def plain(text: str) -> str:
    """``text`` (a docstring) without its reST markup, as a terminal shows it: a role's target
    (its last part where ``~`` shortens it), a literal's text."""

    def shown(m: re.Match[str]) -> str:
        if m.group(2) is not None:
            return m.group(2)
        whole = m.group(0)
        return m.group(1).rsplit(".", 1)[-1] if ":`~" in whole else m.group(1)

    return _ROLE.sub(shown, text)


class PlainHelp(DefaultHelpFormatter):
    """jsonargparse's help, its texts (docstrings) without reST markup."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: Any) -> str:
        return plain(super()._expand_help(action))

    def start_section(self, heading: str | None) -> None:
        super().start_section(plain(heading) if heading else heading)


#: The groups of a comparison spec given as a mapping.
COMPARE_GROUPS = (
    "settings", "recipe_overrides", "published", "wandb", "tune", "tune.spaces", "ray",
)  # fmt: skip


def compare_main(argv: Sequence[str]) -> None:
    """``fedlit compare --config comparison.yaml [--seeds [0,1] ...]``. Its help and its
    refusals of the spec import neither torch nor Lightning: those come with the runs."""
    from fedlit.comparison.spec import Comparison

    parser = OneLineParser(
        prog="fedlit compare",
        description=Comparison.__doc__,
        parser_mode=CONFIG_MODE,
        formatter_class=PlainHelp,
    )
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_class_arguments(Comparison)
    parser.add_argument(
        "--rerun_changed",
        type=bool,
        default=False,
        help="run afresh each run written already with other settings than the spec now "
        "gives it (the old run set aside in <run>.changed<n>, never deleted); without it, "
        "such a run is refused by name",
    )
    parser.add_argument(
        "--save_records",
        type=str | None,
        default=None,
        help="copy each finished run's record (the files its report reads, without its "
        "checkpoint; a source run's with its own while a run from it is still to run) into "
        "this folder, outside out, then stop, running nothing: a folder to commit, or to "
        "carry to another machine",
    )
    parser.add_argument(
        "--restore_records",
        type=str | None,
        default=None,
        help="first copy into out the records in this folder (--save_records) of the runs "
        "out does not hold, then go on: their runs count as finished",
    )
    error = config_file_error(argv, COMPARE_GROUPS)
    if error:
        parser.error(error)
    cfg = parser.parse_args(list(argv))
    cfg.pop("config")
    rerun_changed = bool(cfg.pop("rerun_changed"))
    save, restore = cfg.pop("save_records"), cfg.pop("restore_records")
    try:
        comparison = Comparison(**vars(parser.instantiate_classes(cfg)))
        if save is not None and restore is not None:
            raise ValueError("--save_records and --restore_records: give one of them")
        if save is not None or restore is not None:
            from fedlit.comparison.records import restore_records, save_records

            if save is not None:
                save_records(comparison, save)
                return
            restore_records(comparison, restore)
    except ValueError as err:
        parser.error(str(err))
    from fedlit.cli import main  # each run is ``fedlit fit``, in this process
    from fedlit.comparison.runner import Refused, run_comparison
    from fedlit.resolver import resolve

    resolved: dict[tuple[str, ...], FedlitCLI] = {}

    def resolved_once(args: Sequence[str]) -> FedlitCLI:
        if tuple(args) not in resolved:
            resolved[tuple(args)] = resolve(args)
        return resolved[tuple(args)]

    def rounds(args: Sequence[str]) -> int:
        return int(resolved_once(args).config["federation"]["rounds"])

    def settings(args: Sequence[str]) -> dict[str, Any]:
        return resolved_once(args).flat_config()  # as the run records them

    def partition(args: Sequence[str], seed: int) -> np.ndarray:
        data = resolve(args).datamodule
        data.setup_federation(seed)
        return data.class_counts

    command = shlex.join(["fedlit", "compare", *argv])
    try:
        written = run_comparison(
            comparison, command, main, rounds, partition,
            settings=settings, rerun_changed=rerun_changed,
        )  # fmt: skip
    except Refused as err:  # a run directory a live fit is writing
        parser.error(str(err))
    print(json.dumps({k: str(v) for k, v in written.items()}))
