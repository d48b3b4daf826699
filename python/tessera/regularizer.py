"""Regularizers for optimizers (like ``fluid.regularizer``). Only L2 decay exists on the C++ side:
the optimize ops add ``l2_decay * param`` to each gradient (``regularization_coeff``)."""

import math

__all__ = ["L2Decay", "L2DecayRegularizer"]


class L2Decay(object):
    """L2 weight decay with coefficient `regularization_coeff` (>= 0)."""

    def __init__(self, regularization_coeff=0.0):
        coeff = float(regularization_coeff)
        if not (coeff >= 0) or not math.isfinite(coeff):
            raise ValueError("L2Decay: regularization_coeff %r must be >= 0 and finite" %
                             (regularization_coeff,))
        self.regularization_coeff = coeff

    def __repr__(self):
        return "L2Decay(%r)" % self.regularization_coeff


L2DecayRegularizer = L2Decay
