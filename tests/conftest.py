"""Shared fixtures: the local Fashion-MNIST and tiny federations on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlit.data.datasets import DEBIAN_FASHION_MNIST, stage_debian_fashion_mnist


@pytest.fixture(scope="session")
def fmnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding Fashion-MNIST, staged from Debian's dataset-fashion-mnist package."""
    root = tmp_path_factory.mktemp("data")
    if not stage_debian_fashion_mnist(root):
        pytest.fail(
            f"Fashion-MNIST not found in {DEBIAN_FASHION_MNIST}: "
            "apt-get install dataset-fashion-mnist (.ci/run does this)"
        )
    return root
