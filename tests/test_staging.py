"""Staging Fashion-MNIST into one fresh data root from several processes at once, and the
check of what is already staged."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlit.data.datasets import (
    FASHION_FILES,
    _fashion_raw,
    _has_raw_fashion,
    idx_size,
    load_split,
    stage_debian_fashion_mnist,
)
from fedlit.data.own.statistics import StatisticsCache
from fedlit.run_layout import created_mode

#: A process that stages into ``root``, loads both splits and prints their digest.
LOAD = """
import hashlib, sys
from fedlit.data.datasets import load_split
h = hashlib.sha256()
for train in (True, False):
    split = load_split("fashion_mnist", sys.argv[1], train=train, download=False)
    h.update(split.images.numpy().tobytes())
    h.update(split.labels.numpy().tobytes())
print(h.hexdigest())
"""


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for train in (True, False):
        split = load_split("fashion_mnist", root, train=train, download=False)
        h.update(split.images.numpy().tobytes())
        h.update(split.labels.numpy().tobytes())
    return h.hexdigest()


def test_idx_size_reads_the_header(tmp_path: Path) -> None:
    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") * 3 + bytes(8))
    assert idx_size(path) == 4 + 12 + 8
    path.write_bytes(bytes(24))  # zeroed: no IDX magic
    assert idx_size(path) is None
    path.write_bytes(b"\x00\x00\x08\x03" + bytes(5))  # cut inside the dimensions
    assert idx_size(path) is None


@pytest.mark.slow
def test_four_processes_staging_one_fresh_root_load_identical_data(
    tmp_path: Path, fmnist_root: Path
) -> None:
    root = tmp_path / "fresh"
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(root)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    digests = {out.strip() for out, _ in outs}
    assert digests == {_digest(fmnist_root)}  # each one's data is a single staging's
    raw = _fashion_raw(root)
    assert sorted(p.name for p in raw.iterdir()) == sorted(FASHION_FILES)  # no temporaries


def test_a_truncated_or_zeroed_staged_file_is_staged_again(
    tmp_path: Path, fmnist_root: Path
) -> None:
    root = tmp_path / "root"
    assert stage_debian_fashion_mnist(root)
    raw = _fashion_raw(root)
    whole = (raw / "train-images-idx3-ubyte").read_bytes()
    assert whole == (_fashion_raw(fmnist_root) / "train-images-idx3-ubyte").read_bytes()
    with open(raw / "train-images-idx3-ubyte", "r+b") as f:  # cut mid-file
        f.truncate(len(whole) // 2)
    (raw / "t10k-labels-idx1-ubyte").write_bytes(bytes(10008))  # right size, all zeros
    assert not _has_raw_fashion(root)
    assert stage_debian_fashion_mnist(root)
    assert (raw / "train-images-idx3-ubyte").read_bytes() == whole
    labels = (raw / "t10k-labels-idx1-ubyte").read_bytes()
    assert labels == (_fashion_raw(fmnist_root) / "t10k-labels-idx1-ubyte").read_bytes()
    assert _digest(root) == _digest(fmnist_root)


def test_a_staged_file_of_the_wrong_length_for_its_archive_is_staged_again(
    tmp_path: Path, fmnist_root: Path
) -> None:
    root = tmp_path / "root"
    assert stage_debian_fashion_mnist(root)
    path = _fashion_raw(root) / "t10k-labels-idx1-ubyte"
    good = path.read_bytes()
    # a consistent IDX header of 9,000 labels: whole by its header, not its archive's bytes
    path.write_bytes(good[:4] + (9000).to_bytes(4, "big") + good[8 : 8 + 9000])
    assert idx_size(path) == path.stat().st_size
    assert _has_raw_fashion(root)  # by the headers alone
    assert stage_debian_fashion_mnist(root)  # against Debian's archives: staged again
    assert path.read_bytes() == good


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_files_fedlit_writes_through_a_temporary_file_follow_the_umask(
    tmp_path: Path, umask: int
) -> None:
    """The staged Fashion-MNIST files and a user folder's statistics file are written to a
    temporary file (``mkstemp``: mode 0o600) renamed into place; they get the permissions
    the process's umask gives a new file, as any other file the user makes (0o644 under
    0o022, 0o640 under 0o027)."""
    previous = os.umask(umask)
    try:
        assert created_mode() == 0o666 & ~umask
        assert stage_debian_fashion_mnist(tmp_path / "data")
        staged = sorted((tmp_path / "data").rglob("*-ubyte"))
        stats = StatisticsCache(tmp_path / "stats.json", "key")
        stats.write([0.5], [0.25])
    finally:
        os.umask(previous)
    assert len(staged) == 4
    for path in [*staged, stats.path]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
    assert stats.read() == ((0.5,), (0.25,))
