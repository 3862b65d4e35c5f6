"""Lines for the person running fedlit, on stderr (stdout carries the results)."""

from __future__ import annotations

import sys

from tqdm import tqdm


def note(text: str) -> None:
    """A note: something the run did or is, that the user should know."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def warn(text: str) -> None:
    """A warning line (through tqdm, so that a progress bar stays intact)."""
    tqdm.write(f"warning: {text}", file=sys.stderr)


def first_line(err: BaseException) -> str:
    """An error's message, its details (one line per mismatched tensor) cut to two lines."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:2]) + (" ..." if len(lines) > 2 else "")
