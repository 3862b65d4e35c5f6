"""The benchmarks are run by hand, not by the suite: each one's imports from fedlit still name
what fedlit has (a name moved by a refactor breaks a benchmark no test runs)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).parents[1] / "benchmarks").glob("*.py"))


def fedlit_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each ``from fedlit... import name`` in ``path``, and (module, "")
    of each ``import fedlit...``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "fedlit":
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "fedlit"]
    return found


def test_the_check_reads_every_fedlit_import(tmp_path: Path) -> None:
    path = tmp_path / "sample.py"
    path.write_text("from fedlit.cli.fit import federation_of, resolve\nimport fedlit.data\n")
    assert fedlit_imports(path) == [
        ("fedlit.cli.fit", "federation_of"), ("fedlit.cli.fit", "resolve"), ("fedlit.data", "")
    ]


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_a_benchmark_imports_only_what_fedlit_has(path: Path) -> None:
    for module, name in fedlit_imports(path):
        imported = importlib.import_module(module)
        if name and not hasattr(imported, name):
            importlib.import_module(f"{module}.{name}")  # a submodule, or the error names it
