"""Re-exports fedjax_dp/configs/fu_lr_laplace.py, where the config lives
(``fedjax-dp run fu_lr_laplace`` finds it from any directory)."""

from fedjax_dp.configs.fu_lr_laplace import get_config  # noqa: F401
