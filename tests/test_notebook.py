"""notebooks/quickstart.ipynb is kept without outputs and runs, on tiny settings, as it is."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_is_stripped_and_runs(
    fmnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    monkeypatch.setenv("FEDLIT_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("FEDLIT_DATA", str(fmnist_root))
    monkeypatch.setenv("FEDLIT_RUNS", str(tmp_path / "runs"))
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "server_sl: test/acc" in text and "fedavg_fixmatch: test/acc" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the partition and the curves
    tables = [o for o in outputs if "text/markdown" in o.get("data", {})]
    assert "FedAvgFixMatch" in tables[0]["data"]["text/markdown"]
    runs = sorted((tmp_path / "runs").glob("*/*/metrics.csv"))
    assert [p.parent.name for p in runs] == ["fedavg_fixmatch", "server_sl"]
