"""Empirical privacy audit (``fedjax-dp audit``): see :mod:`fedjax_dp.audit.audit`."""

from fedjax_dp.audit.audit import VARIANTS, AuditOptions, AuditResult, audit, canary_pair

__all__ = ["VARIANTS", "AuditOptions", "AuditResult", "audit", "canary_pair"]
