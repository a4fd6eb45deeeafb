"""Datasets (embedded default, tfds, local files, packages), partitioners, heterogeneity
measures and device-resident data."""

from fedjax_dp.data import heterogeneity
from fedjax_dp.data.datasets import (
    DATASETS,
    Dataset,
    DatasetUnavailableError,
    binary_labels,
    load_dataset,
)
from fedjax_dp.data.federated import FederatedData, build_federated_data, gather_clients
from fedjax_dp.data.partition import PARTITIONERS, partition, partition_clients

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "Dataset",
    "DatasetUnavailableError",
    "FederatedData",
    "binary_labels",
    "build_federated_data",
    "gather_clients",
    "heterogeneity",
    "load_dataset",
    "partition",
    "partition_clients",
]
