"""Re-exports fedjax_dp/configs/adpfl_clfl_mnist.py, where the config lives
(``fedjax-dp run adpfl_clfl_mnist`` finds it from any directory)."""

from fedjax_dp.configs.adpfl_clfl_mnist import get_config  # noqa: F401
