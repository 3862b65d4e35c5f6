"""The comparison's bounds on a small protocol trained to convergence, on real Fashion-MNIST.

Server-SL (the server's labels alone) is the lower bound every method is measured against;
FedAvg-SL (the clients train on their true labels) is the upper bound. If the protocol cannot
show FedAvg-SL above Server-SL, or Server-SL's seeds disagree by more than the differences a
comparison reports, the comparison cannot tell methods apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig
from fedlit.methods import FedAvgSL, FederatedMethod, ServerSL
from fedlit.models import Architecture

#: Server-SL's two seeds (two draws of 100 labels) must agree within this many points
#: (measured at one torch thread: 64.3 and 67.7).
SEED_TOLERANCE = 5.0
#: The oracle's margin over the better Server-SL seed, in points (measured: 79.8, +12.1).
ORACLE_MARGIN = 5.0
BACKBONE = "fedcon_mnist_cnn"


def _accuracy(
    root: Path, run_dir: Path, method: FederatedMethod, seed: int, **config: int
) -> float:
    """Final test accuracy (points) of ``method`` on 5 clients x 600 images, 100 labels, paper
    001's MNIST CNN (Table I: 21,840 parameters, seconds a run on a CPU), the full test set."""
    data = FederatedDataModule(
        root=str(root),
        num_clients=5,
        examples_per_client=600,
        labeled_per_class=10,
        val_per_class=0,
        batch_size=50,  # the 100 labels in 2 full batches (a partial batch is dropped)
    )
    cfg = FederationConfig(clients_per_round=5, **config)  # type: ignore[arg-type]
    fed = Federation(method, data, cfg, run_dir=run_dir, seed=seed, progress=False)
    return 100 * fed.run().final["test/acc"]


@pytest.mark.slow
def test_the_oracle_beats_server_sl_whose_seeds_agree(fmnist_root: Path, tmp_path: Path) -> None:
    lower = [
        _accuracy(
            fmnist_root,
            tmp_path / f"server_sl{seed}",
            ServerSL(Architecture(10, 1, backbone=BACKBONE)),
            seed,
            rounds=5,
            server_epochs=20,
        )
        for seed in (0, 1)
    ]
    assert abs(lower[0] - lower[1]) <= SEED_TOLERANCE, lower
    assert min(lower) > 60, lower  # converged: far above chance (10) and an early stop
    oracle = _accuracy(
        fmnist_root,
        tmp_path / "fedavg_sl",
        FedAvgSL(Architecture(10, 1, backbone=BACKBONE)),
        0,
        rounds=10,
        server_epochs=1,
        local_epochs=5,
    )
    assert oracle >= max(lower) + ORACLE_MARGIN, (oracle, lower)
