"""Runs for tests/test_executors.py, in a process of their own (Ray changes a process's signal
handlers and environment): each federation in this process, then on Ray, both at one torch
thread; prints what differs as JSON. usage: ray_runs.py local|cluster DATA_ROOT OUT_DIR

``ray_runs.py serve``: the same two-node cluster (:func:`two_node_cluster`) for other
processes (tests/test_compare_ray.py): prints ``ADDRESS <address>``, then holds it until its
standard input closes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from fedlit.data import FederatedDataModule
from fedlit.federation import Federation, FederationConfig, RayPool, RaySettings
from fedlit.methods import FedAvgFixMatch, FederatedMethod, FedSEAL, SemiFL
from fedlit.models import Architecture
from fedlit.objectives import Optimization


def federation(
    root: str, run_dir: Path, cls: type[FederatedMethod], executor: str, ray: RaySettings
) -> Federation:
    data = FederatedDataModule(
        root=root,
        num_clients=4,
        examples_per_client=64,
        client_batch_size=32,
        labeled_per_class=5,
        val_per_class=2,
        test_subset=200,
    )
    kw = {"bootstrap_epochs": 1} if cls is FedSEAL else {}
    method = cls(Architecture(10, 1), optim=Optimization(client_lr=0.03), **kw)
    cfg = FederationConfig(rounds=2, clients_per_round=3, executor=executor, ray=ray)
    return Federation(method, data, cfg, run_dir=run_dir, seed=0, progress=False)


def differences(a: Federation, b: Federation) -> list[str]:
    """The state keys, client states and test accuracies in which two runs differ."""
    sa, sb = a.method.state_dict(), b.method.state_dict()
    out = [k for k in sa if k not in sb or not torch.equal(sa[k], sb[k])]
    if [h["test/acc"] for h in a.history] != [h["test/acc"] for h in b.history]:
        out.append("test/acc")
    if a.store.client_ids() != b.store.client_ids():
        out.append("client ids")
    for cid in a.store.client_ids():
        try:
            torch.testing.assert_close(a.store.get(cid), b.store.get(cid), rtol=0, atol=0)
        except AssertionError:
            out.append(f"client {cid}")
    return out


def compare(
    root: str,
    out: Path,
    name: str,
    local_cls: type[FederatedMethod],
    ray_cls: type[FederatedMethod],
    ray: RaySettings,
) -> dict[str, object]:
    local = federation(root, out / f"{name}_local", local_cls, "local", ray)
    local.run()
    remote = federation(root, out / f"{name}_ray", ray_cls, "ray", ray)
    remote.prepare()
    executor = remote.executor
    assert isinstance(executor, RayPool)
    nodes = len({node for node, _ in executor.where()})
    workers = len(executor.actors)
    remote.run()
    faults = sum(h.get("fault/clients", 0.0) for h in remote.history)
    return {
        "different": differences(local, remote),
        "nodes": nodes,
        "workers": workers,
        "faults": faults,
    }


@contextmanager
def two_node_cluster() -> Iterator[str]:
    """A Ray head and a worker node on this machine (each its own raylet processes), one CPU
    each; their address. Stopped after."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        yield cluster.address
    finally:
        cluster.shutdown()


def main() -> None:
    if sys.argv[1] == "serve":
        with two_node_cluster() as address:
            print(f"ADDRESS {address}", flush=True)
            sys.stdin.read()
        return
    mode, root, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    assert torch.get_num_threads() == 1, "run with OMP_NUM_THREADS=1"
    import ray

    results: dict[str, object] = {}
    if mode == "local":
        # its own instance: never a cluster another test started on this machine meanwhile
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        settings = RaySettings(workers=2)
        results["FedAvgFixMatch"] = compare(
            root, out, "fixmatch", FedAvgFixMatch, FedAvgFixMatch, settings
        )
        results["FedSEAL"] = compare(root, out, "fedseal", FedSEAL, FedSEAL, settings)
        results["SemiFL"] = compare(root, out, "semifl", SemiFL, SemiFL, settings)
        from dying_methods import DiesOnce  # importable by the workers: PYTHONPATH

        results["DiesOnce"] = compare(root, out, "dies", FedAvgFixMatch, DiesOnce, settings)
        results["died"] = Path(os.environ["FEDLIT_TEST_DIE_ONCE"]).is_file()
        ray.shutdown()
    else:  # a head and a worker node on this machine, one CPU each
        with two_node_cluster() as address:
            try:
                settings = RaySettings(address=address)
                results["cluster"] = compare(
                    root, out, "cluster", FedAvgFixMatch, FedAvgFixMatch, settings
                )
            finally:
                ray.shutdown()
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
