"""Parameter initializers, as the startup program runs them (mirrors ``tessera::Initializer``).

Each initializer becomes one op of the startup program (see ``Model.create_parameter``):

* ``Constant(value)``      -> ``fill_constant``   attrs value, shape, dtype
* ``Uniform(low, high)``   -> ``uniform_random``  attrs min, max, shape, dtype, seed
* ``Normal(loc, scale)``   -> ``gaussian_random`` attrs mean, std, shape, dtype, seed
* ``Xavier()``             -> ``uniform_random`` with bounds +-sqrt(6 / (fan_in + fan_out)),
  fan_in = the first dim, fan_out = the product of the others (computed in double precision,
  then rounded to float32, as the C++ builder does).

Seeds derive from the program seed and the parameter's name (``Model.seed_for``), so a
parameter's initial value does not depend on the order layers were added.
"""

import math
import struct

__all__ = [
    "Initializer", "Constant", "Uniform", "Normal", "Gaussian", "Xavier",
    "ConstantInitializer", "UniformInitializer", "NormalInitializer", "XavierInitializer",
    "float32", "xavier_bound",
]

# Kinds, as tessera::Initializer::Kind.
CONSTANT = "constant"
UNIFORM = "uniform"
GAUSSIAN = "gaussian"
XAVIER_UNIFORM = "xavier_uniform"


def float32(x):
    """Rounds a Python float to the nearest float32 value (what a proto float field stores)."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def _finite(what, x):
    x = float(x)
    if not math.isfinite(x):
        raise ValueError("%s must be finite, got %r" % (what, x))
    return x


def xavier_bound(shape):
    """The float32 Xavier-uniform bound sqrt(6 / (fan_in + fan_out)) of a parameter shape."""
    shape = [int(d) for d in shape]
    fan_in = float(shape[0]) if shape else 1.0
    if len(shape) < 2:
        fan_out = 1.0
    else:
        numel = 1
        for d in shape:
            numel *= d
        fan_out = float(numel) / fan_in
    return float32(math.sqrt(6.0 / (fan_in + fan_out)))


class Initializer(object):
    """Base class: ``kind`` and the two float32 parameters ``a`` and ``b`` of the C++ struct."""

    kind = None

    def __init__(self, a=0.0, b=0.0):
        self.a = float32(a)
        self.b = float32(b)

    def __eq__(self, other):
        return (type(self) is type(other) and self.kind == other.kind and self.a == other.a and
                self.b == other.b)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((self.kind, self.a, self.b))


class Constant(Initializer):
    """Every element equal to ``value``."""

    kind = CONSTANT

    def __init__(self, value=0.0):
        Initializer.__init__(self, _finite("Constant value", value), 0.0)

    @property
    def value(self):
        """The constant (float32)."""
        return self.a

    def __repr__(self):
        return "Constant(%r)" % self.a


class Uniform(Initializer):
    """Uniform in [low, high)."""

    kind = UNIFORM

    def __init__(self, low=-1.0, high=1.0):
        low = _finite("Uniform low", low)
        high = _finite("Uniform high", high)
        if low > high:
            raise ValueError("Uniform: low %r > high %r" % (low, high))
        Initializer.__init__(self, low, high)

    @property
    def low(self):
        """Lower bound (float32)."""
        return self.a

    @property
    def high(self):
        """Upper bound (float32)."""
        return self.b

    def __repr__(self):
        return "Uniform(%r, %r)" % (self.a, self.b)


class Normal(Initializer):
    """Gaussian with mean ``loc`` and standard deviation ``scale``."""

    kind = GAUSSIAN

    def __init__(self, loc=0.0, scale=1.0):
        loc = _finite("Normal loc", loc)
        scale = _finite("Normal scale", scale)
        if scale < 0:
            raise ValueError("Normal: scale %r < 0" % scale)
        Initializer.__init__(self, loc, scale)

    @property
    def loc(self):
        """Mean (float32)."""
        return self.a

    @property
    def scale(self):
        """Standard deviation (float32)."""
        return self.b

    def __repr__(self):
        return "Normal(%r, %r)" % (self.a, self.b)


class Xavier(Initializer):
    """Xavier (Glorot) uniform: bounds +-sqrt(6 / (fan_in + fan_out)) from the shape."""

    kind = XAVIER_UNIFORM

    def __init__(self, uniform=True):
        if not uniform:
            raise ValueError("Xavier: only the uniform variant exists (uniform=True)")
        Initializer.__init__(self, 0.0, 0.0)

    def __repr__(self):
        return "Xavier()"


# Fluid-style aliases.
Gaussian = Normal
ConstantInitializer = Constant
UniformInitializer = Uniform
NormalInitializer = Normal
XavierInitializer = Xavier
