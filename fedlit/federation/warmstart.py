"""A warm start (``federation.init_from``): a run that starts from the scored network of another
run, read from that run's federation checkpoint with ``torch.load(weights_only=True)``.

The source's *scored network* is the network its ``test/acc`` measured (its method's
``eval_network``: Server-SL's network, FedSup's f_Server, FedMatch's sigma + psi), as a
:class:`~fedlit.models.Classifier`'s state (``backbone.*``, ``head.*``): the source method's
class says how to take it from its checkpoint
(:meth:`~fedlit.methods.FederatedMethod.scored_state`), the run's method how it seeds its own
networks (:meth:`~fedlit.methods.FederatedMethod.warm_start`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

import fedlit.methods  # noqa: F401  (every built-in method class, for the source's lookup)
from fedlit.aggregation.payloads import StateDict
from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.federation.rundir import RunLock
from fedlit.federation.seeding import INIT, derive_seed, seed_all
from fedlit.methods.base import FederatedMethod
from fedlit.models import Architecture, Classifier
from fedlit.run_layout import CHECKPOINT, LOCK_FILE, TEST_ACC

KEY = "federation.init_from"


@dataclass(frozen=True)
class WarmStart:
    """The network a run starts from, and where it came from.

    Attributes:
        checkpoint: the source's checkpoint file (resolved).
        method: the source's method (its class name).
        round: the source's last round.
        network: the source's scored network: a Classifier's state, on the CPU.
        sha256: SHA-256 of that state (:func:`weights_sha256`).
        test_acc: the source's last logged ``test/acc`` (None where it logged none).
    """

    checkpoint: Path
    method: str
    round: int
    network: StateDict
    sha256: str
    test_acc: float | None

    def info(self) -> dict[str, Any]:
        """What ``run.json`` records under ``init_from``."""
        return {
            "path": str(self.checkpoint),
            "sha256": self.sha256,
            "method": self.method,
            "round": self.round,
            "test_acc": self.test_acc,
        }


def weights_sha256(state: StateDict) -> str:
    """SHA-256 over a state's tensors, key by key in sorted order: each key, dtype, shape and
    the tensor's bytes (C order). The same weights give the same digest whatever file holds
    them."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def source_checkpoint(init_from: str | Path) -> Path:
    """The checkpoint ``init_from`` names: the file itself, or a run directory's
    ``checkpoints/last.ckpt``; a ValueError names the key if there is none, or if a live
    process still writes that run (its lock is held: its last checkpoint would move)."""
    path = Path(init_from)
    if path.is_dir():
        lock = RunLock(path)
        try:
            lock.acquire(create=False)  # nothing written; refused if a live process holds it
        except ValueError:
            raise ValueError(
                f"{KEY}={str(init_from)!r}: that run is still being written by a live process "
                f"(it holds {path / LOCK_FILE}), so its last checkpoint changes as it runs; "
                "wait for it to end, or name one checkpoint file"
            ) from None
        finally:
            lock.release()
        ckpt = path / CHECKPOINT
        if not ckpt.is_file():
            raise ValueError(
                f"{KEY}={str(init_from)!r}: the folder holds no finished round's checkpoint "
                f"({CHECKPOINT}); give a run directory with one, or the checkpoint file"
            )
        return ckpt.resolve()
    if not path.is_file():
        raise ValueError(f"{KEY}={str(init_from)!r}: no such run directory or checkpoint file")
    return path.resolve()


def method_class(name: str) -> type[FederatedMethod] | None:
    """The method class named ``name`` among those imported (the built-in ones and any a
    recipe's ``class_path`` loaded), or None."""
    todo: list[type[FederatedMethod]] = [FederatedMethod]
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return cls
        todo += cls.__subclasses__()
    return None


def template_network(method: FederatedMethod) -> Classifier:
    """A network of ``method``'s classifier architecture (backbone + head, without an SSL
    method's heads), every setting of its network group kept (``image_size`` too: a
    backbone's feature size may depend on it), its pretrained weights not read: the keys and
    shapes a source's scored network must have. Built with the global generators' states
    restored after, so that reading a source draws nothing."""
    arch = method.architecture()  # an SSL method's adds its heads: the group's fields alone
    plain = Architecture(**{f.name: getattr(arch, f.name) for f in fields(Architecture)})
    with torch.random.fork_rng(devices=[]):
        return plain.build(pretrained=False)


def _check_fits(state: StateDict, template: Classifier, method: FederatedMethod) -> None:
    """Refuse a scored network whose keys or shapes differ from ``template``'s, naming the
    setting that differs: the number of classes, the input channels, the image size (the
    backbone's weights fit, the features its head takes do not) or the backbone."""
    expected = template.state_dict()
    missing = sorted(expected.keys() - state.keys())
    extra = sorted(state.keys() - expected.keys())
    if missing or extra:
        raise ValueError(
            f"{KEY}: the source's network is another backbone than this run's "
            f"(model.init_args.network.backbone={method.backbone_name!r}, "
            f"norm={method.network_settings.norm!r}): "
            f"{'it lacks ' + missing[0] if missing else 'it has ' + extra[0] + ' besides'}"
        )
    params = [name for name, _ in template.named_parameters()]
    head = [name for name in params if name.startswith("head.")]
    differ = [key for key, t in expected.items() if tuple(state[key].shape) != tuple(t.shape)]
    if not differ:
        return
    key = differ[0]
    got, want = tuple(state[key].shape), tuple(expected[key].shape)
    if key in head[-2:] and got[0] != want[0]:
        what = (
            f"{got[0]} classes, this run's data has {want[0]} (model.init_args.network.num_classes)"
        )
    elif key == params[0] and len(got) == len(want) >= 2 and got[1] != want[1]:
        what = (
            f"{got[1]} input channels, this run's data has {want[1]} "
            f"(model.init_args.network.in_channels)"
        )
    elif key == head[0] and len(got) == len(want) == 2 and got[1] != want[1]:
        what = (  # the backbone's weights fit, not its features: another size of images
            f"a head that takes {got[1]} features, this run's backbone gives {want[1]} at "
            f"model.init_args.network.image_size={method.network_settings.image_size}: the "
            "source's images were of another size"
        )
    else:
        what = (
            f"{key} of shape {list(got)}, this run's is {list(want)}: another backbone "
            f"or input size (model.init_args.network.backbone={method.backbone_name!r})"
        )
    raise ValueError(f"{KEY}: the source's network does not fit this run's: it has {what}")


def check_warm_start(method: FederatedMethod) -> None:
    """Raise ValueError, naming ``federation.init_from``, if ``method`` cannot start from
    another run's network (called before any work): one that holds networks besides
    ``network`` (a teacher, a target) and does not say how a warm start seeds them (its own
    :meth:`~fedlit.methods.FederatedMethod.warm_start`)."""
    others = [
        name
        for name, child in method.named_children()
        if name != "network" and any(True for _ in child.parameters())
    ]
    if others and type(method).warm_start is FederatedMethod.warm_start:
        raise ValueError(
            f"{KEY}: {type(method).__name__} holds networks besides its global network "
            f"({', '.join(others)}) and does not say how a warm start seeds them "
            "(FederatedMethod.warm_start); it cannot start from another run"
        )


def load_warm_start(init_from: str | Path, method: FederatedMethod) -> WarmStart:
    """Read the source run ``init_from`` names and check that ``method`` can start from it;
    ValueError naming ``federation.init_from`` otherwise. Nothing is changed."""
    path = source_checkpoint(init_from)
    try:
        ckpt = RunCheckpoint.load(path)
    except ValueError as err:
        raise ValueError(f"{KEY}: {err}") from err
    name = str(ckpt.meta.get("method"))
    source = method_class(name)
    if source is None:
        raise ValueError(
            f"{KEY}: the source's method {name!r} is not a method this process knows "
            "(import its module, or give a run of a built-in method)"
        )
    check_warm_start(method)
    template = template_network(method)
    saved = ckpt.hparams or {}
    for key, mine in (
        ("model.init_args.network.backbone", method.backbone_name),
        ("model.init_args.network.norm", method.network_settings.norm),
    ):
        if key in saved and saved[key] != mine:
            raise ValueError(
                f"{KEY}: the source run has {key}={saved[key]!r}, this run {mine!r}: its network "
                "does not fit this run's"
            )
    try:
        state = source.scored_state(ckpt.method_state, template)
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"{KEY}: cannot take {name}'s scored network from {path}: {err}") from err
    state = {k: v.detach().cpu().clone() for k, v in state.items()}
    _check_fits(state, template, method)
    accs = [row[TEST_ACC] for row in ckpt.history if TEST_ACC in row]
    return WarmStart(
        checkpoint=path,
        method=name,
        round=int(ckpt.round),
        network=state,
        sha256=weights_sha256(state),
        test_acc=float(accs[-1]) if accs else None,
    )


def start_afresh(
    method: FederatedMethod, data: FederatedDataModule, seed: int, source: WarmStart | None
) -> None:
    """A run's start without a checkpoint: the initial global network drawn from the run's
    seed, then, for a warm start, ``source``'s network in its place (the method says how:
    :meth:`~fedlit.methods.FederatedMethod.warm_start`, with the run's data)."""
    seed_all(derive_seed(seed, 0, INIT))
    method.initialize()
    if source is not None:
        method.warm_start(source.network, data)
