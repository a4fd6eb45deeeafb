"""Re-exports fedjax_dp/configs/adpfl_mnist_cnn.py, where the config lives
(``fedjax-dp run adpfl_mnist_cnn`` finds it from any directory)."""

from fedjax_dp.configs.adpfl_mnist_cnn import get_config  # noqa: F401
