"""Finished (or running) run directories of ``fedlit fit``, read back as RunRecords.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.csv`` (one row per
logged round; round 0 is the partition summary) and, when the comparison command made it,
``run.json`` naming its method, setting and seed (the federation driver writes the method,
seed and rounds there too, and the server's budget, so runs made through the Python API,
without config.yaml, read back).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedlit.run_layout import (
    BUDGET_KEY,
    CONFIG_FILE,
    HPARAMS_FILE,
    METRICS_FILE,
    RUN_FILE,
    current_keys,
    flat_config,
)

DEFAULT_SETTING = "default"


@dataclass(frozen=True)
class RunRecord:
    """One run read back from disk: who it is (method, setting, seed) and what it logged.

    Attributes:
        run_dir: the run directory as it was given.
        method: method name (run.json, else the last dotted part of ``model.class_path``).
        setting: the comparison's setting (run.json, else ``"default"``).
        seed: the run's seed (run.json, else ``seed_everything``).
        rounds: the configured number of rounds (``federation.rounds``).
        history: the rows with round >= 1, one per round (the last occurrence wins, as a
            resumed run appends), sorted by round; every value a float, including ``round``;
            a metric not logged that round is an absent key.
        summary: the round-0 row (partition summary, bootstrap accuracy, ...).
        marks: what tables write beside the method (run.json ``marks``: ``oracle``).
        config: the run's flat config, dotted keys (``hparams.yaml``, else ``config.yaml``
            flattened; empty for a run without either, or one made through the Python API by
            an earlier fedlit, whose ``hparams.yaml`` is ``{}``).
        init_from: a warm-started run's source (run.json ``init_from``: ``path``,
            ``sha256`` of its weights, ``method``, ``round``, ``test_acc``); empty otherwise.
        budget: the server's training budget the run recorded (run.json
            :data:`~fedlit.run_layout.BUDGET_KEY`); empty for a run written before runs
            recorded it.
    """

    run_dir: Path
    method: str
    setting: str
    seed: int
    rounds: int
    history: list[dict[str, float]]
    summary: dict[str, float]
    marks: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict, compare=False)
    init_from: dict[str, Any] = field(default_factory=dict, compare=False)
    budget: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def finished(self) -> bool:
        """Whether the last logged round is the configured last round."""
        return bool(self.history) and int(self.history[-1]["round"]) == self.rounds

    @property
    def last_round(self) -> int:
        """The last logged round (0 when no round was logged yet)."""
        return int(self.history[-1]["round"]) if self.history else 0

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds (n,) int64, values (n,) float64) of the rounds where ``key`` was logged."""
        rows = [row for row in self.history if key in row]
        rounds = np.array([int(row["round"]) for row in rows], dtype=np.int64)
        values = np.array([row[key] for row in rows], dtype=np.float64)
        return rounds, values


def _read_mapping(
    path: Path, parse: Callable[[str], Any], bad: type[Exception], kind: str, mapping: str
) -> dict[str, Any]:
    """``path``'s text parsed by ``parse`` (which raises ``bad`` on a bad ``kind`` file), a
    ``mapping``; ValueError naming the path if unreadable or not a mapping."""
    try:
        data = parse(path.read_text())
    except (OSError, bad) as err:
        raise ValueError(f"{path}: unreadable {kind} ({err})") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {mapping}, got {type(data).__name__}")
    return data


def _read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; ValueError naming the path if missing or not a mapping."""
    if not path.is_file():
        raise ValueError(f"{path}: not found (a run directory needs {CONFIG_FILE})")
    return _read_mapping(path, yaml.safe_load, yaml.YAMLError, "YAML", "a mapping at the top")


def read_run_json(path: Path) -> dict[str, Any]:
    """run.json's mapping, or {} when the file is absent; ValueError naming the path if bad."""
    if not path.is_file():
        return {}
    return _read_mapping(path, json.loads, json.JSONDecodeError, "JSON", "a JSON object")


def recorded_config(run_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The run's flat config: ``hparams.yaml`` (what its loggers received), else ``config``
    flattened; moved settings under their keys now (:func:`~fedlit.run_layout.current_keys`)."""
    path = run_dir / HPARAMS_FILE
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"{path}: unreadable YAML ({err})") from err
        if isinstance(data, dict):
            return current_keys({str(k): v for k, v in data.items()})
    return current_keys(flat_config(config))


def _parse_row(path: Path, line: int, row: dict[str | None, Any]) -> dict[str, float]:
    """One metrics.csv row as floats, empty cells dropped; ValueError naming path/line/column."""
    if None in row:  # more cells than header columns
        raise ValueError(f"{path}, line {line}: more cells than header columns")
    parsed: dict[str, float] = {}
    for key, cell in row.items():
        if cell is None or cell.strip() == "":
            continue
        try:
            parsed[str(key)] = float(cell)
        except ValueError as err:
            raise ValueError(
                f"{path}, line {line}: column {key!r} holds non-numeric value {cell!r}"
            ) from err
    return parsed


def _read_metrics(path: Path) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(round-0 row, rows of rounds >= 1 sorted by round) of a metrics.csv, last occurrence
    of each round kept. A row without ``round`` falls back to Lightning's ``step``."""
    if not path.is_file():
        raise ValueError(f"{path}: not found (a run directory needs {METRICS_FILE})")
    by_round: dict[int, dict[str, float]] = {}
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames:
                raise ValueError(f"{path}: empty file, no header row")
            for row in reader:
                parsed = _parse_row(path, reader.line_num, row)
                if not parsed:
                    continue
                value = parsed.get("round", parsed.get("step"))
                if value is None:
                    raise ValueError(f"{path}, line {reader.line_num}: no 'round' or 'step'")
                if value != int(value) or value < 0:
                    raise ValueError(
                        f"{path}, line {reader.line_num}: round {value} is not a whole number >= 0"
                    )
                parsed["round"] = float(value)
                by_round[int(value)] = parsed
    except (OSError, csv.Error, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: unreadable CSV ({err})") from err
    summary = by_round.pop(0, {})
    return summary, [by_round[r] for r in sorted(by_round)]


def load_run(run_dir: str | Path) -> RunRecord:
    """Read one run directory into a RunRecord.

    Raises ValueError naming the offending path if config.yaml or metrics.csv is missing or
    unreadable, run.json is malformed, or a needed config key is missing.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / CONFIG_FILE
    meta = read_run_json(run_dir / RUN_FILE)
    # Runs made through the Python API have no config.yaml; their run.json says enough.
    api_run = not config_path.is_file() and {"method", "seed", "rounds"} <= set(meta)
    config = {} if api_run else _read_yaml(config_path)

    federation = config.get("federation")
    rounds = meta.get("rounds")
    if rounds is None:
        rounds = federation.get("rounds") if isinstance(federation, dict) else None
    if not isinstance(rounds, int) or isinstance(rounds, bool):
        raise ValueError(f"{config_path}: federation.rounds must be an int, got {rounds!r}")

    method = meta.get("method")
    if method is None:
        model = config.get("model")
        class_path = model.get("class_path") if isinstance(model, dict) else None
        if not isinstance(class_path, str) or not class_path:
            raise ValueError(
                f"{config_path}: model.class_path missing (and no method in {RUN_FILE})"
            )
        method = class_path.rsplit(".", 1)[-1]

    seed = meta.get("seed", config.get("seed_everything"))
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(
            f"{run_dir}: seed must be an int ({RUN_FILE} 'seed' or {CONFIG_FILE} "
            f"seed_everything), got {seed!r}"
        )

    summary, history = _read_metrics(run_dir / METRICS_FILE)
    return RunRecord(
        run_dir=run_dir,
        method=str(method),
        setting=str(meta.get("setting", DEFAULT_SETTING)),
        seed=seed,
        rounds=rounds,
        history=history,
        summary=summary,
        marks=tuple(str(m) for m in meta.get("marks", ())),
        config=recorded_config(run_dir, config),
        init_from=dict(meta.get("init_from") or {}),
        budget=dict(meta.get(BUDGET_KEY) or {}),
    )


def _run_dirs(path: Path) -> list[Path]:
    """``path`` itself if it holds metrics.csv, else every folder below it that does."""
    if not path.exists():
        raise ValueError(f"{path}: no such run directory or folder")
    if path.is_file():
        if path.name == METRICS_FILE:
            return [path.parent]
        raise ValueError(f"{path}: a file; expected a run directory or a folder of runs")
    if (path / METRICS_FILE).is_file():
        return [path]
    return sorted(p.parent for p in path.rglob(METRICS_FILE) if p.is_file())


def find_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """Every run under ``paths``, sorted by (setting, method, seed, run_dir).

    Each path is a run directory (holds metrics.csv) or a folder searched recursively for run
    directories; a run reached twice is read once. Raises ValueError if a path does not exist
    or nothing is found.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    seen: set[Path] = set()
    runs: list[RunRecord] = []
    for path in paths:
        for run_dir in _run_dirs(Path(path)):
            key = run_dir.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(load_run(run_dir))
    if not runs:
        shown = ", ".join(str(p) for p in paths) or "(no paths)"
        raise ValueError(f"no run directories (holding {METRICS_FILE}) found under {shown}")
    return sorted(runs, key=lambda r: (r.setting, r.method, r.seed, str(r.run_dir)))
