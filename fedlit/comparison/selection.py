"""How much a study's choice owes to its validation set's noise: the chosen trial and the
runner-up, each final model scored example by example on the validation split once
(:func:`val_correct`), then re-scored on resampled validation sets (:func:`flip_rate`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def val_correct(args: Sequence[str], run_dir: Path, seed: int) -> np.ndarray:
    """Which validation images the final network of the run in ``run_dir`` (made by
    ``fedlit fit args``) classifies right: a (n_val,) bool array, in the split's order. The
    network is scored as every round scores it (BatchNorm statistics re-estimated on the
    server's clean images, the evaluation's seed), so its mean is the run's last ``val/acc``."""
    import torch

    from fedlit.evaluation import scored
    from fedlit.federation import load_checkpoint
    from fedlit.federation.checks import loading_data
    from fedlit.federation.seeding import EVAL, derive_seed, seed_all
    from fedlit.resolver import resolve
    from fedlit.run_layout import CHECKPOINT

    kept = [a for a in args if not a.startswith("--trainer.logger")]
    cli = resolve(kept)
    model, data = cli.model, cli.datamodule
    model.load_state_dict(load_checkpoint(run_dir / CHECKPOINT)["method_state"])
    with loading_data(data):
        data.setup_federation(seed)
    seed_all(derive_seed(seed, 0, EVAL))
    device = cli.trainer.device() if hasattr(cli.trainer, "device") else torch.device("cpu")
    network = scored(model.eval_network(), data, device).to(device).eval()  # loaded on the CPU
    right = []
    with torch.no_grad():
        for x, y in data.val_dataloader():
            right.append((network(x.to(device)).argmax(dim=-1).cpu() == y).numpy())
    return np.concatenate(right) if right else np.zeros(0, dtype=bool)


def flip_rate(
    chosen: Sequence[np.ndarray], runner_up: Sequence[np.ndarray], draws: int = 2000, seed: int = 0
) -> float:
    """How often the runner-up would have been chosen: the share of ``draws`` bootstrap
    resamples of the validation images (each tuning seed's split resampled on its own, the
    same images for both trials) on which the runner-up scores higher than the chosen trial,
    a tie counting half (a coin toss). ``chosen`` and ``runner_up``: per tuning seed, the
    (n_val,) correctness of each."""
    rng = np.random.default_rng(seed)
    flips = 0.0
    for _ in range(draws):
        a = b = 0.0
        for mine, other in zip(chosen, runner_up, strict=True):
            pick = rng.integers(0, len(mine), len(mine))
            a += mine[pick].mean()
            b += other[pick].mean()
        flips += 1.0 if b > a else 0.5 if b == a else 0.0
    return flips / draws


def accuracy_se(p: float, n: int) -> float:
    """The standard error of an accuracy ``p`` measured on ``n`` images, sqrt(p(1-p)/n)."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def recorded_scores(run_dir: Path, last_k: int) -> np.ndarray | None:
    """Image by image, the score a study chooses on: each validation image's correctness
    averaged over the last ``last_k`` rounds the run recorded
    (:data:`~fedlit.run_layout.VAL_CORRECT_FILE`, a ``federation.val_only`` run's; a round
    recorded twice, by a resume, counts its later line). Its mean is the mean of those
    rounds' ``val/acc``. None where the run did not record each of those rounds (a trial of
    an earlier fedlit)."""
    import json

    from fedlit.reporting import load_run
    from fedlit.run_layout import METRICS_FILE, VAL_ACC, VAL_CORRECT_FILE

    path = run_dir / VAL_CORRECT_FILE
    if not path.is_file():
        return None
    rounds: dict[int, str] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rounds[int(row["round"])] = str(row["correct"])
    if not rounds:
        return None
    logged = sorted(rounds)
    if (run_dir / METRICS_FILE).is_file():  # the rounds its score averages, each recorded
        logged = [int(r) for r in load_run(run_dir).series(VAL_ACC)[0]]
    wanted = logged[-last_k:]
    if not wanted or any(r not in rounds for r in wanted):
        return None  # a trial of an earlier fedlit resumed now: part of its rounds recorded
    kept = [rounds[r] for r in wanted]
    bits = np.array([[c == "1" for c in bits] for bits in kept], dtype=np.float64)
    return bits.mean(axis=0)


def score_se(scores: Sequence[np.ndarray]) -> float:
    """The standard error of a trial's score from its images' scores (each tuning seed's,
    pooled): their sample std over sqrt(n) (for one round's 0/1 scores, about
    sqrt(p(1-p)/n))."""
    pooled = np.concatenate(scores) if scores else np.zeros(0)
    n = len(pooled)
    return float(np.std(pooled, ddof=1) / math.sqrt(n)) if n >= 2 else float("nan")


def paired_se(one: Sequence[np.ndarray], other: Sequence[np.ndarray]) -> float:
    """The standard error of the difference of two trials' scores on the same images: the
    sample std of the image-by-image differences over sqrt(n). Two networks that agree on
    most images differ with a much smaller one than either score's."""
    return score_se([a - b for a, b in zip(one, other, strict=True)])


def within_one_se(best: Sequence[np.ndarray], others: Sequence[Sequence[np.ndarray]]) -> int:
    """How many of ``others`` (each trial's images' scores, per tuning seed) score within one
    paired standard error of ``best``'s (:func:`paired_se`): the trials the validation set
    cannot tell from the chosen one."""
    mean = float(np.mean(np.concatenate(best)))
    count = 0
    for scores in others:
        gap = mean - float(np.mean(np.concatenate(scores)))
        se = paired_se(best, scores)
        count += bool(gap <= se) if math.isfinite(se) else bool(gap == 0)
    return count
