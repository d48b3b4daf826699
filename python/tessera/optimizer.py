"""Optimizers: record the model file's ``OptimizerConfig`` (like ``fluid.optimizer``).

``minimize(loss)`` adds no ops: the C++ loader appends the backward and optimizer ops itself
(``CompileModel``), creating the learning rate, its schedule and the per-parameter state. What
Python records is the configuration: type, learning rate, L2 decay, an exponential decay schedule
and the optimizer's hyper-parameters. Hyper-parameters left at None are left unset in the file,
which means the C++ defaults (adam beta1 0.9, beta2 0.999, epsilon 1e-8; adagrad epsilon 1e-6);
Momentum always records its momentum, as the C++ examples do.

``clip_global_norm`` scales every gradient by clip / max(clip, their global L2 norm) before the
update (in pserver mode each trainer clips its own gradients). An optimizer given to an
embedding table through ``ParamAttr(optimizer=...)`` updates that table only; it has its own
learning rate (constant) and no schedule or clipping of its own.
"""

import math

from tessera import framework as fw
from tessera import initializer as _init
from tessera import regularizer as _reg
from tessera.proto import model_pb2

__all__ = ["SGD", "Momentum", "Adagrad", "Adam", "ExponentialDecay", "Optimizer",
           "SGDOptimizer", "MomentumOptimizer", "AdagradOptimizer", "AdamOptimizer"]


def _positive(what, v):
    v = float(v)
    if not (v > 0) or not math.isfinite(v):
        raise ValueError("%s must be positive and finite, got %r" % (what, v))
    return v


def _unit(what, v):
    v = float(v)
    if not 0 <= v < 1:
        raise ValueError("%s must be in [0, 1), got %r" % (what, v))
    return v


class ExponentialDecay(object):
    """Learning rate lr * decay_rate^(step / decay_steps), the exponent floored if staircase."""

    def __init__(self, learning_rate, decay_steps, decay_rate, staircase=False):
        self.learning_rate = _positive("learning_rate", learning_rate)
        if isinstance(decay_steps, bool) or not isinstance(decay_steps, int) or decay_steps < 1:
            raise ValueError("decay_steps must be an int >= 1, got %r" % (decay_steps,))
        self.decay_steps = decay_steps
        self.decay_rate = _positive("decay_rate", decay_rate)
        self.staircase = bool(staircase)

    def __repr__(self):
        return "ExponentialDecay(%r, %d, %r, staircase=%s)" % (
            self.learning_rate, self.decay_steps, self.decay_rate, self.staircase)


class Optimizer(object):
    """Base class: learning rate (a float or ExponentialDecay) and regularization."""

    type = None

    def __init__(self, learning_rate, regularization=None, l2_decay=None, clip_global_norm=None):
        self.clip_global_norm = (None if clip_global_norm is None else
                                 _positive("clip_global_norm", clip_global_norm))
        if isinstance(learning_rate, ExponentialDecay):
            self.schedule = learning_rate
            self.learning_rate = learning_rate.learning_rate
        else:
            self.schedule = None
            self.learning_rate = _positive("learning_rate", learning_rate)
        if regularization is not None and l2_decay is not None:
            raise ValueError("give regularization or l2_decay, not both")
        if l2_decay is not None:
            regularization = _reg.L2Decay(l2_decay)
        if regularization is not None and not isinstance(regularization, _reg.L2Decay):
            raise TypeError("regularization must be tessera.regularizer.L2Decay, got %r" %
                            (regularization,))
        self.l2_decay = regularization.regularization_coeff if regularization else 0.0
        if _init.float32(self.learning_rate) <= 0:
            raise ValueError("learning_rate %r rounds to 0 in float32" % self.learning_rate)

    def _fill(self, config):
        """Sets the type-specific fields of an OptimizerConfig."""

    def config(self):
        """The OptimizerConfig message this optimizer records."""
        c = model_pb2.OptimizerConfig()
        c.type = self.type
        c.learning_rate = self.learning_rate
        c.l2_decay = self.l2_decay
        if self.schedule is not None:
            c.decay_steps = self.schedule.decay_steps
            c.decay_rate = self.schedule.decay_rate
            c.staircase = self.schedule.staircase
        if self.clip_global_norm is not None:
            c.clip_global_norm = self.clip_global_norm
        self._fill(c)
        return c

    def table_config(self, table):
        """The OptimizerConfig of this optimizer as embedding table `table`'s own."""
        if self.schedule is not None or self.clip_global_norm is not None:
            raise ValueError("table %r: its optimizer has %s; a table has no schedule or "
                             "clipping of its own (the model's optimizer sets them for every "
                             "parameter)" % (table, "a learning-rate schedule"
                                             if self.schedule is not None else
                                             "clip_global_norm"))
        return self.config()

    def minimize(self, loss):
        """Records this optimizer and `loss` (a float32 [1] variable) in loss's model."""
        if not isinstance(loss, fw.Variable):
            raise TypeError("minimize: loss must be a Variable, got %r" % (loss,))
        model = loss.model
        if len(loss.shape) > 1 or list(loss.shape) != [1] or loss.dtype != "float32":
            raise ValueError("minimize: loss %r is %s %s; it must be a [1] (scalar) float32 "
                             "variable (take its mean: layers.mean)" %
                             (loss.name, loss.dtype, fw.shape_str(loss.shape)))
        if model.writer_of(loss.name) is None:
            raise ValueError("minimize: loss %r is not written by any op" % loss.name)
        if model.optimizer is not None:
            raise ValueError("minimize: the model already has an optimizer (%s, loss %r); a "
                             "model file holds one" % (model.optimizer.type, model.loss))
        if not model.parameters():
            raise ValueError("minimize: the model has no parameters to train")
        if self.type == "momentum":
            for v in model.parameters():
                if v.is_distributed and v.name not in model.table_optimizers:
                    raise ValueError("minimize: momentum cannot update distributed table %r "
                                     "(distributed tables support sgd, adagrad and adam)" % v.name)
        config = self.config()
        model.optimizer = config
        model.loss = loss.name
        return config


class SGD(Optimizer):
    """Plain stochastic gradient descent."""

    type = "sgd"


class Momentum(Optimizer):
    """SGD with momentum `momentum` (in [0, 1)), optionally Nesterov."""

    type = "momentum"

    def __init__(self, learning_rate, momentum=0.9, nesterov=False, regularization=None,
                 l2_decay=None, use_nesterov=None, clip_global_norm=None):
        Optimizer.__init__(self, learning_rate, regularization, l2_decay, clip_global_norm)
        self.momentum = _unit("momentum", momentum)
        self.nesterov = bool(nesterov if use_nesterov is None else use_nesterov)

    def _fill(self, config):
        config.momentum = self.momentum
        config.nesterov = self.nesterov


class Adagrad(Optimizer):
    """Adagrad; epsilon None means the C++ default 1e-6."""

    type = "adagrad"

    def __init__(self, learning_rate, epsilon=None, regularization=None, l2_decay=None,
                 clip_global_norm=None):
        Optimizer.__init__(self, learning_rate, regularization, l2_decay, clip_global_norm)
        self.epsilon = None if epsilon is None else _positive("epsilon", epsilon)

    def _fill(self, config):
        if self.epsilon is not None:
            config.epsilon = self.epsilon


class Adam(Optimizer):
    """Adam; None hyper-parameters mean the C++ defaults (beta1 0.9, beta2 0.999, epsilon 1e-8)."""

    type = "adam"

    def __init__(self, learning_rate=0.001, beta1=None, beta2=None, epsilon=None,
                 regularization=None, l2_decay=None, clip_global_norm=None):
        Optimizer.__init__(self, learning_rate, regularization, l2_decay, clip_global_norm)
        self.beta1 = None if beta1 is None else _unit("beta1", beta1)
        self.beta2 = None if beta2 is None else _unit("beta2", beta2)
        self.epsilon = None if epsilon is None else _positive("epsilon", epsilon)

    def _fill(self, config):
        if self.beta1 is not None:
            config.beta1 = self.beta1
        if self.beta2 is not None:
            config.beta2 = self.beta2
        if self.epsilon is not None:
            config.epsilon = self.epsilon


# Fluid-style aliases.
SGDOptimizer = SGD
MomentumOptimizer = Momentum
AdagradOptimizer = Adagrad
AdamOptimizer = Adam
