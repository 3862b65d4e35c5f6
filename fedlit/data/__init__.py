"""Data: data sets by name, augmentations, the server's data, the client pool and sampling."""

from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.datasets import SPECS, DatasetSpec, ImageSplit, dataset_spec, load_split
from fedlit.data.loaders import ImageBatches
from fedlit.data.partition import (
    IID,
    SSFL,
    ClassesPerClient,
    Dirichlet,
    Partitioner,
    RandomProportions,
    class_counts,
    non_iid_metric,
)
from fedlit.data.pool import ClientData, ClientPool
from fedlit.data.sampling import sample_clients, visit_number
from fedlit.data.server import ServerData
from fedlit.data.transforms import build_transform

__all__ = [
    "IID",
    "ClientData",
    "ClientPool",
    "ImageBatches",
    "SPECS",
    "SSFL",
    "ClassesPerClient",
    "DatasetSpec",
    "Dirichlet",
    "FederatedDataModule",
    "ImageSplit",
    "Partitioner",
    "RandomProportions",
    "ServerData",
    "build_transform",
    "class_counts",
    "dataset_spec",
    "load_split",
    "non_iid_metric",
    "sample_clients",
    "visit_number",
]
