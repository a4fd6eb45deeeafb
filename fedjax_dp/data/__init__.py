"""Datasets (embedded default, tfds, local files), partitioners and device-resident data."""

from fedjax_dp.data.datasets import DATASETS, Dataset, load_dataset
from fedjax_dp.data.federated import FederatedData, build_federated_data
from fedjax_dp.data.partition import PARTITIONERS, partition

__all__ = [
    "DATASETS", "Dataset", "FederatedData", "PARTITIONERS", "build_federated_data",
    "load_dataset", "partition",
]
