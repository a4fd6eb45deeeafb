"""Convergence bounds and optimal-T predictors of the DP-FL papers."""

from fedjax_dp.theory import fu, wei, yuan
from fedjax_dp.theory.wei import (
                                  BoundCoefficients,
                                  ProblemConstants,
                                  bound,
                                  coefficients,
                                  estimate_constants,
                                  optimal_rounds,
                                  optimal_rounds_int,
                                  predict_optimal_rounds,
)

__all__ = ["BoundCoefficients", "ProblemConstants", "bound", "coefficients",
           "estimate_constants", "fu", "optimal_rounds", "optimal_rounds_int",
           "predict_optimal_rounds", "wei", "yuan"]
