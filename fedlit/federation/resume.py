"""A run's checkpoint over its life: written after every round, and on a resume read, checked
against the run that continues it and restored."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlit.data.datamodule import FederatedDataModule
from fedlit.federation.checkpoint import RunCheckpoint
from fedlit.federation.config import RESUME_MAY_CHANGE, FederationConfig
from fedlit.federation.console import first_line, note
from fedlit.federation.fit.loop import restore_scalers, scaler_states
from fedlit.federation.rundir import checkpoint_run_dir
from fedlit.federation.seeding import rng_states, set_rng_states
from fedlit.federation.store import CLIENT_DIR, ClientStateStore
from fedlit.methods.base import FederatedMethod
from fedlit.run_layout import CONFIG_FILE


def _covers(allowed: str, key: str) -> bool:
    """Whether setting ``allowed`` is ``key`` or a group holding it."""
    return key == allowed or key.startswith(allowed + ".")


def changed_settings(
    saved: dict[str, Any], current: dict[str, Any], allowed: tuple[str, ...] = RESUME_MAY_CHANGE
) -> list[str]:
    """The keys, sorted, whose values differ between a run's recorded flat config (``saved``)
    and the one that would continue or reuse it (``current``), besides the settings
    ``allowed`` to differ (each a key or a group holding it). Keys only one side has (settings
    added by a newer version) are not compared, nor anything where either side records
    nothing. The one comparison of a resume (:meth:`Checkpointer.check`) and of a comparison
    reusing a run (``fedlit compare``)."""
    if not saved or not current:
        return []
    return [
        key
        for key in sorted(saved.keys() & current.keys())
        if saved[key] != current[key] and not any(_covers(a, key) for a in allowed)
    ]


def check_may_change(config: FederationConfig, hparams: dict[str, Any]) -> None:
    """Refuse a ``federation.resume_may_change`` entry that names no setting of ``hparams``
    (the run's flat config; checked on every fit, not only on a resume)."""
    for name in config.resume_may_change:
        if hparams and not any(_covers(name, key) for key in hparams):
            raise ValueError(f"federation.resume_may_change: no setting named {name!r}")


def load_resume(resume: str | None) -> RunCheckpoint | None:
    """The checkpoint ``federation.resume`` names (None: a fresh run); a ValueError that
    names the key if it cannot be read."""
    if not resume:
        return None
    try:
        return RunCheckpoint.load(resume)
    except ValueError as err:
        named = str(err).startswith("federation.resume")
        raise ValueError(str(err) if named else f"federation.resume: {err}") from err


@dataclass(eq=False)
class Checkpointer:
    """The checkpoint file at ``path`` of a run of ``method`` on ``data`` with ``seed``:
    :meth:`save` writes it after a round, :meth:`check` refuses one this run cannot continue,
    :meth:`restore` continues from one.

    A checkpoint stores who made it (:attr:`meta`) and the run's flat config (``hparams``); a
    resume must match both.
    """

    path: Path
    method: FederatedMethod
    data: FederatedDataModule
    store: ClientStateStore
    seed: int
    hparams: dict[str, Any]
    #: The round of the run's last checkpoint (0: none yet).
    round: int = field(default=0, init=False)

    @property
    def meta(self) -> dict[str, Any]:
        """Who makes the checkpoint: seed, method, number of clients, data set."""
        return {
            "seed": self.seed,
            "method": type(self.method).__name__,
            "num_clients": self.data.num_clients,
            "dataset": self.data.dataset,
        }

    def save(self, round_idx: int, visits: dict[int, int], history: list[dict[str, float]]) -> None:
        """Write the checkpoint of round ``round_idx``; the client states' files it no longer
        names are removed."""
        RunCheckpoint(
            round=round_idx,
            method_state=self.method.state_dict(),
            client_states=self.store.state_dict(),
            visits=dict(visits),
            history=history,
            rng=rng_states(),
            meta=self.meta,
            hparams=self.hparams,
            scalers=scaler_states(self.method),
        ).save(self.path)
        self.store.checkpointed()
        self.round = round_idx

    def check(self, ckpt: RunCheckpoint, config: FederationConfig) -> None:
        """Refuse a checkpoint made by another run (seed, method, clients, data set), with
        other settings, or with no round left to run."""
        self._check_settings(ckpt.hparams or {}, config)
        meta = self.meta
        other = [
            f"{key}={value!r}, this run has {meta.get(key)!r}"
            for key, value in ckpt.meta.items()
            if meta.get(key) != value
        ]
        if other:
            raise ValueError(f"federation.resume: the checkpoint was made with {'; '.join(other)}")
        if ckpt.round >= config.rounds:
            raise ValueError(
                f"federation.resume: the checkpoint already completed round {ckpt.round}; "
                f"federation.rounds={config.rounds} leaves nothing to run"
            )

    def _check_settings(self, saved: dict[str, Any], config: FederationConfig) -> None:
        """Refuse a resume whose settings differ from the checkpoint's (``saved``, its flat
        config) in a key that changes results; :data:`RESUME_MAY_CHANGE` and
        ``federation.resume_may_change`` may differ. Keys only one side has (settings added
        by a newer version) are not compared."""
        allowed = (*RESUME_MAY_CHANGE, *config.resume_may_change)
        changed = changed_settings(saved, self.hparams, allowed)
        if changed:
            assert config.resume is not None
            run_config = checkpoint_run_dir(config.resume) / CONFIG_FILE
            shown = "; ".join(
                f"{key}={self.hparams[key]!r} (the checkpoint's: {saved[key]!r})" for key in changed
            )
            raise ValueError(
                f"federation.resume: {len(changed)} setting(s) differ from the checkpoint's: "
                f"{shown}. Resume with the run's own config (--config {run_config} "
                f"--federation.resume {config.resume}), or allow the change with "
                f"--federation.resume_may_change=[{','.join(changed)}]"
            )

    def restore(self, ckpt: RunCheckpoint, config: FederationConfig) -> None:
        """Continue from ``ckpt``: the method's global and server state, the client states and
        the random generators; the caller takes its visits and history."""
        try:
            self.method.load_state_dict(ckpt.method_state)
        except (RuntimeError, ValueError) as err:  # another architecture (size mismatch)
            raise ValueError(
                f"federation.resume: the checkpoint's network does not fit this model "
                f"(model.network.backbone={self.method.backbone_name!r}): {first_line(err)}"
            ) from err
        assert config.resume is not None
        self.store.load_state_dict(ckpt.client_states, Path(config.resume).parent / CLIENT_DIR)
        set_rng_states(ckpt.rng)
        restore_scalers(self.method, ckpt.scalers)
        self.round = ckpt.round
        _note_new_schedule(ckpt, config)


def _note_new_schedule(ckpt: RunCheckpoint, config: FederationConfig) -> None:
    """Say so when a resume changes ``federation.rounds``: the run-level schedules are laid
    out again over the new number of rounds."""
    before = (ckpt.hparams or {}).get("federation.rounds")
    if not isinstance(before, int) or before == config.rounds:
        return
    done = "round 1" if ckpt.round == 1 else f"rounds 1-{ckpt.round}"
    note(
        f"federation.rounds {before} -> {config.rounds}: the run-level schedules "
        f"(learning rate, ramps) are laid out again over {config.rounds} rounds "
        f"from round {ckpt.round + 1} on; {done} followed the {before}-round "
        f"schedule, so the result differs from a fresh {config.rounds}-round run"
    )
