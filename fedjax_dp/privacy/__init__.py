"""Clipping, noise mechanisms, accountants and the papers' privacy formulas."""
