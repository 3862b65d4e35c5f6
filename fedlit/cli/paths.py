"""The config files a command's arguments name (every command reads them the same way)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def config_paths(argv: Sequence[str]) -> Iterator[str]:
    """The files given with ``--config``/``-c`` (``--config X`` or ``--config=X``)."""
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            yield argv[i + 1]
        elif arg.startswith("--config="):
            yield arg.split("=", 1)[1]
