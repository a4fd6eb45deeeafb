"""Re-exports fedjax_dp/configs/quickstart.py, where the config lives
(``fedjax-dp run quickstart`` finds it from any directory)."""

from fedjax_dp.configs.quickstart import get_config  # noqa: F401
