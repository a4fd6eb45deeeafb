"""Clipping, noise mechanisms, accountants, the papers' privacy formulas, and the privacy
unit a run reports (:mod:`fedjax_dp.privacy.reporting`)."""
