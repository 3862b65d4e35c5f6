"""Why a warm-started FixMatch falls: BatchNorm's statistics, or the weights?

For each run directory given (a ``fedlit fit`` run, e.g. of
``recipes/comparisons/fmnist_warm.yaml``), its scored network (the checkpoint's, as
``federation.init_from`` reads it) is measured on the run's own data (its config: partition,
labeled set and test set):

- ``test_acc``: the full test set, as saved;
- ``test_acc_bn_weak`` / ``test_acc_bn_strong``: after BatchNorm's running statistics are
  re-estimated (:func:`fedlit.evaluation.batchnorm.recalibrated`, as the scored network's are
  on the server's images) from weak views, or from strong views, of the clients' images. A
  network whose accuracy comes back with weak-view statistics lost it to its statistics, not
  to its weights;
- ``confident``, ``confident_acc``, ``pseudo_acc``: the network's pseudo-labels on weak views of
  the clients' images, in eval mode: the fraction at or above ``--tau`` and the accuracy of
  those against the labels the simulation keeps aside, and the accuracy of all of them;
- ``confident_classes``: how many of the confident pseudo-labels fall in each class.

    OMP_NUM_THREADS=1 python benchmarks/fixmatch_fall.py --tau 0.9 \
        runs/compare/fmnist_warm/iid/plateau/seed0 \
        runs/compare/fmnist_warm/iid/fedavg_fixmatch/seed0 ...

Prints one JSON object a run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor, nn

from fedlit.resolver import resolve
from fedlit.data.loaders import ImageBatches
from fedlit.evaluation.batchnorm import recalibrated
from fedlit.federation.warmstart import load_warm_start, template_network


@torch.no_grad()
def accuracy(net: nn.Module, batches: Iterable[tuple[Tensor, ...]]) -> float:
    net.eval()
    right = total = 0
    for x, y in batches:
        right += int((net(x).argmax(1) == y).sum())
        total += len(y)
    return right / total


def measure(run: Path, tau: float) -> dict[str, object]:
    cli = resolve(["--config", str(run / "config.yaml"), "--trainer.default_root_dir", "/tmp/x"])
    data, method = cli.datamodule, cli.model
    data.setup_federation(int(cli.config["seed_everything"]))
    state = load_warm_start(run, method).network
    net = template_network(method)
    net.load_state_dict(state)
    clients = [data.client_data(k) for k in range(data.num_clients)]
    images = torch.cat([c.shard.images for c in clients])
    labels = torch.cat([c.hidden_labels for c in clients])
    result: dict[str, object] = {"run": str(run), "test_acc": accuracy(net, data.test_dataloader())}

    net.eval()
    probs = []
    with torch.no_grad():
        for x, _ in ImageBatches(images, data.spec, ("weak",), 256, False, labels=labels):
            probs.append(net(x).softmax(1))
    p = torch.cat(probs)
    conf, pred = p.max(1)
    mask = conf >= tau
    result["confident"] = float(mask.float().mean())
    right = (pred[mask] == labels[mask]).float()
    result["confident_acc"] = float(right.mean()) if len(right) else None
    result["pseudo_acc"] = float((pred == labels).float().mean())
    result["confident_classes"] = torch.bincount(pred[mask], minlength=data.num_classes).tolist()

    for view in ("weak", "strong"):
        again = recalibrated(net, ImageBatches(images, data.spec, (view,), 64, False))
        result[f"test_acc_bn_{view}"] = accuracy(again, data.test_dataloader())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--tau", type=float, default=0.95)
    args = parser.parse_args()
    torch.manual_seed(0)  # the views' randomness
    for run in args.runs:
        print(json.dumps(measure(run, args.tau)), flush=True)


if __name__ == "__main__":
    main()
