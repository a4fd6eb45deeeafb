"""fedjax_dp: differentially private federated learning simulated in JAX.

The package root holds nothing itself; docs/architecture.md maps its modules.
"""
