"""The core of the authoring package: programs, variables and the model builder.

A ``Model`` holds what the C++ ``tessera::ProgramBuilder`` holds (common/layers/
program_builder.h) -- a forward program (block 0) and a startup program that initializes its
parameters -- plus what a model file adds: feed bindings, the loss, the prediction, metrics and
the optimizer configuration. Layers (``tessera.layers``) append variables and ops to it exactly as
the C++ layers do, so that a model written in Python and the same model built in C++ give the
same ``tessera.ModelFile``: the same variable names (``prefix_N`` counters), shapes, dtypes and
flags, the same ops in the same order with the same attributes in the same order, the same
initializer ops and seeds.

Like Fluid, layers add to a default model; ``model_guard`` switches it::

    model = tessera.Model(random_seed=7)
    with tessera.model_guard(model):
        x = tessera.layers.data("x", shape=[-1, 13], feed="dense")
        ...

Shapes use -1 for the batch dimension. Not thread-safe.
"""

import contextlib
import operator

from google.protobuf import text_format

from tessera import initializer as _init
from tessera.proto import program_pb2
from tessera.proto import tensor_pb2

__all__ = [
    "DEFAULT_SEED", "FLOAT32", "FLOAT64", "INT64", "INT32", "REGISTERED_OPS", "Float64", "Model",
    "Program", "Variable", "convert_dtype", "default_main_program", "default_model",
    "default_startup_program", "dtype_name", "model_guard", "reset_default_model", "set_attr",
    "stable_hash", "shape_str",
]

# The program seed that replaces 0 (kDefaultSeed in program_builder.cc).
DEFAULT_SEED = 20260101

# StableHash: FNV-1a's prime with a nonstandard offset basis (the standard one is
# 14695981039346656037); kept by the C++ side because initial values derive from it.
HASH_OFFSET_BASIS = 1469598103934665603
HASH_PRIME = 1099511628211
_MASK64 = (1 << 64) - 1
SEED_MASK = 0x7FFFFFFFFFFFFFFF
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# Op roles (bit flags of the "op_role" attribute, common/framework/op_desc.h).
ROLE_FORWARD = 0
ROLE_BACKWARD = 1
ROLE_OPTIMIZE = 2
ROLE_RPC = 4
ROLE_DIST = 8
ROLE_LR_SCHED = 16
ROLE_LOSS = 256
OP_ROLE_ATTR = "op_role"
EMPTY_VAR_NAME = "@EMPTY@"
GRAD_SUFFIX = "@GRAD"

FLOAT32 = tensor_pb2.FLOAT32
FLOAT64 = tensor_pb2.FLOAT64
INT64 = tensor_pb2.INT64
INT32 = tensor_pb2.INT32

# Forward op types the C++ op registry (common/ops/*.cc) has kernels for. A model file that uses
# another op type is refused by the loader until the C++ side registers it (save_model warns).
# python/tests/test_examples.py checks every entry against `tessera_program --list_ops`.
REGISTERED_OPS = frozenset([
    "accuracy", "assign", "batch_norm", "cast", "concat", "conv2d", "dropout", "elementwise_add",
    "elementwise_mul", "elementwise_sub", "fill_constant", "fill_zeros_like", "flatten",
    "gaussian_random", "lookup_table", "lr_exponential_decay", "matmul", "mean", "mul", "pool2d",
    "reduce_mean", "reduce_sum", "relu", "reshape", "scale", "sequence_pool", "sigmoid", "sigmoid_cross_entropy_with_logits", "softmax_with_cross_entropy",
    "split", "square_error", "sum", "tanh", "uniform_random",
])

_DTYPE_NAMES = {FLOAT32: "float32", FLOAT64: "float64", INT64: "int64", INT32: "int32"}
_DTYPE_BY_NAME = {
    "float32": FLOAT32, "float": FLOAT32, "fp32": FLOAT32,
    "float64": FLOAT64, "double": FLOAT64, "fp64": FLOAT64,
    "int64": INT64, "long": INT64,
    "int32": INT32, "int": INT32,
}
FLOAT_DTYPES = (FLOAT32, FLOAT64)


def stable_hash(s):
    """The C++ StableHash of a name: FNV-1a over its UTF-8 bytes, offset 1469598103934665603."""
    data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    h = HASH_OFFSET_BASIS
    for c in data:
        h ^= c
        h = (h * HASH_PRIME) & _MASK64
    return h


def convert_dtype(dtype):
    """The DataType enum value of a dtype given as a name ("float32"), enum value or numpy dtype."""
    if isinstance(dtype, bool):
        raise TypeError("dtype must be a name such as 'float32', got %r" % (dtype,))
    if isinstance(dtype, int):
        if dtype in _DTYPE_NAMES:
            return dtype
        raise ValueError("unknown dtype %d (known: %s)" % (dtype, ", ".join(
            "%d=%s" % kv for kv in sorted(_DTYPE_NAMES.items()))))
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if name is None and isinstance(dtype, type):
        name = dtype.__name__
    if isinstance(name, str) and name.lower() in _DTYPE_BY_NAME:
        return _DTYPE_BY_NAME[name.lower()]
    raise ValueError("unknown dtype %r (use float32, float64, int64 or int32)" % (dtype,))


def dtype_name(dtype):
    """"float32", "float64", "int64" or "int32" for a DataType enum value (or name)."""
    return _DTYPE_NAMES[convert_dtype(dtype)]


def shape_str(shape):
    """A shape as the C++ ShapeString prints it: "[-1, 13]"."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _has_control_char(s):
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in s)


def check_name(what, name):
    """Raises ValueError unless `name` is a usable variable name (what the C++ loader accepts)."""
    if not isinstance(name, str):
        raise TypeError("%s name must be a str, got %r" % (what, name))
    if not name:
        raise ValueError("%s name is empty" % what)
    if _has_control_char(name):
        raise ValueError("%s name %r contains a control character" % (what, name))
    if name.endswith(GRAD_SUFFIX) or name == EMPTY_VAR_NAME:
        raise ValueError("%s name %r is reserved (gradients are named <var>%s)" %
                         (what, name, GRAD_SUFFIX))
    return name


def _check_int64(what, v):
    if isinstance(v, bool):
        raise TypeError("%s must be an int, got %r" % (what, v))
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError("%s must be an int, got %r" % (what, v))
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError("%s %d does not fit in int64" % (what, v))
    return v


def _to_float32(what, v):
    if isinstance(v, bool):
        raise TypeError("%s must be a number, got %r" % (what, v))
    try:
        return _init.float32(float(v))
    except (TypeError, ValueError):
        raise TypeError("%s must be a number, got %r" % (what, v))
    except OverflowError:
        raise ValueError("%s %r is out of float32 range" % (what, v))


class Float64(float):
    """A float attribute value to be stored as a double (the ``d`` field) instead of float32."""


def _attr_kind(name, value):
    """The OpDesc.Attr field a Python value goes into (C++ SetAttr overloads)."""
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "i"
    if isinstance(value, Float64):
        return "d"
    if isinstance(value, float):
        return "f"
    if isinstance(value, str):
        return "s"
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("attribute %r: an empty list needs an explicit kind" % name)
        if all(isinstance(x, str) for x in value):
            return "strings"
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return "ints"
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            return "floats"
    raise TypeError("attribute %r: unsupported value %r" % (name, value))


def set_attr(op, name, value, kind=None):
    """Sets attribute `name` of an OpDesc like C++ SetAttr: replaces it in place, else appends.

    `kind` is the oneof field: "i" (int64), "f" (float32), "d" (double), "b", "s", "ints",
    "floats", "strings" or "block"; None infers it from the Python type (int -> i, float -> f).
    """
    kind = kind or _attr_kind(name, value)
    attr = None
    for a in op.attrs:
        if a.name == name:
            attr = a
            attr.Clear()
            attr.name = name
            break
    if attr is None:
        attr = op.attrs.add()
        attr.name = name
    what = "attribute %r" % name
    if kind == "i":
        attr.i = _check_int64(what, value)
    elif kind == "f":
        attr.f = _to_float32(what, value)
    elif kind == "d":
        attr.d = float(value)
    elif kind == "b":
        attr.b = bool(value)
    elif kind == "s":
        if _has_control_char(value):
            raise ValueError("%s value %r contains a control character" % (what, value))
        attr.s = value
    elif kind == "ints":
        attr.ints.SetInParent()
        attr.ints.v.extend(_check_int64(what, v) for v in value)
    elif kind == "floats":
        attr.floats.SetInParent()
        attr.floats.v.extend(_to_float32(what, v) for v in value)
    elif kind == "strings":
        attr.strings.SetInParent()
        attr.strings.v.extend(value)
    elif kind == "block":
        attr.block = int(value)
    else:
        raise ValueError("attribute %r: unknown kind %r" % (name, kind))
    return attr


def get_attr(op, name, default=None):
    """The value of attribute `name` of an OpDesc (a list for list kinds), or `default`."""
    for a in op.attrs:
        if a.name == name:
            field = a.WhichOneof("value")
            if field in ("ints", "floats", "strings"):
                return list(getattr(a, field).v)
            return getattr(a, field) if field else default
    return default


def op_inputs(op, slot):
    """The arguments bound to input `slot` of an OpDesc (empty when absent)."""
    for s in op.inputs:
        if s.parameter == slot:
            return list(s.arguments)
    return []


def op_outputs(op, slot):
    """The arguments bound to output `slot` of an OpDesc (empty when absent)."""
    for s in op.outputs:
        if s.parameter == slot:
            return list(s.arguments)
    return []


def all_args(slots):
    """Every argument of a repeated OpDesc.Var field, in order."""
    return [a for s in slots for a in s.arguments]


def _set_slot(slots, slot, args):
    for s in slots:
        if s.parameter == slot:
            del s.arguments[:]
            s.arguments.extend(args)
            return
    s = slots.add()
    s.parameter = slot
    s.arguments.extend(args)


class Program(object):
    """A ProgramDesc with a root block (block 0), like ``fluid.Program``.

    ``desc`` is the underlying ``tessera.ProgramDesc`` message; variables are looked up through
    an index kept in step with it (modify the program through this class).
    """

    def __init__(self, desc=None):
        self.desc = desc if desc is not None else program_pb2.ProgramDesc()
        if not self.desc.blocks:
            block = self.desc.blocks.add()
            block.idx = 0
            block.parent_idx = -1
        self._index = {v.name: i for i, v in enumerate(self.block.vars)}

    @property
    def block(self):
        """Block 0 (a BlockDesc)."""
        return self.desc.blocks[0]

    @property
    def random_seed(self):
        """The program seed."""
        return self.desc.random_seed

    @random_seed.setter
    def random_seed(self, seed):
        self.desc.random_seed = _check_int64("random_seed", seed)

    @property
    def vars(self):
        """The VarDescs of block 0, in declaration order."""
        return self.block.vars

    @property
    def ops(self):
        """The OpDescs of block 0, in order."""
        return self.block.ops

    def find_var(self, name):
        """The VarDesc `name` of block 0, or None."""
        i = self._index.get(name)
        return None if i is None else self.block.vars[i]

    def declare_var(self, name, shape, dtype=FLOAT32):
        """Adds (or updates) VarDesc `name` with `shape` and `dtype` (C++ DeclareVar)."""
        v = self.find_var(name)
        if v is None:
            v = self.block.vars.add()
            v.name = name
            self._index[name] = len(self.block.vars) - 1
        del v.shape[:]
        v.shape.extend(int(d) for d in shape)
        v.dtype = dtype
        return v

    def add_op(self):
        """Appends an empty OpDesc to block 0 and returns it."""
        return self.block.ops.add()

    def clone(self):
        """A deep copy."""
        desc = program_pb2.ProgramDesc()
        desc.CopyFrom(self.desc)
        return Program(desc)

    def to_string(self):
        """The text format of the ProgramDesc."""
        return text_format.MessageToString(self.desc)

    __str__ = to_string


class Variable(object):
    """A variable of a model's forward program: a handle on its VarDesc.

    Layers take and return Variables. ``a + b``, ``a - b`` and ``a * b`` of two Variables are
    elementwise_add/sub/mul; with a number, ``scale``.
    """

    __slots__ = ("model", "name")

    def __init__(self, model, name):
        self.model = model
        self.name = name

    @property
    def desc(self):
        """The VarDesc in the forward program."""
        return self.model.main_program.find_var(self.name)

    @property
    def shape(self):
        """The shape as a tuple of ints (-1 for the batch dimension)."""
        return tuple(self.desc.shape)

    @property
    def dtype(self):
        """The dtype name ("float32", "int64", ...)."""
        return _DTYPE_NAMES[self.desc.dtype]

    @property
    def persistable(self):
        """True for parameters and other state that lives across steps."""
        return self.desc.persistable

    @property
    def trainable(self):
        """True for parameters that get a gradient."""
        return self.desc.trainable

    @property
    def stop_gradient(self):
        """True when no gradient flows into this variable (data inputs)."""
        return self.desc.stop_gradient

    @property
    def is_sparse(self):
        """True for embedding tables with sparse (SelectedRows) gradients."""
        return self.desc.is_sparse

    @property
    def is_distributed(self):
        """True for embedding tables that live only on the pservers."""
        return self.desc.is_distributed

    @property
    def is_parameter(self):
        """True for trainable parameters."""
        return self.desc.persistable and self.desc.trainable

    @property
    def is_data(self):
        """True for inputs declared with layers.data."""
        return self.name in self.model._data_vars

    @property
    def lod_level(self):
        """1 for a per-id tensor: one row per id of a multi-hot input, one sequence per example
        (a multi-hot slot declared with layers.data(..., lod_level=1), or its embedding); 0 for
        anything else (one row per example). Only embedding and sequence_pool take lod_level 1
        inputs.

        Only the Python side knows it (a VarDesc has no LoD): the model file says which inputs
        are multi-hot (MULTI_SLOT feeds) and the runner carries the sequences at run time.
        """
        return 1 if self.name in self.model._lod else 0

    @property
    def lod_source(self):
        """For a lod_level 1 variable, the name of the multi-hot input whose sequences its rows
        follow; None otherwise. Per-id tensors of different inputs have different row counts."""
        return self.model._lod.get(self.name)

    def __repr__(self):
        flags = [f for f in ("persistable", "trainable", "stop_gradient", "is_sparse",
                             "is_distributed") if getattr(self.desc, f)]
        if self.lod_level:
            flags.append("lod_level=1")
        return "Variable(%r, shape=%s, dtype=%s%s)" % (
            self.name, shape_str(self.shape), self.dtype,
            "".join(", " + f for f in flags))

    def _binary(self, other, op, reverse=False):
        from tessera import layers
        if isinstance(other, Variable):
            x, y = (other, self) if reverse else (self, other)
            return getattr(layers, "elementwise_" + op)(x, y)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            if op == "add":
                return layers.scale(self, 1.0, float(other))
            if op == "mul":
                return layers.scale(self, float(other))
            if op == "sub":
                return (layers.scale(self, -1.0, float(other)) if reverse else
                        layers.scale(self, 1.0, -float(other)))
        return NotImplemented

    def __add__(self, other):
        return self._binary(other, "add")

    def __radd__(self, other):
        return self._binary(other, "add", reverse=True)

    def __sub__(self, other):
        return self._binary(other, "sub")

    def __rsub__(self, other):
        return self._binary(other, "sub", reverse=True)

    def __mul__(self, other):
        return self._binary(other, "mul")

    def __rmul__(self, other):
        return self._binary(other, "mul", reverse=True)

    def __neg__(self):
        from tessera import layers
        return layers.scale(self, -1.0)


def _check_shape(what, shape, allow_batch=True):
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise TypeError("%s: shape must be a list of ints, got %r" % (what, shape))
    for i, d in enumerate(dims):
        if d == -1 and allow_batch:
            continue
        if d < 1:
            raise ValueError("%s: shape %s has dim %d at index %d; dims are >= 1%s" % (
                what, shape_str(dims), d, i, " or -1 (the batch)" if allow_batch else ""))
    return dims


class Model(object):
    """A model being written: the ProgramBuilder state plus what the model file records.

    ``main_program`` is the forward program (block 0), ``startup_program`` initializes its
    parameters. Methods mirror ``tessera::ProgramBuilder``: ``unique_name``, ``create_var``,
    ``create_parameter``, ``create_persistable``, ``append_op``, ``seed_for``.
    """

    def __init__(self, random_seed=0):
        seed = _check_int64("random_seed", random_seed)
        self.main_program = Program()
        self.startup_program = Program()
        self.main_program.random_seed = seed or DEFAULT_SEED
        self.startup_program.random_seed = self.main_program.random_seed
        self._counters = {}
        self._role = ROLE_FORWARD
        self._variables = {}
        self._data_vars = set()
        self._lod = {}           # lod_level 1 variable -> the multi-hot input its rows follow
        self._feeds = []         # tessera.io.Feed, in the order they were declared
        self.loss = None         # name of the minimized loss (optimizer.minimize)
        self.prediction = None   # name of the prediction (layers.auc / accuracy, save_model)
        self.metrics = []        # metric names (layers.auc / accuracy)
        self._metric_labels = {}  # metric -> label variable it was declared with
        self.optimizer = None    # tessera.OptimizerConfig (optimizer.minimize)
        self.table_optimizers = {}  # table -> its own OptimizerConfig (ParamAttr optimizer)

    # -- programs -------------------------------------------------------------------------

    @property
    def random_seed(self):
        """The program seed (DEFAULT_SEED when created with 0); it seeds every initializer."""
        return self.main_program.random_seed

    @random_seed.setter
    def random_seed(self, seed):
        seed = _check_int64("random_seed", seed)
        if any(v.persistable for v in self.main_program.vars):
            raise ValueError("random_seed must be set before the first parameter is created "
                             "(initializer seeds derive from it)")
        self.main_program.random_seed = seed or DEFAULT_SEED
        self.startup_program.random_seed = self.main_program.random_seed

    def unique_name(self, prefix):
        """"prefix_0", "prefix_1", ... unique within this model (C++ UniqueName)."""
        n = self._counters.get(prefix, 0)
        self._counters[prefix] = n + 1
        return "%s_%d" % (prefix, n)

    def peek_unique_name(self, prefix):
        """The name the next unique_name(prefix) returns, without consuming it."""
        return "%s_%d" % (prefix, self._counters.get(prefix, 0))

    def has_var(self, name):
        """True if the forward program declares `name`."""
        return self.main_program.find_var(name) is not None

    def var(self, name):
        """The Variable `name` of the forward program (ValueError if undeclared)."""
        if isinstance(name, Variable):
            if name.model is not self:
                raise ValueError("variable %r belongs to another model" % name.name)
            return name
        if not self.has_var(name):
            raise ValueError("variable %r is not declared in this model" % (name,))
        v = self._variables.get(name)
        if v is None:
            v = self._variables[name] = Variable(self, name)
        return v

    def variables(self):
        """Every Variable of the forward program, in declaration order."""
        return [self.var(v.name) for v in self.main_program.vars]

    def parameters(self):
        """The trainable parameters, in declaration order."""
        return [self.var(v.name) for v in self.main_program.vars
                if v.persistable and v.trainable]

    def _check_new(self, name):
        check_name("variable", name)
        if self.has_var(name):
            raise ValueError("variable %r already exists" % name)

    def create_var(self, name, shape, dtype=FLOAT32):
        """A temporary (non-persistable) variable of the forward program (C++ CreateVar)."""
        self._check_new(name)
        shape = _check_shape("variable %r" % name, shape)
        self.main_program.declare_var(name, shape, convert_dtype(dtype))
        return self.var(name)

    def seed_for(self, var_name):
        """The uint64 seed of the initializer of `var_name`: StableHash(name) ^ program seed."""
        return stable_hash(var_name) ^ (self.main_program.random_seed & _MASK64)

    def create_parameter(self, name, shape, initializer=None, dtype=FLOAT32):
        """A trainable parameter, initialized in startup (C++ CreateParameter; default Xavier)."""
        self._check_new(name)
        shape = _check_shape("parameter %r" % name, shape, allow_batch=False)
        dtype = convert_dtype(dtype)
        init = initializer if initializer is not None else _init.Xavier()
        if not isinstance(init, _init.Initializer):
            raise TypeError("parameter %r: initializer must be a tessera.initializer."
                            "Initializer, got %r" % (name, init))
        v = self.main_program.declare_var(name, shape, dtype)
        v.persistable = True
        v.trainable = True
        self.startup_program.declare_var(name, shape, dtype).persistable = True

        op = self.startup_program.add_op()
        if init.kind == _init.CONSTANT:
            op.type = "fill_constant"
            _set_slot(op.outputs, "Out", [name])
            set_attr(op, "value", init.a, "f")
        elif init.kind == _init.GAUSSIAN:
            op.type = "gaussian_random"
            _set_slot(op.outputs, "Out", [name])
            set_attr(op, "mean", init.a, "f")
            set_attr(op, "std", init.b, "f")
        else:
            lo, hi = init.a, init.b
            if init.kind == _init.XAVIER_UNIFORM:
                hi = _init.xavier_bound(shape)
                lo = -hi
            op.type = "uniform_random"
            _set_slot(op.outputs, "Out", [name])
            set_attr(op, "min", lo, "f")
            set_attr(op, "max", hi, "f")
        set_attr(op, "shape", shape, "ints")
        set_attr(op, "dtype", int(dtype), "i")
        if init.kind != _init.CONSTANT:
            set_attr(op, "seed", self.seed_for(name) & SEED_MASK, "i")
        return self.var(name)

    def create_persistable(self, name, shape, value, dtype=FLOAT32):
        """A persistable, non-trainable variable filled with `value` by startup."""
        self._check_new(name)
        shape = _check_shape("persistable %r" % name, shape, allow_batch=False)
        dtype = convert_dtype(dtype)
        self.main_program.declare_var(name, shape, dtype).persistable = True
        self.startup_program.declare_var(name, shape, dtype).persistable = True
        op = self.startup_program.add_op()
        op.type = "fill_constant"
        _set_slot(op.outputs, "Out", [name])
        set_attr(op, "shape", shape, "ints")
        set_attr(op, "value", value, "f")
        set_attr(op, "dtype", int(dtype), "i")
        return self.var(name)

    def _arg_names(self, what, args):
        if isinstance(args, (Variable, str)):
            args = [args]
        names = []
        for a in args:
            if isinstance(a, Variable):
                if a.model is not self:
                    raise ValueError("%s: variable %r belongs to another model" % (what, a.name))
                names.append(a.name)
            elif isinstance(a, str):
                if a != EMPTY_VAR_NAME and not self.has_var(a):
                    raise ValueError("%s: variable %r is not declared" % (what, a))
                names.append(a)
            else:
                raise TypeError("%s: expected a Variable or a name, got %r" % (what, a))
        return names

    def append_op(self, type, inputs=(), outputs=(), attrs=()):
        """Appends an op to the forward program with the op_role attribute first; returns it.

        `inputs` / `outputs`: (slot, variables) pairs or a dict; variables are Variables or
        names, one or a list. `attrs`: (name, value) or (name, value, kind) entries, set after
        op_role in order (see set_attr for kinds).
        """
        if not isinstance(type, str) or not type or _has_control_char(type):
            raise ValueError("op type must be a non-empty printable str, got %r" % (type,))
        slots = []
        for side, pairs in (("input", inputs), ("output", outputs)):
            items = pairs.items() if isinstance(pairs, dict) else pairs
            resolved = []
            for slot, args in items:
                resolved.append((slot, self._arg_names("%s %s %s" % (type, side, slot), args)))
            slots.append(resolved)
        attr_list = []
        for entry in attrs.items() if isinstance(attrs, dict) else attrs:
            name, value = entry[0], entry[1]
            kind = entry[2] if len(entry) > 2 else None
            attr_list.append((name, value, kind or _attr_kind(name, value)))

        op = self.main_program.add_op()
        op.type = type
        for slot, args in slots[0]:
            _set_slot(op.inputs, slot, args)
        for slot, args in slots[1]:
            _set_slot(op.outputs, slot, args)
        set_attr(op, OP_ROLE_ATTR, self._role, "i")
        for name, value, kind in attr_list:
            set_attr(op, name, value, kind)
        return op

    def writer_of(self, name):
        """The index of the last forward op that writes `name`, or None."""
        found = None
        for i, op in enumerate(self.main_program.ops):
            if name in all_args(op.outputs):
                found = i
        return found

    # -- the model file ---------------------------------------------------------------------

    def bind_feed(self, var, source, slot=None, id_modulo=None):
        """Binds data variable `var` to a data column: source "dense", "slot", "multi_slot" or
        "label" (a "multi_slot" feed needs a variable declared with lod_level=1)."""
        from tessera import io
        feed = io.Feed(var, source, slot=slot, id_modulo=id_modulo)
        name = feed.var_name
        if not self.has_var(name) or name not in self._data_vars:
            raise ValueError("feed %r: only variables declared with layers.data can be fed" % name)
        for f in self._feeds:
            if f.var_name == name:
                raise ValueError("feed %r is already bound (%s)" % (name, f))
            if f.source == feed.source and f.slot is not None and f.slot == feed.slot:
                raise ValueError("feed %r: %s %d is already bound to %r" %
                                 (name, feed.source, feed.slot, f.var_name))
        io.check_feed_lod(self, feed)
        self._feeds.append(feed)
        return feed

    def set_outputs(self, prediction=None, metrics=None):
        """Sets the prediction (a [-1, 1] probability Variable) and/or the metric names."""
        if prediction is not None:
            self.prediction = self.var(prediction).name
        if metrics is not None:
            if isinstance(metrics, str):
                raise TypeError("metrics must be a list of names, got the str %r" % metrics)
            self.metrics = list(metrics)

    @property
    def feeds(self):
        """The feed bindings declared so far (tessera.io.Feed), in declaration order."""
        return list(self._feeds)

    def to_proto(self, **kwargs):
        """The validated tessera.ModelFile message (arguments as tessera.save_model)."""
        from tessera import io
        return io.build_model_file(self, **kwargs)

    def save(self, path, **kwargs):
        """Writes the model file to `path` (tessera.save_model with this model)."""
        from tessera import io
        return io.save_model(path, model=self, **kwargs)


_default_model = [None]


def default_model():
    """The model layers add to when their inputs do not name one (created on first use)."""
    if _default_model[0] is None:
        _default_model[0] = Model()
    return _default_model[0]


def reset_default_model(random_seed=0):
    """Replaces the default model by a new, empty one and returns it."""
    _default_model[0] = Model(random_seed)
    return _default_model[0]


def default_main_program():
    """The forward program of the default model (like fluid.default_main_program)."""
    return default_model().main_program


def default_startup_program():
    """The startup program of the default model (like fluid.default_startup_program)."""
    return default_model().startup_program


@contextlib.contextmanager
def model_guard(model):
    """Makes `model` the default model inside a ``with`` block (like fluid.program_guard)."""
    if not isinstance(model, Model):
        raise TypeError("model_guard needs a tessera.Model, got %r" % (model,))
    saved = _default_model[0]
    _default_model[0] = model
    try:
        yield model
    finally:
        _default_model[0] = saved
