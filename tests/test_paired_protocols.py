"""benchmarks/paired_protocols.py on hand-made run folders: its paired differences equal a
NumPy/SciPy computation of the same scores, and a missing or unfinished run is refused by
name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script
from scipy import stats

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "paired_protocols.py"

#: test/acc by round: comparison -> setting -> recipe folder -> one list per seed
ACC = {
    "a": {
        "iid": {
            "base": [[0.5, 0.6, 0.7], [0.4, 0.5, 0.5]],
            "m": [[0.6, 0.7, 0.8], [0.5, 0.5, 0.6]],
        },
        "noniid": {
            "base": [[0.3, 0.3, 0.3], [0.2, 0.4, 0.4]],
            "m": [[0.3, 0.5, 0.6], [0.2, 0.2, 0.3]],
        },
    },
    "b": {
        "iid": {"m": [[0.7, 0.7, 0.9], [0.6, 0.6, 0.6]]},
        "noniid": {"m": [[0.1, 0.2, 0.2], [0.3, 0.3, 0.5]]},
    },
}


def _comparisons(root: Path, rounds: int = 3) -> None:
    for name, settings in ACC.items():
        for setting, methods in settings.items():
            for method, seeds in methods.items():
                for seed, accs in enumerate(seeds):
                    run = root / name / setting / method / f"seed{seed}"
                    run.mkdir(parents=True)
                    meta = {"method": method, "seed": seed, "rounds": rounds}
                    (run / "run.json").write_text(json.dumps(meta))
                    rows = [f"{r},{a}" for r, a in enumerate(accs, start=1)]
                    (run / "metrics.csv").write_text("\n".join(["round,test/acc", *rows]) + "\n")


def _run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the script's ``main`` with ``args``."""
    script = load_script(SCRIPT)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    code = 0
    try:
        script.main()
    except SystemExit as exit_:
        code, message = 1, str(exit_.code)
        print(message, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def _expected(
    first: list[list[float]], second: list[list[float]], last_k: int, level: float = 0.95
) -> str:
    diffs = 100 * (
        np.mean(np.array(second)[:, -last_k:], 1) - np.mean(np.array(first)[:, -last_k:], 1)
    )
    half = (
        stats.t.ppf(1 - (1 - level) / 2, len(diffs) - 1)
        * np.std(diffs, ddof=1)
        / np.sqrt(len(diffs))
    )
    mean = diffs.mean()
    return f"{mean:+.2f} [{mean - half:+.3f}, {mean + half:+.3f}]; per seed " + ", ".join(
        f"{d:+.2f}" for d in diffs
    )


def test_pairs_in_one_comparison_and_across_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _comparisons(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    code, out, err = _run(capsys, monkeypatch, str(a), "--pairs", "base:m", "--last_k", "2")
    assert code == 0, err
    lines = [line for line in out.splitlines() if not line.startswith("    ")]
    for line, setting in zip(lines[1:], ("iid", "noniid"), strict=True):
        assert line.startswith(
            f"{setting}: {a / setting / 'm'} - {a / setting / 'base'} (2 seeds): "
        )
        assert line.endswith(_expected(ACC["a"][setting]["base"], ACC["a"][setting]["m"], 2))
    assert "first by round: 45.00, 55.00, 60.00; lowest round per seed: 50.0, 40.0" in out

    code, out, err = _run(capsys, monkeypatch, str(a), "--second", str(b), "--pairs", "m")
    assert code == 0, err
    for setting in ("iid", "noniid"):
        expected = _expected(ACC["a"][setting]["m"], ACC["b"][setting]["m"], 3)
        assert f"{setting}: {b / setting / 'm'} - {a / setting / 'm'} (2 seeds): {expected}" in out

    code, out, err = _run(capsys, monkeypatch, str(a), "--pairs", "m:base", "--confidence", "0.99")
    assert code == 0, err
    assert "99% t-intervals" in out.splitlines()[0]
    for setting in ("iid", "noniid"):
        expected = _expected(ACC["a"][setting]["m"], ACC["a"][setting]["base"], 3, 0.99)
        assert (
            f"{setting}: {a / setting / 'base'} - {a / setting / 'm'} (2 seeds): {expected}" in out
        )

    # one comparison's two settings, method by method (e.g. fp32 against bf16)
    code, out, err = _run(capsys, monkeypatch, str(a), "--settings", "iid:noniid", "--pairs", "m")
    assert code == 0, err
    expected = _expected(ACC["a"]["iid"]["m"], ACC["a"]["noniid"]["m"], 3)
    assert f"iid:noniid: {a / 'noniid' / 'm'} - {a / 'iid' / 'm'} (2 seeds): {expected}" in out
    assert len([line for line in out.splitlines() if not line.startswith("    ")]) == 2


@pytest.mark.parametrize("pairs, why", [("m:nothing", "nothing/seed0"), ("base:m", "unfinished")])
def test_a_missing_or_unfinished_run_is_refused_by_name(
    tmp_path: Path,
    pairs: str,
    why: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _comparisons(tmp_path)
    if why == "unfinished":
        meta = tmp_path / "a" / "iid" / "m" / "seed1" / "run.json"
        meta.write_text(json.dumps({"method": "m", "seed": 1, "rounds": 4}))
    code, _, err = _run(capsys, monkeypatch, str(tmp_path / "a"), "--pairs", pairs)
    assert code != 0 and why in err
