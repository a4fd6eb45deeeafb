"""Model zoo: flax modules exposed as pure ``init`` / ``apply`` (see :class:`Model`)."""

from fedjax_dp.models.base import LOSSES, Model, cross_entropy, multiclass_hinge
from fedjax_dp.models.zoo import MODELS, get_model

__all__ = ["LOSSES", "MODELS", "Model", "cross_entropy", "get_model", "multiclass_hinge"]
