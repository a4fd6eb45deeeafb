"""The DP-FL papers' experimental settings and methods, as configs of the engine.

What a reproduction script and its notebook share lives here, so that a notebook runs
from an installed package, outside the repository: :mod:`fedjax_dp.papers.adpfl`.
"""
