"""Data: data sets by name, augmentations, the server split, client partitions and sampling."""

from fedlit.data.client import ClientData
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
from fedlit.data.sampling import sample_clients, visit_number
from fedlit.data.transforms import build_transform

__all__ = [
    "IID",
    "ClientData",
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
    "build_transform",
    "class_counts",
    "dataset_spec",
    "load_split",
    "non_iid_metric",
    "sample_clients",
    "visit_number",
]
