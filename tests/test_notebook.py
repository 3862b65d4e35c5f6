"""notebooks/quickstart.ipynb is kept without outputs and runs, on tiny settings, as it is."""

from __future__ import annotations

import subprocess
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
    monkeypatch.delenv("FEDLIT_RUNS", raising=False)  # its own default: work/runs
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "server_sl: test/acc" in text and "fedavg_fixmatch: test/acc" in text
    assert "TensorDataset: 10 classes, 1 channel, 28x28; client shards [200, 200]" in text
    assert "own data: test/acc" in text  # and a federation trains on it
    assert "my network: test/acc" in text  # a user's nn.Module instance as the backbone
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the partition and the curves
    tables = [o for o in outputs if "text/markdown" in o.get("data", {})]
    table = tables[0]["data"]["text/markdown"]
    assert "FedAvgFixMatch" in table
    # the server budgets the runs recorded (2 rounds of 1 epoch; 500 labels in batches of 64:
    # 7 steps an epoch), FedAvg-FixMatch's server step and fine-tune flagged against Server-SL
    assert "| FedAvgFixMatch | 4 (4 x 1) | 28 | - |" in table, table
    assert "| ServerSL | 2 (2 x 1) | 14 | - |" in table, table
    assert "server budget: 4 epochs vs 2 epochs" in table, table
    runs = sorted((tmp_path / "work" / "runs").glob("*/*/metrics.csv"))
    assert [p.parent.name for p in runs] == [
        "fedavg_fixmatch",
        "my_network",
        "own_data",
        "server_sl",
    ]
    # nothing stray: no bare value of a cell's last line, no widget warnings
    results = [o for o in outputs if o.output_type == "execute_result"]
    assert [o["data"].get("text/plain") for o in results] == []
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "Warning" not in stderr and "IProgress" not in stderr, stderr
    # the training cell shows its progress: each run's bar, to its last round
    (training,) = [c for c in code if "federation.run()" in c.source]
    bars = "".join(o.get("text", "") for o in training.outputs if o.get("name") == "stderr")
    assert bars.count("round 2/2: evaluation") >= 2, bars


def test_the_notebook_writes_under_an_ignored_folder() -> None:
    """Run from notebooks/ (as Jupyter does), it writes work/data and work/runs: ignored."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    setup = nb.cells[1].source
    assert '"work/data"' in setup and '"work/runs"' in setup
    root = NOTEBOOK.parents[1]
    paths = ["notebooks/work/data/FashionMNIST/raw/x", "notebooks/work/runs/t/a/metrics.csv"]
    done = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True)
    assert done.stdout.split() == paths, done.stderr
