"""Empirical privacy audit (``fedjax-dp audit``): see :mod:`fedjax_dp.audit.audit`."""

from fedjax_dp.audit.audit import VARIANTS, AuditOptions, AuditResult, audit, canary_pair
from fedjax_dp.audit.whole_run import RUN_VARIANTS, audit_run

__all__ = ["RUN_VARIANTS", "VARIANTS", "AuditOptions", "AuditResult", "audit", "audit_run",
           "canary_pair"]
