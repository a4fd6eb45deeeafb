"""The round layer's public names, in one place.

The round lives in small modules, each owning one thing:

* :mod:`fedjax_dp.training.keys`: every random key of a round (seed, round, stream, tags);
* :mod:`fedjax_dp.training.rounds`: the compiled round (:class:`RoundArgs`,
  :class:`RoundConfig`, :func:`round_step`, :func:`cohort_step`);
* :mod:`fedjax_dp.training.evaluation`: the test set and the selected clients' validation score;
* :mod:`fedjax_dp.training.program`: a sweep's ``[G, L]`` points as one program on a mesh;
* :mod:`fedjax_dp.training.memory`: memory probing and the client chunk size;
* :mod:`fedjax_dp.privacy.selection`: the host's client slots and selection.

This module only re-exports them (docs/architecture.md), so ``engine.round_step``
and the like keep working; the package's own modules import the owners.
"""

from fedjax_dp.privacy.selection import SELECTIONS, cohort_size, poisson_cap, select_clients
from fedjax_dp.training.evaluation import (
    evaluate,
    make_eval_fn,
    make_validation_fn,
    selected_accuracy,
    sweep_evaluate,
)
from fedjax_dp.training.keys import (
    AGGREGATE_NOISE_TAG,
    CLIENT_TAG,
    CORRELATED_TAG,
    COUNT_NOISE_TAG,
    SERVER_TAG,
    STREAM_TAG,
    VALIDATION_NOISE_TAG,
    client_keys,
    correlated_key,
    round_key,
    server_key,
)
from fedjax_dp.training.memory import available_memory_bytes, client_chunk_for_memory
from fedjax_dp.training.program import (
    cohorts_in_sequence,
    make_sweep_fns,
    round_args_sharding,
    sweep_step,
)
from fedjax_dp.training.rounds import (
    AGGREGATIONS,
    CLIP_RULES,
    CONV_IMPLS,
    CarriedParams,
    RoundArgs,
    RoundConfig,
    RoundMetrics,
    carried_params,
    cohort_step,
    conv_impl_for,
    make_round_fn,
    masked_median,
    model_params,
    round_step,
)

__all__ = [
    "AGGREGATE_NOISE_TAG",
    "AGGREGATIONS",
    "CLIENT_TAG",
    "CLIP_RULES",
    "CONV_IMPLS",
    "CORRELATED_TAG",
    "COUNT_NOISE_TAG",
    "SELECTIONS",
    "SERVER_TAG",
    "STREAM_TAG",
    "VALIDATION_NOISE_TAG",
    "CarriedParams",
    "RoundArgs",
    "RoundConfig",
    "RoundMetrics",
    "available_memory_bytes",
    "carried_params",
    "client_chunk_for_memory",
    "client_keys",
    "cohort_size",
    "cohort_step",
    "cohorts_in_sequence",
    "conv_impl_for",
    "correlated_key",
    "evaluate",
    "make_eval_fn",
    "make_round_fn",
    "make_sweep_fns",
    "make_validation_fn",
    "masked_median",
    "model_params",
    "poisson_cap",
    "round_args_sharding",
    "round_key",
    "round_step",
    "select_clients",
    "selected_accuracy",
    "server_key",
    "sweep_evaluate",
    "sweep_step",
]
