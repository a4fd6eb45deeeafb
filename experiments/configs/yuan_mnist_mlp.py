"""Re-exports fedjax_dp/configs/yuan_mnist_mlp.py, where the config lives
(``fedjax-dp run yuan_mnist_mlp`` finds it from any directory)."""

from fedjax_dp.configs.yuan_mnist_mlp import get_config  # noqa: F401
