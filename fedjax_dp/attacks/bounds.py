r"""What a certified (epsilon, delta) implies for any membership-inference attack.

Hypothesis-testing view of DP (Wasserman & Zhou 2010; Kairouz, Oh & Viswanath,
ICML 2015, Thm. 2.1). Let M be (eps, delta)-DP for an adjacency relation and let
D, D' be adjacent. Any test that sees M's output and says "D" (here: "the record
is a member") has false-positive rate alpha = P[say D | D'] and true-positive rate
TPR = P[say D | D] inside the region

  (R1)  TPR     <= e^eps alpha + delta,
  (R2)  1 - alpha >= e^eps (1 - TPR) - delta,  i.e.  TPR <= 1 - e^-eps (1 - delta - alpha),

and TPR <= 1 (with the symmetric constraints from swapping D and D', which do not
bind for TPR >= alpha). The membership advantage TPR - alpha is linear, so its
maximum over this convex polygon sits at a vertex. The vertices with TPR >= alpha
are (0, 0), (0, delta), (1 - delta, 1), (1, 1) -- advantage at most delta -- and the
corner where R1 and R2 meet:

  e^eps alpha + delta = 1 - e^-eps (1 - delta - alpha)
  <=> alpha (e^{2 eps} - 1) = (e^eps - 1)(1 - delta)
  <=> alpha* = (1 - delta) / (e^eps + 1),   TPR* = e^eps (1 - delta) / (e^eps + 1) + delta,

where the advantage is

  TPR* - alpha* = [(e^eps - 1)(1 - delta) + delta (e^eps + 1)] / (e^eps + 1)
                = (e^eps - 1 + 2 delta) / (e^eps + 1)                        (>= delta).

So every attack has advantage <= (e^eps - 1 + 2 delta) / (e^eps + 1) (capped at 1),
and, for equally many members and non-members, balanced accuracy
1/2 + advantage / 2 <= (e^eps + delta) / (e^eps + 1). With delta = 0 the bound is
attained by randomized response. It is tighter than Yeom et al.'s e^eps - 1
(2018, Thm. 1) and agrees with Humphries et al. (2020).

Which epsilon applies. The bound holds for the membership game whose two worlds are
adjacent under the accountant's relation: the target is trained either with the
challenge record or with it replaced by another one (replace-one adjacency, which
is what ``fedjax_dp.privacy.plan`` accounts). The empirical attacks here compare
records in and out of one fixed training set, which estimates that game's
accuracy averaged over records.
* An example-level accountant (``level == 'example'``: upload or per-step noise)
  bounds attacks on individual examples with its epsilon.
* A client-level accountant (``'client'``: central noise) also bounds them with the
  same epsilon: replacing one example changes one client's data, which the
  client-level relation covers. The converse fails: an example-level epsilon says
  nothing useful about inferring whether a whole client took part (that needs group
  privacy over the client's examples).
* A run without noise certifies eps = inf, and the bound is the trivial 1.
A paper's claimed epsilon (e.g. Wei eq. (10)) is not a certificate (specs, errata);
a bound computed from it is labelled as such by the callers.
"""

from __future__ import annotations

import math

import numpy as np


def _check(epsilon, delta):
  epsilon = np.asarray(epsilon, np.float64)
  delta = np.asarray(delta, np.float64)
  if np.any(np.isnan(epsilon)) or np.any(epsilon < 0):
    raise ValueError(f"epsilon must be >= 0 (inf for no guarantee), got {epsilon}")
  if np.any(np.isnan(delta)) or np.any(delta < 0) or np.any(delta > 1):
    raise ValueError(f"delta must be in [0, 1], got {delta}")
  return epsilon, delta


def advantage_bound(epsilon, delta=0.0):
  """Largest ``TPR - FPR`` of any membership test against an (eps, delta)-DP release.

  ``(e^eps - 1 + 2 delta) / (e^eps + 1)``, capped at 1 (derivation in the module
  docstring). Broadcasts over array inputs; ``epsilon = inf`` gives 1.

  Args:
    epsilon: certified epsilon, ``>= 0``.
    delta: its delta, in ``[0, 1]``.

  Returns:
    The bound, a float (or array for array inputs).
  """
  epsilon, delta = _check(epsilon, delta)
  with np.errstate(over="ignore", invalid="ignore"):
    e = np.exp(epsilon)
    # (e - 1 + 2 delta) / (e + 1), written to stay finite for huge epsilon.
    adv = np.where(np.isinf(e), 1.0, 1.0 - 2.0 * (1.0 - delta) / (e + 1.0))
  adv = np.minimum(adv, 1.0)
  return float(adv) if adv.ndim == 0 else adv


def accuracy_bound(epsilon, delta=0.0):
  """Largest balanced accuracy ``1/2 + (TPR - FPR)/2 = (e^eps + delta)/(e^eps + 1)``."""
  adv = advantage_bound(epsilon, delta)
  return 0.5 + 0.5 * adv


def max_tpr(fpr, epsilon, delta=0.0):
  """The upper edge of the (eps, delta)-DP testing region: the largest TPR at ``fpr``
  (constraints R1, R2 and TPR <= 1 of the module docstring)."""
  epsilon, delta = _check(epsilon, delta)
  fpr = np.asarray(fpr, np.float64)
  if math.isinf(float(np.max(epsilon))):
    return np.ones_like(fpr)
  e = np.exp(epsilon)
  return np.minimum.reduce([np.ones_like(fpr), e * fpr + delta,
                            1.0 - (1.0 - delta - fpr) / e])
