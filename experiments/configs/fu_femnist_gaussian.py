"""Re-exports fedjax_dp/configs/fu_femnist_gaussian.py, where the config lives
(``fedjax-dp run fu_femnist_gaussian`` finds it from any directory)."""

from fedjax_dp.configs.fu_femnist_gaussian import get_config  # noqa: F401
