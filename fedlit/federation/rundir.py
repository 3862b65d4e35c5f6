"""A run directory's life (:class:`RunDirectory`: checked, created, locked, made ready,
released), its lock, and the clean-up of a run that died before its first checkpoint. Nothing
here writes before the driver has checked every setting."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from fedlit.federation.console import note
from fedlit.federation.loggers import drop_rounds_after
from fedlit.federation.store import ClientStateStore
from fedlit.run_layout import (
    CHECKPOINT,
    LOCK_FILE,
    RECORD_FILE,
    RUN_FILES,
    RUN_MARKERS,
    write_path_error,
)


def run_markers(run_dir: Path) -> list[str]:
    """The run markers ``run_dir`` holds (empty: no run there)."""
    return [m for m in RUN_MARKERS if (run_dir / m).exists()]


def is_dead_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that stopped before its first checkpoint: run files but
    no ``checkpoints/last.ckpt``, so nothing in it can be resumed. A finished run kept as its
    record (``record.json``, its checkpoint dropped) is not dead."""
    if (run_dir / RECORD_FILE).is_file():
        return False
    return bool(run_markers(run_dir)) and not (run_dir / CHECKPOINT).is_file()


def checkpoint_run_dir(ckpt_path: str | Path) -> Path:
    """The run directory a checkpoint belongs to (``<run>/checkpoints/last.ckpt`` -> ``<run>``)."""
    return Path(ckpt_path).resolve().parent.parent


def same_dir(a: Path, b: Path) -> bool:
    """Whether two paths name the same directory (after resolving links and ``..``)."""
    return a.resolve() == b.resolve()


def check_creatable(run_dir: Path) -> None:
    """Raise ValueError naming ``trainer.default_root_dir`` if ``run_dir`` is not a directory
    this process can create or write into, or lies inside another run
    (:func:`~fedlit.run_layout.write_path_error`). Creates nothing."""
    error = write_path_error(run_dir, "trainer.default_root_dir", "run")
    if error:
        raise ValueError(error)


@contextmanager
def holding(run_dir: Path, lock: RunLock | None) -> Iterator[None]:
    """Hold ``run_dir``'s lock for a change to it: ``lock`` if given and held (the caller's),
    else the directory's lock taken now (without creating one) and dropped after. A
    ValueError names the directory if a live process holds it: a run that is still writing
    is never taken for one that died."""
    if lock is not None and lock.held:
        yield
        return
    own = RunLock(run_dir)
    own.acquire(create=False)
    try:
        yield
    finally:
        own.release()


def remove_dead_run(run_dir: Path, lock: RunLock | None = None) -> list[str]:
    """Remove the files of a run that died before its first checkpoint (its markers, run.json,
    hparams.yaml, partition.png, resume configs and an unfinished checkpoint), keeping any
    other file; returns the names removed. Refuses a directory holding a checkpoint, and
    (ValueError naming it) one whose lock a live process holds: the caller's held ``lock``,
    or the directory's, taken here (:func:`holding`)."""
    with holding(run_dir, lock):
        return _remove_dead_run(run_dir)


def set_aside_dead_run(run_dir: Path) -> Path:
    """Move a run that died before its first checkpoint out of the way, to
    ``<run>.incomplete<n>`` (never delete what was written); returns where. A ValueError
    names the directory if a live process holds its lock (a run still in its first round),
    or if it holds a checkpoint."""
    with holding(run_dir, None):
        if (run_dir / CHECKPOINT).is_file():
            raise ValueError(f"{run_dir} holds a checkpoint; it is not set aside")
        if (run_dir / RECORD_FILE).is_file():
            raise ValueError(f"{run_dir} holds a finished run's record; it is not set aside")
        return set_aside(run_dir, "incomplete")


def set_aside(run_dir: Path, kind: str) -> Path:
    """Rename ``run_dir`` to the first free ``<run>.<kind><n>`` beside it (nothing deleted);
    returns where. The caller holds its lock. ValueError where 999 such copies exist."""
    for n in range(1, 1000):
        target = run_dir.with_name(f"{run_dir.name}.{kind}{n}")
        if not target.exists():
            run_dir.rename(target)
            return target
    raise ValueError(f"{run_dir}: too many {kind} copies beside it")


def _remove_dead_run(run_dir: Path) -> list[str]:
    if (run_dir / CHECKPOINT).is_file():
        raise ValueError(f"{run_dir} holds a checkpoint; it is not removed")
    if (run_dir / RECORD_FILE).is_file():
        raise ValueError(f"{run_dir} holds a finished run's record; it is not removed")
    removed = []
    names = [*RUN_MARKERS, *RUN_FILES, *(p.name for p in sorted(run_dir.glob("config.resume*")))]
    for name in names:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def free_config_name(run_dir: Path, start_round: int) -> str:
    """The name the run's resolved config is saved under: ``config.yaml`` for a new run,
    ``config.resume<round>.yaml`` for a resume, ``config.resume<round>.<n>.yaml`` when that
    round was resumed before (a resume stopped before its first new checkpoint)."""
    if start_round == 1:
        return "config.yaml"
    name, n = f"config.resume{start_round}.yaml", 1
    while (run_dir / name).exists():
        n += 1
        name = f"config.resume{start_round}.{n}.yaml"
    return name


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock``, held while a process writes the run.

    The kernel drops it when the process ends, however it ends, so a killed run never leaves
    a stale lock behind; the file itself stays (it holds the last writer's pid).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILE
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self, create: bool = True) -> None:
        """Take the lock. With ``create=False`` only an existing lock file is locked and
        nothing is written (its content, the last writer's pid, stays: a refused run leaves
        the directory as it found it); with ``create=True`` (the run will write here) the file
        is created if need be and holds this process's pid, also when the lock was taken
        before with ``create=False``. A ValueError names the directory if another process
        holds it."""
        if fcntl is None:
            return
        if self._file is not None:
            if create:
                self._stamp(self._file)
            return
        if not create and not self.path.is_file():
            return
        if create:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "a+")  # noqa: SIM115 (held open for the run's duration)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.seek(0)
            pid = file.read().strip()
            file.close()
            holder = f" (pid {pid})" if pid else ""
            raise ValueError(
                f"trainer.default_root_dir: {self.run_dir} is being written by another "
                f"process{holder} holding {self.path}; wait for it to end or choose another "
                "directory"
            ) from None
        if create:
            self._stamp(file)
        self._file = file

    @staticmethod
    def _stamp(file: IO[str]) -> None:
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()

    def release(self) -> None:
        """Drop the lock (a no-op if not held)."""
        if self._file is not None:
            self._file.close()  # closing the file releases the flock
            self._file = None


class RunDirectory:
    """A run's directory over the run's life: checked before anything is written
    (:meth:`reserve`, :meth:`check`), created, locked and made ready to write (:meth:`open`),
    released (:meth:`close`). The lock (:class:`RunLock`) is held from :meth:`open` to
    :meth:`close`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = RunLock(self.path)
        self.dead = False  # it holds a run that died before its first checkpoint
        self.opened = False  # open has run: the directory is locked and ready

    @property
    def checkpoint_path(self) -> Path:
        """Where the run's checkpoint is written: ``<run>/checkpoints/last.ckpt``."""
        return self.path / CHECKPOINT

    def reserve(self) -> None:
        """Refuse a directory this process cannot create or write into, or one another
        process is writing (its lock is taken, where a lock file exists). Writes nothing."""
        check_creatable(self.path)
        self.lock.acquire(create=False)

    def check(self, resume: str | None) -> None:
        """Refuse a directory that holds a run this one does not continue (``resume``: the
        checkpoint it continues, if any). A directory whose run died before its first
        checkpoint is noted (:meth:`open` clears it)."""
        self.dead = is_dead_run(self.path)
        found = run_markers(self.path)
        if not found or self.dead:
            return
        if resume is None:
            raise ValueError(
                f"trainer.default_root_dir: {self.path} already holds a run "
                f"({', '.join(found)}); choose another directory, or continue it with "
                f"--federation.resume {self.checkpoint_path}"
            )
        origin = checkpoint_run_dir(resume)
        if not same_dir(origin, self.path):
            raise ValueError(
                f"federation.resume: the checkpoint {resume} belongs to the run in {origin}, "
                f"but trainer.default_root_dir {self.path} holds a different run "
                f"({', '.join(found)}); resume into {origin} or into a new directory"
            )

    def open(self, resume: str | None, store: ClientStateStore, start_round: int) -> None:
        """Create and lock the directory, then make it ready to write: a run that died there
        before its first checkpoint is removed (with a note), ``store`` is opened, and a
        resume from round ``start_round`` drops the rows ``metrics.csv`` holds after the
        checkpoint's round (logged by a run killed between its metrics and its checkpoint).
        Raises ValueError if another process holds the lock or wrote a run there since
        :meth:`check`. A no-op once open."""
        if self.opened:
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(
                f"trainer.default_root_dir={str(self.path)!r}: cannot create it: "
                f"{err.strerror or err}"
            ) from err
        self.lock.acquire()
        try:
            self.check(resume)  # again, under the lock
            if self.dead:
                removed = remove_dead_run(self.path, self.lock)
                note(
                    f"{self.path} held a run stopped before its first checkpoint; "
                    f"removed its {', '.join(removed)} and started afresh"
                )
                self.dead = False
            store.open()  # the resumed run's client states here, nothing else
            if start_round > 1:
                metrics = self.path / "metrics.csv"
                dropped = drop_rounds_after(metrics, start_round - 1)
                if dropped:
                    note(
                        f"{metrics}: dropped {dropped} row(s) logged after round "
                        f"{start_round - 1}, the checkpoint's; they are run again"
                    )
            self.opened = True
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        """Release the directory's lock (a no-op if not held)."""
        self.lock.release()
        self.opened = False
