"""Layers: functions that append the forward ops of model pieces and return the output Variable.

Each mirrors its C++ counterpart in common/layers/layers.cc where there is one (Data, Fc,
Embedding, Relu/Sigmoid/Tanh, ElementwiseAdd/Mul, Scale, Concat, Reshape, Cast, Mean,
SquareError, SoftmaxWithCrossEntropy, SigmoidCrossEntropyWithLogits, Conv2d, Pool2d, Flatten,
BatchNorm): the same variable names
(``<type>.out_N`` temporaries, ``<prefix>.w`` / ``.b`` parameters), shapes, ops and attributes in
the same order (``op_role`` first). Names and arguments follow Fluid (``fluid.layers``).

Shapes are checked as layers are added; a mismatch raises ValueError naming the layer, e.g.
``elementwise_add: shapes [-1, 8] and [-1, 4] do not broadcast ...``. A layer that raises leaves
the model unchanged.

Multi-hot slots (a list of ids per example) are inputs with ``lod_level=1``: a [-1, 1] int64
variable holding every id of the batch, one sequence per example. Their embedding keeps the
sequences (one row per id, ``lod_level`` 1) and ``sequence_pool`` pools each sequence into one
row per example. Layers track ``Variable.lod_level``. As in the runners, where lookup_table is
the one op that keeps the sequences, ``embedding`` and ``sequence_pool`` are the only layers
that take a per-id (lod_level 1) tensor: any other layer -- in particular one that would mix it
with a per-example tensor (concat, elementwise_*, a loss, ...) -- raises ValueError naming the
layer ("pool it with sequence_pool first").

``accuracy`` and ``auc`` add no ops: they declare metrics of the model file, which the trainer
computes from the prediction on held-out data (accuracy: the top-1 class of a [-1, C] prediction,
or a [-1, 1] probability rounded at 0.5).
"""

import collections
import math
import operator

from tessera import framework as fw
from tessera import initializer as _init
from tessera.framework import Variable, shape_str
from tessera.param_attr import ParamAttr

__all__ = [
    "Metric", "accuracy", "auc", "batch_norm", "cast", "concat", "conv2d", "create_parameter",
    "data", "dot", "dropout", "flatten", "pool2d",
    "elementwise_add", "elementwise_mul", "elementwise_sub", "embedding", "exponential_decay",
    "fc", "matmul", "mean", "reduce_mean", "reduce_sum", "relu", "reshape", "scale",
    "sequence_pool", "sigmoid", "sigmoid_cross_entropy_with_logits", "softmax_with_cross_entropy",
    "square_error_cost", "sums", "tanh",
]

ACTIVATIONS = ("relu", "sigmoid", "tanh")

# The default initializer of embedding tables (EmbeddingOptions::init).
EMBEDDING_INIT = (-0.05, 0.05)


# -- helpers ---------------------------------------------------------------------------------

def _model_of(layer, *xs):
    """The model the inputs belong to (the default model when none is a Variable)."""
    models = []
    for x in xs:
        if isinstance(x, Variable) and all(x.model is not m for m in models):
            models.append(x.model)
    if len(models) > 1:
        raise ValueError("%s: inputs belong to different models" % layer)
    return models[0] if models else fw.default_model()


def _var(model, layer, x, what="input"):
    """`x` (a Variable or a name) as a Variable of `model`."""
    if isinstance(x, Variable):
        if x.model is not model:
            raise ValueError("%s: %s %r belongs to another model" % (layer, what, x.name))
        return x
    if isinstance(x, str):
        if not model.has_var(x):
            raise ValueError("%s: %s %r is not a variable of the model" % (layer, what, x))
        return model.var(x)
    raise TypeError("%s: %s must be a Variable or a name, got %r" % (layer, what, x))


def _desc(v):
    return "%r %s %s" % (v.name, v.dtype, shape_str(v.shape))


def _check_float(layer, v, what="input"):
    if fw.convert_dtype(v.dtype) not in fw.FLOAT_DTYPES:
        raise ValueError("%s: %s %s must be float32 or float64" % (layer, what, _desc(v)))


def _same_shape(a, b):
    return tuple(a) == tuple(b)


def _out_name(model, layer, name, prefix):
    """`name` if given (checked to be new), else the next unique name of `prefix`."""
    if name is None:
        candidate = model.peek_unique_name(prefix)
    else:
        candidate = fw.check_name(layer + " output", name)
    if model.has_var(candidate):
        raise ValueError("%s: variable %r already exists" % (layer, candidate))
    return candidate


def _take_name(model, name, prefix):
    return name if name is not None else model.unique_name(prefix)


def _int(layer, what, v, minimum=None):
    if isinstance(v, bool):
        raise TypeError("%s: %s must be an int, got %r" % (layer, what, v))
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError("%s: %s must be an int, got %r" % (layer, what, v))
    if minimum is not None and v < minimum:
        raise ValueError("%s: %s %d < %d" % (layer, what, v, minimum))
    return v


def _normalize_axis(layer, axis, rank):
    axis = _int(layer, "axis", axis)
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ValueError("%s: axis %d is out of range for rank %d" % (layer, axis, rank))
    return a


def _per_example(layer, inputs):
    """Raises ValueError if one of `inputs` ((what, Variable) pairs) is per id (lod_level 1).

    Only embedding and sequence_pool take per-id tensors: the runners keep a multi-hot slot's
    sequences through lookup_table alone, so any other op would either mix one row per id with
    one row per example or lose the sequences sequence_pool needs.
    """
    per_id = [(what, v) for what, v in inputs if v.lod_level]
    if not per_id:
        return
    what1, v1 = per_id[0]
    for what, v in inputs:
        if not v.lod_level and len(v.shape) >= 1 and v.shape[0] == -1:
            raise ValueError(
                "%s: %s %r is per id (lod_level 1: one row per id of multi-hot input %r) but %s "
                "%r is per example (lod_level 0); pool it with sequence_pool first" %
                (layer, what1, v1.name, v1.lod_source, what, v.name))
    raise ValueError(
        "%s: %s %r is per id (lod_level 1: one row per id of multi-hot input %r); only "
        "embedding and sequence_pool take per-id tensors: pool it with sequence_pool first" %
        (layer, what1, v1.name, v1.lod_source))


def _unary(layer, op_type, x, name=None, attrs=()):
    """One-input one-output op whose output has the input's shape and dtype (C++ Unary)."""
    model = _model_of(layer, x)
    x = _var(model, layer, x)
    _check_float(layer, x)
    _per_example(layer, [("x", x)])
    _out_name(model, layer, name, op_type + ".out")
    out = model.create_var(_take_name(model, name, op_type + ".out"), x.shape, x.dtype)
    model.append_op(op_type, [("X", [x])], [("Out", [out])], attrs)
    return out


# -- inputs ----------------------------------------------------------------------------------

def data(name, shape, dtype="float32", feed=None, slot=None, id_modulo=None, lod_level=None,
         model=None):
    """An input the trainer feeds (stop_gradient); optionally bound to a data column.

    feed: "dense" (all dense features, float32 [-1, N]), "label" ([-1, 1]), "slot" or
    "multi_slot". `slot=k` binds categorical slot k (int64 [-1, 1]) and implies feed="slot";
    with lod_level=1 it binds multi-hot slot k instead (0-based among the multi-hot columns) and
    implies feed="multi_slot". id_modulo: see tessera.Feed (None: the row count of the local
    tables the ids index, 0 if distributed).

    lod_level (Fluid's name): 1 declares a multi-hot input, an int64 [-1, 1] variable holding
    every id of the batch concatenated, one sequence per example (possibly empty); embed it
    (rows stay per id) and pool it with sequence_pool. 0 (the default unless feed="multi_slot")
    is one row per example.
    """
    model = model if model is not None else fw.default_model()
    layer = "data %r" % (name,)
    fw.check_name("data", name)
    if model.has_var(name):
        raise ValueError("%s: variable %r already exists" % (layer, name))
    dims = fw._check_shape(layer, shape)
    dtype = fw.convert_dtype(dtype)
    from tessera import io
    if isinstance(feed, str) and feed.lower() == io.MULTI_SLOT and lod_level is None:
        lod_level = 1
    lod_level = 0 if lod_level is None else _int(layer, "lod_level", lod_level)
    if lod_level not in (0, 1):
        raise ValueError("%s: lod_level %d is not supported (0: one row per example, 1: a "
                         "multi-hot input, one sequence of ids per example)" % (layer, lod_level))
    if lod_level == 1 and (dtype != fw.INT64 or dims != [-1, 1]):
        raise ValueError("%s: a lod_level 1 input is a multi-hot slot's ids, int64 [-1, 1]; got "
                         "%s %s" % (layer, fw.dtype_name(dtype), shape_str(dims)))
    if slot is not None and feed is None:
        feed = io.MULTI_SLOT if lod_level == 1 else io.SLOT
    feed_spec = None
    if feed is not None:
        feed_spec = io.Feed(name, feed, slot=slot, id_modulo=id_modulo)
        if feed_spec.source == io.MULTI_SLOT and lod_level != 1:
            raise ValueError("%s: a multi_slot feed is a lod_level 1 input (lod_level=%d given)"
                             % (layer, lod_level))
        if feed_spec.source != io.MULTI_SLOT and lod_level != 0:
            raise ValueError("%s: a lod_level 1 input is fed by a multi-hot slot (slot=k, or "
                             "feed='multi_slot'), not a %s feed" % (layer, feed_spec.source))
        for f in model.feeds:
            if f.source == feed_spec.source and f.source not in io.SLOT_SOURCES:
                raise ValueError("%s: the model already has a %s feed (%r)" %
                                 (layer, f.source, f.var_name))
            if f.source == feed_spec.source and f.slot == slot:
                raise ValueError("%s: %s %d is already bound to %r" % (
                    layer, "slot" if f.source == io.SLOT else "multi-hot slot", slot,
                    f.var_name))
        want = {io.DENSE: ("float32 [-1, N]", dtype == fw.FLOAT32 and len(dims) == 2 and
                           dims[0] == -1 and dims[1] >= 1),
                io.SLOT: ("int64 [-1, 1]", dtype == fw.INT64 and dims == [-1, 1]),
                io.MULTI_SLOT: ("int64 [-1, 1]", dtype == fw.INT64 and dims == [-1, 1]),
                io.LABEL: ("float32, float64 or int64 [-1, 1]",
                           dtype in (fw.FLOAT32, fw.FLOAT64, fw.INT64) and dims == [-1, 1])}
        desc, ok = want[feed_spec.source]
        if not ok:
            raise ValueError("%s: a %s feed must be %s, got %s %s" % (
                layer, feed_spec.source, desc, fw.dtype_name(dtype), shape_str(dims)))
    elif id_modulo is not None:
        raise ValueError("%s: id_modulo goes with slot=" % layer)
    v = model.create_var(name, dims, dtype)
    v.desc.stop_gradient = True
    model._data_vars.add(name)
    if lod_level:
        model._lod[name] = name
    if feed_spec is not None:
        model._feeds.append(feed_spec)
    return v


# -- parameters layers -----------------------------------------------------------------------

def _weight_layer_attrs(layer, act, param_attr, bias_attr):
    """The checked (weight attr, bias attr, use bias) of a layer with .w/.b parameters (fc,
    conv2d): its act is known, its parameters are named by name= and take no optimizer."""
    if act not in (None, "") and act not in ACTIVATIONS:
        raise ValueError("%s: unknown act %r (use %s)" % (layer, act, ", ".join(ACTIVATIONS)))
    w_attr = ParamAttr.to_attr(param_attr)
    if w_attr.name is not None:
        raise ValueError("%s: name the parameters with name= (the prefix of .w/.b), not "
                         "param_attr.name" % layer)
    use_bias = bias_attr is not False
    b_attr = ParamAttr.to_attr(None if bias_attr in (None, True, False) else bias_attr)
    if b_attr.name is not None:
        raise ValueError("%s: name the parameters with name=, not bias_attr.name" % layer)
    if w_attr.optimizer is not None or b_attr.optimizer is not None:
        raise ValueError("%s: only embedding tables take an optimizer of their own" % layer)
    return w_attr, b_attr, use_bias


def _claim_names(model, layer, prefix, names, bias_names, act):
    """Raises unless the variables a layer of `prefix` declares are all new."""
    for n in list(names) + list(bias_names):
        if model.has_var(n):
            raise ValueError("%s: variable %r already exists (name %r is taken)" %
                             (layer, n, prefix))
    if act:
        _out_name(model, layer, None, act + ".out")


def fc(input, size, act=None, name=None, param_attr=None, bias_attr=None):
    """out = act(input . W + b): input [-1, K...] (flattened after dim 0) -> [-1, size].

    name: the parameter prefix (``<name>.w``, ``<name>.b``; default ``fc_N``). param_attr /
    bias_attr: a ParamAttr or Initializer for W (default Xavier) / b (default 0); bias_attr=False
    drops the bias. act: None, "relu", "sigmoid" or "tanh".
    """
    model = _model_of("fc", input)
    prefix = name if name is not None else model.peek_unique_name("fc")
    layer = "fc %r" % prefix
    x = _var(model, layer, input)
    _per_example(layer, [("input", x)])
    size = _int(layer, "size", size, minimum=1)
    in_shape = list(x.shape)
    if len(in_shape) < 2:
        raise ValueError("%s: input %s has %d dims; fc needs [batch, features...] (>= 2 dims)" %
                         (layer, _desc(x), len(in_shape)))
    if any(d < 1 for d in in_shape[1:]):
        raise ValueError("%s: input %s has an unknown (-1) dim after the batch dim; fc needs "
                         "known feature dims" % (layer, _desc(x)))
    _check_float(layer, x)
    w_attr, b_attr, use_bias = _weight_layer_attrs(layer, act, param_attr, bias_attr)
    if name is not None:
        fw.check_name("fc", name)
    k = 1
    for d in in_shape[1:]:
        k *= d
    w_name, mul_name = prefix + ".w", prefix + ".mul"
    b_name, pre_name = prefix + ".b", prefix + ".pre_act"
    _claim_names(model, layer, prefix, [w_name, mul_name], [b_name, pre_name] if use_bias else [],
                 act)

    if name is None:
        model.unique_name("fc")
    dtype = x.dtype
    w = model.create_parameter(w_name, [k, size], w_attr.initializer or _init.Xavier(), dtype)
    out_shape = [in_shape[0], size]
    mul_out = model.create_var(mul_name, out_shape, dtype)
    model.append_op("mul", [("X", [x]), ("Y", [w])], [("Out", [mul_out])],
                    [("x_num_col_dims", 1, "i")])
    out = mul_out
    if use_bias:
        b = model.create_parameter(b_name, [size], b_attr.initializer or _init.Constant(0.0),
                                   dtype)
        out = model.create_var(pre_name, out_shape, dtype)
        model.append_op("elementwise_add", [("X", [mul_out]), ("Y", [b])], [("Out", [out])],
                        [("axis", 1, "i")])
    if act:
        return _unary(layer, act, out)
    return out


def create_parameter(shape, dtype="float32", name=None, attr=None, default_initializer=None,
                     model=None):
    """A trainable parameter of `shape` (dims >= 1); default initializer Xavier.

    name / attr.name: its name (default ``param_N``); attr.initializer overrides
    default_initializer.
    """
    model = model if model is not None else fw.default_model()
    attr = ParamAttr.to_attr(attr)
    if name is not None and attr.name is not None and name != attr.name:
        raise ValueError("create_parameter: name %r and attr.name %r differ" % (name, attr.name))
    if attr.optimizer is not None:
        raise ValueError("create_parameter: only embedding tables take an optimizer of their own")
    name = name if name is not None else attr.name
    label = name if name is not None else model.peek_unique_name("param")
    layer = "create_parameter %r" % label
    dims = fw._check_shape(layer, shape, allow_batch=False)
    if not dims:
        raise ValueError("%s: shape is empty" % layer)
    if name is not None:
        fw.check_name("parameter", name)
        if model.has_var(name):
            raise ValueError("%s: variable %r already exists" % (layer, name))
    init = attr.initializer or default_initializer or _init.Xavier()
    return model.create_parameter(_take_name(model, name, "param"), dims, init, dtype)


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, name=None, dtype="float32"):
    """Looks up rows of a [rows, dim] table: ids [-1, 1] int64 -> [-1, dim].

    The output has the ids' lod_level: the ids of a multi-hot slot (lod_level 1) give one row
    per id, in the same sequences (pool them with sequence_pool).

    size: [rows, dim] (rows is only a hint for a distributed table). name / param_attr.name:
    the table name (default ``embedding_N``); a table of that name that already exists with
    the same shape is shared. is_distributed: the table lives on the pservers (implies
    is_sparse). padding_idx: an id whose rows are zeros (None: none). Default initializer
    Uniform(-0.05, 0.05).
    """
    model = _model_of("embedding", input)
    attr = ParamAttr.to_attr(param_attr)
    if name is not None and attr.name is not None and name != attr.name:
        raise ValueError("embedding: name %r and param_attr.name %r differ" % (name, attr.name))
    table_name = name if name is not None else attr.name
    label = table_name if table_name is not None else model.peek_unique_name("embedding")
    layer = "embedding %r" % label
    ids = _var(model, layer, input, "ids")
    if not isinstance(size, (list, tuple)) or len(size) != 2:
        raise ValueError("%s: size must be [rows, dim], got %r" % (layer, size))
    rows = _int(layer, "rows", size[0])
    dim = _int(layer, "dim", size[1])
    if rows < 1:
        raise ValueError("%s: rows %d < 1" % (layer, rows))
    if dim < 1:
        raise ValueError("%s: dim %d < 1" % (layer, dim))
    if fw.convert_dtype(ids.dtype) != fw.INT64:
        raise ValueError("%s: ids %s must be int64" % (layer, _desc(ids)))
    ids_shape = list(ids.shape)
    if not ids_shape:
        raise ValueError("%s: ids %s must have a batch dim" % (layer, _desc(ids)))
    if padding_idx is None:
        padding_idx = -1
    else:
        padding_idx = _int(layer, "padding_idx", padding_idx)
        if not 0 <= padding_idx < rows:
            raise ValueError("%s: padding_idx %d is outside [0, %d)" % (layer, padding_idx, rows))
    dtype = fw.convert_dtype(dtype)
    if dtype not in fw.FLOAT_DTYPES:
        raise ValueError("%s: table dtype must be float32 or float64" % layer)
    is_sparse = bool(is_sparse) or bool(is_distributed)
    is_distributed = bool(is_distributed)
    init = attr.initializer or _init.Uniform(*EMBEDDING_INIT)

    shared = table_name is not None and model.has_var(table_name)
    if shared:
        t = model.var(table_name)
        if not t.is_parameter or list(t.shape) != [rows, dim] or t.desc.dtype != dtype:
            raise ValueError("%s: variable %r exists as %s; a shared table must be a [%d, %d] "
                             "%s parameter" % (layer, table_name, _desc(t), rows, dim,
                                               fw.dtype_name(dtype)))
        if t.is_sparse != is_sparse or t.is_distributed != is_distributed:
            raise ValueError("%s: shared table %r has is_sparse=%s, is_distributed=%s" %
                             (layer, table_name, t.is_sparse, t.is_distributed))
    elif table_name is not None:
        fw.check_name("embedding", table_name)
    label_table = table_name if table_name is not None else label
    _out_name(model, layer, None, label_table + ".out")

    if table_name is None:
        table_name = model.unique_name("embedding")
    if not shared:
        w = model.create_parameter(table_name, [rows, dim], init, dtype)
        w.desc.is_sparse = is_sparse
        w.desc.is_distributed = is_distributed
    if attr.optimizer is not None:
        own = attr.optimizer.table_config(table_name)
        if model.optimizer is not None:
            raise ValueError("%s: give tables their optimizers before optimizer.minimize" % layer)
        if own.type == "momentum" and is_distributed:
            raise ValueError("%s: momentum cannot update distributed table %r (distributed "
                             "tables support sgd, adagrad and adam)" % (layer, table_name))
        previous = model.table_optimizers.get(table_name)
        if previous is not None and previous != own:
            raise ValueError("%s: shared table %r already has optimizer %s" %
                             (layer, table_name, previous.type))
        model.table_optimizers[table_name] = own
    # lookup_table drops a trailing 1 of the ids' shape and appends dim.
    out_shape = ids_shape[:-1] if len(ids_shape) > 1 and ids_shape[-1] == 1 else ids_shape
    out = model.create_var(model.unique_name(table_name + ".out"), out_shape + [dim], dtype)
    model.append_op("lookup_table", [("W", [table_name]), ("Ids", [ids])], [("Out", [out])],
                    [("is_sparse", is_sparse, "b"), ("is_distributed", is_distributed, "b"),
                     ("padding_idx", padding_idx, "i")])
    if ids.lod_level:
        model._lod[out.name] = ids.lod_source  # lookup_table keeps the ids' sequences
    return out


# -- activations and elementwise ops ---------------------------------------------------------

def relu(x, name=None):
    """max(x, 0), elementwise."""
    return _unary("relu", "relu", x, name)


def sigmoid(x, name=None):
    """1 / (1 + exp(-x)), elementwise."""
    return _unary("sigmoid", "sigmoid", x, name)


def tanh(x, name=None):
    """tanh(x), elementwise."""
    return _unary("tanh", "tanh", x, name)


def _broadcast_ok(xs, ys, axis):
    """The elementwise kernels' rule: Y (trailing 1s trimmed) = a contiguous run of X's dims."""
    if _same_shape(xs, ys):
        return True
    if axis == -1:
        axis = len(xs) - len(ys)
    trimmed = list(ys)
    while trimmed and trimmed[-1] == 1:
        trimmed.pop()
    if axis < 0 or len(ys) > len(xs) or axis + len(trimmed) > len(xs):
        return False
    return all(xs[axis + i] == d for i, d in enumerate(trimmed))


def _elementwise(op_type, x, y, axis, act, name):
    model = _model_of(op_type, x, y)
    x = _var(model, op_type, x, "x")
    y = _var(model, op_type, y, "y")
    _per_example(op_type, [("x", x), ("y", y)])
    axis = _int(op_type, "axis", axis)
    if x.dtype != y.dtype:
        raise ValueError("%s: x %s and y %s have different dtypes" % (op_type, _desc(x), _desc(y)))
    _check_float(op_type, x, "x")
    if not _broadcast_ok(x.shape, y.shape, axis):
        raise ValueError(
            "%s: shapes %s and %s do not broadcast (x %r, y %r, axis %d): y's dims, trailing 1s "
            "dropped, must equal a contiguous run of x's dims (the output has x's shape)" %
            (op_type, shape_str(x.shape), shape_str(y.shape), x.name, y.name, axis))
    if act not in (None, "") and act not in ACTIVATIONS:
        raise ValueError("%s: unknown act %r (use %s)" % (op_type, act, ", ".join(ACTIVATIONS)))
    _out_name(model, op_type, name, op_type + ".out")
    if act:
        _out_name(model, op_type, None, act + ".out")
    out = model.create_var(_take_name(model, name, op_type + ".out"), x.shape, x.dtype)
    model.append_op(op_type, [("X", [x]), ("Y", [y])], [("Out", [out])], [("axis", axis, "i")])
    return _unary(op_type, act, out) if act else out


def elementwise_add(x, y, axis=-1, act=None, name=None):
    """x + y with Fluid broadcasting of y over x (output: x's shape)."""
    return _elementwise("elementwise_add", x, y, axis, act, name)


def elementwise_sub(x, y, axis=-1, act=None, name=None):
    """x - y with Fluid broadcasting of y over x (output: x's shape)."""
    return _elementwise("elementwise_sub", x, y, axis, act, name)


def elementwise_mul(x, y, axis=-1, act=None, name=None):
    """x * y with Fluid broadcasting of y over x (output: x's shape)."""
    return _elementwise("elementwise_mul", x, y, axis, act, name)


def scale(x, scale=1.0, bias=0.0, bias_after_scale=True, name=None):
    """scale * x + bias (or scale * (x + bias) when bias_after_scale is False)."""
    attrs = [("scale", scale, "f"), ("bias", bias, "f")]
    if not bias_after_scale:
        attrs.append(("bias_after_scale", False, "b"))
    return _unary("scale", "scale", x, name, attrs)


# -- shape ops -------------------------------------------------------------------------------

def concat(input, axis=0, name=None):
    """Joins variables along `axis`; the other dims must be equal."""
    if isinstance(input, Variable) or not input:
        raise ValueError("concat: input must be a non-empty list of variables")
    model = _model_of("concat", *input)
    xs = [_var(model, "concat", x, "input %d" % i) for i, x in enumerate(input)]
    _per_example("concat", [("input %d" % i, x) for i, x in enumerate(xs)])
    first = list(xs[0].shape)
    a = _normalize_axis("concat", axis, len(first))
    total = 0
    for i, x in enumerate(xs):
        s = list(x.shape)
        if x.dtype != xs[0].dtype:
            raise ValueError("concat: input %d %s and input 0 %s have different dtypes" %
                             (i, _desc(x), _desc(xs[0])))
        if len(s) != len(first) or any(d != first[j] for j, d in enumerate(s) if j != a):
            raise ValueError("concat: input %d %s does not match input 0 %s except along axis %d" %
                             (i, _desc(x), _desc(xs[0]), axis))
        total = -1 if total < 0 or s[a] < 0 else total + s[a]
    shape = list(first)
    shape[a] = total
    _out_name(model, "concat", name, "concat.out")
    out = model.create_var(_take_name(model, name, "concat.out"), shape, xs[0].dtype)
    model.append_op("concat", [("X", xs)], [("Out", [out])], [("axis", axis, "i")])
    return out


def reshape(x, shape, name=None):
    """x with a new shape: one -1 is inferred, 0 copies x's dim (the attr keeps them as given)."""
    model = _model_of("reshape", x)
    x = _var(model, "reshape", x)
    _per_example("reshape", [("x", x)])
    target = [_int("reshape", "shape entry", d) for d in shape]
    if not target:
        raise ValueError("reshape: shape is empty")
    in_shape = list(x.shape)
    resolved = []
    for i, d in enumerate(target):
        if d == 0:
            if i >= len(in_shape):
                raise ValueError("reshape: shape %s has 0 (copy the input dim) at index %d but x "
                                 "%s has rank %d" % (target, i, _desc(x), len(in_shape)))
            resolved.append(in_shape[i])
        elif d < -1:
            raise ValueError("reshape: shape %s has negative entry %d" % (target, d))
        else:
            resolved.append(d)
    if target.count(-1) > 1:
        raise ValueError("reshape: shape %s has more than one -1" % (target,))
    # -1 in a declared shape is the batch: with a batch input the output keeps exactly one -1
    # (the batch, same per-example element count); a fully known input may infer one -1.
    in_known = 1
    for d in in_shape:
        in_known *= d if d > 0 else 1
    out_known = 1
    for d in resolved:
        out_known *= d if d > 0 else 1
    unknown = resolved.count(-1)
    if -1 in in_shape:
        ok = unknown == 1 and out_known == in_known
    elif unknown == 1:
        ok = in_known % out_known == 0
        if ok:
            resolved[resolved.index(-1)] = in_known // out_known
    else:
        ok = unknown == 0 and out_known == in_known
    if not ok:
        raise ValueError("reshape: x %s cannot be reshaped to %s (a batch input keeps its batch "
                         "as the one -1)" % (_desc(x), shape_str(target)))
    _out_name(model, "reshape", name, "reshape.out")
    out = model.create_var(_take_name(model, name, "reshape.out"), resolved, x.dtype)
    model.append_op("reshape", [("X", [x])], [("Out", [out])], [("shape", target, "ints")])
    return out


def cast(x, dtype, name=None):
    """x converted to `dtype` element by element."""
    model = _model_of("cast", x)
    x = _var(model, "cast", x)
    dtype = fw.convert_dtype(dtype)
    _per_example("cast", [("x", x)])
    _out_name(model, "cast", name, "cast.out")
    out = model.create_var(_take_name(model, name, "cast.out"), x.shape, dtype)
    model.append_op("cast", [("X", [x])], [("Out", [out])], [("out_dtype", int(dtype), "i")])
    return out


def sums(input, name=None):
    """The elementwise sum of variables of one shape (the ``sum`` op)."""
    if isinstance(input, Variable) or not input:
        raise ValueError("sums: input must be a non-empty list of variables")
    model = _model_of("sums", *input)
    xs = [_var(model, "sums", x, "input %d" % i) for i, x in enumerate(input)]
    _per_example("sums", [("input %d" % i, x) for i, x in enumerate(xs)])
    for i, x in enumerate(xs):
        if not _same_shape(x.shape, xs[0].shape) or x.dtype != xs[0].dtype:
            raise ValueError("sums: input %d %s differs from input 0 %s" %
                             (i, _desc(x), _desc(xs[0])))
    _check_float("sums", xs[0])
    _out_name(model, "sums", name, "sum.out")
    out = model.create_var(_take_name(model, name, "sum.out"), xs[0].shape, xs[0].dtype)
    model.append_op("sum", [("X", xs)], [("Out", [out])])
    return out


def _reduce(op_type, input, dim, keep_dim, name):
    model = _model_of(op_type, input)
    x = _var(model, op_type, input)
    _check_float(op_type, x)
    _per_example(op_type, [("input", x)])
    shape = list(x.shape)
    rank = len(shape)
    reduce_all = dim is None
    if reduce_all:
        dims = list(range(rank))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
        if not dims:
            raise ValueError("%s: dim is empty (None reduces every dim)" % op_type)
        dims = sorted(set(_normalize_axis(op_type, d, rank) for d in dims))
        reduce_all = len(dims) == rank
    if keep_dim:
        out_shape = [1 if i in dims else d for i, d in enumerate(shape)]
    else:
        out_shape = [d for i, d in enumerate(shape) if i not in dims] or [1]
    _out_name(model, op_type, name, op_type + ".out")
    out = model.create_var(_take_name(model, name, op_type + ".out"), out_shape, x.dtype)
    model.append_op(op_type, [("X", [x])], [("Out", [out])],
                    [("dim", dims, "ints"), ("keep_dim", bool(keep_dim), "b"),
                     ("reduce_all", reduce_all, "b")])
    return out


def reduce_sum(input, dim=None, keep_dim=False, name=None):
    """Sum over `dim` (an int or list, negative from the end; None: all dims -> [1] without
    keep_dim). Op reduce_sum, attrs dim (normalized, sorted), keep_dim, reduce_all."""
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input, dim=None, keep_dim=False, name=None):
    """Mean over `dim` (an int or list, negative from the end; None: all dims -> [1] without
    keep_dim). Op reduce_mean, attrs as reduce_sum."""
    return _reduce("reduce_mean", input, dim, keep_dim, name)


def matmul(x, y, transpose_x=False, transpose_y=False, alpha=1.0, name=None):
    """alpha * op(x) . op(y) over the last two dims; leading dims equal, or one side 2-D."""
    model = _model_of("matmul", x, y)
    x = _var(model, "matmul", x, "x")
    y = _var(model, "matmul", y, "y")
    _per_example("matmul", [("x", x), ("y", y)])
    if x.dtype != y.dtype:
        raise ValueError("matmul: x %s and y %s have different dtypes" % (_desc(x), _desc(y)))
    _check_float("matmul", x, "x")
    xs, ys = list(x.shape), list(y.shape)
    if len(xs) < 2 or len(ys) < 2:
        raise ValueError("matmul: x %s and y %s must both have rank >= 2" % (_desc(x), _desc(y)))
    bx, by = xs[:-2], ys[:-2]
    if bx and by and bx != by:
        raise ValueError("matmul: x %s and y %s have different batch dims" % (_desc(x), _desc(y)))
    m, k = (xs[-1], xs[-2]) if transpose_x else (xs[-2], xs[-1])
    k2, n = (ys[-1], ys[-2]) if transpose_y else (ys[-2], ys[-1])
    if k != k2:
        raise ValueError("matmul: x %s (transpose_x=%s) and y %s (transpose_y=%s) disagree in "
                         "the inner dimension: %d vs %d" % (_desc(x), bool(transpose_x), _desc(y),
                                                            bool(transpose_y), k, k2))
    out_shape = (bx or by) + [m, n]
    _out_name(model, "matmul", name, "matmul.out")
    out = model.create_var(_take_name(model, name, "matmul.out"), out_shape, x.dtype)
    model.append_op("matmul", [("X", [x]), ("Y", [y])], [("Out", [out])],
                    [("transpose_X", bool(transpose_x), "b"),
                     ("transpose_Y", bool(transpose_y), "b"), ("alpha", alpha, "f")])
    return out


def dot(x, y, name=None):
    """Row-wise dot product of two [-1, D] variables -> [-1, 1] (elementwise_mul + reduce_sum)."""
    model = _model_of("dot", x, y)
    x = _var(model, "dot", x, "x")
    y = _var(model, "dot", y, "y")
    _per_example("dot", [("x", x), ("y", y)])
    if len(x.shape) != 2 or not _same_shape(x.shape, y.shape):
        raise ValueError("dot: x %s and y %s must both be [-1, D] of one shape" %
                         (_desc(x), _desc(y)))
    return reduce_sum(elementwise_mul(x, y), dim=[1], keep_dim=True, name=name)


def dropout(x, dropout_prob=0.5, is_test=False, seed=None,
            dropout_implementation="downgrade_in_infer", name=None):
    """Zeros elements with probability dropout_prob in training; op dropout.

    A new mask is drawn every step; the trainer's evaluation runs the op in inference mode
    (is_test). The mask sequence restarts when training resumes from a checkpoint.

    seed: None derives one from the model seed and the output's name (like initializers).
    dropout_implementation: "downgrade_in_infer" (train x*mask, infer x*(1-p)) or
    "upscale_in_train" (train x*mask/(1-p), infer x).
    """
    model = _model_of("dropout", x)
    x = _var(model, "dropout", x)
    _check_float("dropout", x)
    _per_example("dropout", [("x", x)])
    p = float(dropout_prob)
    if not 0.0 <= p < 1.0:
        raise ValueError("dropout: dropout_prob %r must be in [0, 1)" % (dropout_prob,))
    if dropout_implementation not in ("downgrade_in_infer", "upscale_in_train"):
        raise ValueError("dropout: dropout_implementation must be downgrade_in_infer or "
                         "upscale_in_train, got %r" % (dropout_implementation,))
    out_name = _out_name(model, "dropout", name, "dropout.out")
    _out_name(model, "dropout", None, "dropout.mask")
    out = model.create_var(_take_name(model, name, "dropout.out"), x.shape, x.dtype)
    mask = model.create_var(model.unique_name("dropout.mask"), x.shape, x.dtype)
    if seed is None:
        seed = model.seed_for(out_name) & fw.SEED_MASK
    model.append_op("dropout", [("X", [x])], [("Out", [out]), ("Mask", [mask])],
                    [("dropout_prob", p, "f"), ("is_test", bool(is_test), "b"),
                     ("seed", seed, "i"), ("dropout_implementation", dropout_implementation, "s")])
    return out


# -- image layers (NCHW) ---------------------------------------------------------------------

def _slide(extent, window, stride, padding):
    """Output extent of a window sliding over `extent` (-1 stays unknown; C++ SlideExtent)."""
    return -1 if extent < 0 else (extent + 2 * padding - window) // stride + 1


def _image(layer, x):
    """x must be a float [-1, C, H, W] variable with known C, H, W."""
    _check_float(layer, x)
    _per_example(layer, [("input", x)])
    if len(x.shape) != 4 or any(d < 1 for d in x.shape[1:]):
        raise ValueError("%s: input %s must be [-1, C, H, W] with known C, H, W" %
                         (layer, _desc(x)))


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, act=None,
           name=None, param_attr=None, bias_attr=None):
    """act(conv2d(input, W) + b): input [-1, C, H, W] -> [-1, num_filters, Ho, Wo]; op conv2d.

    W is [num_filters, C, k, k] (``<name>.w``, default Xavier over fan-in C k k and fan-out
    num_filters k k), b [num_filters] (``<name>.b``, default 0; bias_attr=False drops it).
    Ho = (H + 2 padding - (dilation (k - 1) + 1)) // stride + 1.
    """
    model = _model_of("conv2d", input)
    prefix = name if name is not None else model.peek_unique_name("conv2d")
    layer = "conv2d %r" % prefix
    x = _var(model, layer, input)
    _image(layer, x)
    m = _int(layer, "num_filters", num_filters, minimum=1)
    k = _int(layer, "filter_size", filter_size, minimum=1)
    stride = _int(layer, "stride", stride, minimum=1)
    padding = _int(layer, "padding", padding, minimum=0)
    dilation = _int(layer, "dilation", dilation, minimum=1)
    c, h, w = x.shape[1:]
    span = dilation * (k - 1) + 1
    if h + 2 * padding < span or w + 2 * padding < span:
        raise ValueError("%s: filter %dx%d (dilated %d) is larger than input %s padded by %d" %
                         (layer, k, k, span, _desc(x), padding))
    w_attr, b_attr, use_bias = _weight_layer_attrs(layer, act, param_attr, bias_attr)
    if name is not None:
        fw.check_name("conv2d", name)
    _claim_names(model, layer, prefix, [prefix + ".w", prefix + ".conv"],
                 [prefix + ".b", prefix + ".pre_act"] if use_bias else [], act)
    if name is None:
        model.unique_name("conv2d")
    init = w_attr.initializer
    if init is None:
        bound = _init.float32(math.sqrt(6.0 / (k * k * (c + m))))
        init = _init.Uniform(-bound, bound)
    dtype = x.dtype
    weights = model.create_parameter(prefix + ".w", [m, c, k, k], init, dtype)
    out_shape = [x.shape[0], m, _slide(h, span, stride, padding), _slide(w, span, stride, padding)]
    out = model.create_var(prefix + ".conv", out_shape, dtype)
    model.append_op("conv2d", [("Input", [x]), ("Filter", [weights])], [("Output", [out])],
                    [("strides", [stride, stride], "ints"), ("paddings", [padding, padding], "ints"),
                     ("dilations", [dilation, dilation], "ints")])
    if use_bias:
        b = model.create_parameter(prefix + ".b", [m], b_attr.initializer or _init.Constant(0.0),
                                   dtype)
        conv = out
        out = model.create_var(prefix + ".pre_act", out_shape, dtype)
        model.append_op("elementwise_add", [("X", [conv]), ("Y", [b])], [("Out", [out])],
                        [("axis", 1, "i")])
    if act:
        return _unary(layer, act, out)
    return out


def pool2d(input, pool_size, pool_type="max", pool_stride=None, pool_padding=0, name=None):
    """Max ("max") or average ("avg") pooling over pool_size x pool_size windows; op pool2d.

    pool_stride defaults to pool_size. Average pooling divides by the window's cells inside the
    image; max pooling ignores the padding.
    """
    layer = "pool2d"
    model = _model_of(layer, input)
    x = _var(model, layer, input)
    _image(layer, x)
    k = _int(layer, "pool_size", pool_size, minimum=1)
    stride = k if pool_stride is None else _int(layer, "pool_stride", pool_stride, minimum=1)
    padding = _int(layer, "pool_padding", pool_padding, minimum=0)
    if pool_type not in ("max", "avg"):
        raise ValueError("%s: pool_type %r must be max or avg" % (layer, pool_type))
    if padding >= k:
        raise ValueError("%s: pool_padding %d must be smaller than pool_size %d" %
                         (layer, padding, k))
    c, h, w = x.shape[1:]
    if h + 2 * padding < k or w + 2 * padding < k:
        raise ValueError("%s: window %dx%d is larger than input %s padded by %d" %
                         (layer, k, k, _desc(x), padding))
    _out_name(model, layer, name, "pool2d.out")
    shape = [x.shape[0], c, _slide(h, k, stride, padding), _slide(w, k, stride, padding)]
    out = model.create_var(_take_name(model, name, "pool2d.out"), shape, x.dtype)
    model.append_op("pool2d", [("X", [x])], [("Out", [out])],
                    [("pooling_type", pool_type, "s"), ("ksize", [k, k], "ints"),
                     ("strides", [stride, stride], "ints"),
                     ("paddings", [padding, padding], "ints")])
    return out


def flatten(x, axis=1, name=None):
    """[d0, ..., dk] -> [d0 ... d(axis-1), d(axis) ... dk]; op flatten."""
    layer = "flatten"
    model = _model_of(layer, x)
    x = _var(model, layer, x)
    _per_example(layer, [("x", x)])
    shape = list(x.shape)
    axis = _int(layer, "axis", axis, minimum=0)
    if axis > len(shape):
        raise ValueError("%s: axis %d must be in [0, %d] for x %s" % (layer, axis, len(shape),
                                                                      _desc(x)))

    def product(dims):
        p = 1
        for d in dims:
            p = -1 if (p < 0 or d < 0) else p * d
        return p

    _out_name(model, layer, name, "flatten.out")
    out = model.create_var(_take_name(model, name, "flatten.out"),
                           [product(shape[:axis]), product(shape[axis:])], x.dtype)
    model.append_op("flatten", [("X", [x])], [("Out", [out])], [("axis", axis, "i")])
    return out


def batch_norm(input, act=None, momentum=0.9, epsilon=1e-5, name=None):
    """Normalizes each channel (dim 1) of input [-1, C, ...]; op batch_norm.

    Learns ``<name>.scale`` (init 1) and ``<name>.bias`` (init 0); keeps the running statistics
    ``<name>.mean`` and ``<name>.variance`` (persistable, not trained: moved towards each batch's
    statistics with `momentum`, used by the trainer's evaluation).
    """
    model = _model_of("batch_norm", input)
    prefix = name if name is not None else model.peek_unique_name("batch_norm")
    layer = "batch_norm %r" % prefix
    x = _var(model, layer, input)
    _check_float(layer, x)
    _per_example(layer, [("input", x)])
    if len(x.shape) < 2 or x.shape[1] < 1:
        raise ValueError("%s: input %s must be [-1, C, ...] with known C" % (layer, _desc(x)))
    momentum = _init.float32(momentum)
    epsilon = _init.float32(epsilon)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError("%s: momentum %r must be in [0, 1]" % (layer, momentum))
    if not epsilon > 0.0:
        raise ValueError("%s: epsilon %r must be positive" % (layer, epsilon))
    if act not in (None, "") and act not in ACTIVATIONS:
        raise ValueError("%s: unknown act %r (use %s)" % (layer, act, ", ".join(ACTIVATIONS)))
    if name is not None:
        fw.check_name("batch_norm", name)
    if name is None:
        model.unique_name("batch_norm")
    c = x.shape[1]
    dtype = x.dtype
    scale = model.create_parameter(prefix + ".scale", [c], _init.Constant(1.0), dtype)
    bias = model.create_parameter(prefix + ".bias", [c], _init.Constant(0.0), dtype)
    mean = model.create_persistable(prefix + ".mean", [c], 0.0, dtype)
    var = model.create_persistable(prefix + ".variance", [c], 1.0, dtype)
    y = model.create_var(model.unique_name(prefix + ".out"), x.shape, dtype)
    saved_mean = model.create_var(prefix + ".saved_mean", [c], dtype)
    saved_var = model.create_var(prefix + ".saved_variance", [c], dtype)
    for v in (saved_mean, saved_var):
        v.desc.stop_gradient = True
    model.append_op("batch_norm",
                    [("X", [x]), ("Scale", [scale]), ("Bias", [bias]), ("Mean", [mean]),
                     ("Variance", [var])],
                    [("Y", [y]), ("MeanOut", [mean]), ("VarianceOut", [var]),
                     ("SavedMean", [saved_mean]), ("SavedVariance", [saved_var])],
                    [("momentum", momentum, "f"), ("epsilon", epsilon, "f"),
                     ("is_test", False, "b")])
    if act:
        return _unary(layer, act, y)
    return y


# The pool types of the sequence_pool op (its "pooltype" attribute).
POOL_TYPES = ("SUM", "AVERAGE", "SQRT", "MAX")


def sequence_pool(input, pool_type, name=None):
    """Pools each sequence of a per-id input into one row: [-1, D] (lod_level 1) -> [-1, D], one
    row per example (lod_level 0). Op ``sequence_pool``, attribute ``pooltype``.

    input: float32 [-1, D] with lod_level 1, e.g. the embedding of a multi-hot slot
    (``layers.data(..., slot=k, lod_level=1)``). pool_type (case-insensitive): "sum",
    "average", "sqrt" (sum / sqrt(length)) or "max". An empty sequence (an example with no ids)
    pools to a row of zeros.
    """
    layer = "sequence_pool"
    model = _model_of(layer, input)
    x = _var(model, layer, input)
    if not isinstance(pool_type, str) or pool_type.upper() not in POOL_TYPES:
        raise ValueError("%s: pool_type %r is not one of %s" %
                         (layer, pool_type, ", ".join(k.lower() for k in POOL_TYPES)))
    if fw.convert_dtype(x.dtype) != fw.FLOAT32:
        raise ValueError("%s: input %s must be float32" % (layer, _desc(x)))
    if len(x.shape) != 2 or x.shape[0] != -1 or x.shape[1] < 1:
        raise ValueError("%s: input %s must be [-1, D] (one row per id)" % (layer, _desc(x)))
    if x.lod_level != 1:
        raise ValueError("%s: input %s has lod_level 0 (one row per example); sequence_pool "
                         "pools the sequences of a lod_level 1 input, e.g. the embedding of a "
                         "multi-hot slot declared with layers.data(..., slot=k, lod_level=1)" %
                         (layer, _desc(x)))
    _out_name(model, layer, name, "sequence_pool.out")
    out = model.create_var(_take_name(model, name, "sequence_pool.out"), [-1, x.shape[1]],
                           x.dtype)
    model.append_op("sequence_pool", [("X", [x])], [("Out", [out])],
                    [("pooltype", pool_type.upper(), "s")])
    return out


# -- losses ----------------------------------------------------------------------------------

def mean(x, name=None):
    """The mean of every element -> [1]."""
    model = _model_of("mean", x)
    x = _var(model, "mean", x)
    _check_float("mean", x)
    _per_example("mean", [("x", x)])
    _out_name(model, "mean", name, "mean.out")
    out = model.create_var(_take_name(model, name, "mean.out"), [1], x.dtype)
    model.append_op("mean", [("X", [x])], [("Out", [out])])
    return out


def square_error_cost(input, label, name=None):
    """(input - label)^2 per element (op ``square_error``); input and label of one shape."""
    model = _model_of("square_error_cost", input, label)
    x = _var(model, "square_error_cost", input)
    y = _var(model, "square_error_cost", label, "label")
    _per_example("square_error_cost", [("input", x), ("label", y)])
    if not _same_shape(x.shape, y.shape) or x.dtype != y.dtype:
        raise ValueError("square_error_cost: input %s and label %s must have one shape and dtype"
                         % (_desc(x), _desc(y)))
    _check_float("square_error_cost", x)
    _out_name(model, "square_error_cost", name, "square_error.out")
    out = model.create_var(_take_name(model, name, "square_error.out"), x.shape, x.dtype)
    model.append_op("square_error", [("X", [x]), ("Y", [y])], [("Out", [out])])
    return out


def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               return_softmax=False):
    """Cross entropy of softmax(logits) [-1, C] against int64 class ids [-1, 1] -> [-1, 1].

    Returns the loss, or (loss, softmax) with return_softmax. soft_label: label is a [-1, C]
    float distribution.
    """
    layer = "softmax_with_cross_entropy"
    model = _model_of(layer, logits, label)
    x = _var(model, layer, logits, "logits")
    y = _var(model, layer, label, "label")
    _check_float(layer, x, "logits")
    _per_example(layer, [("logits", x), ("label", y)])
    shape = list(x.shape)
    if len(shape) < 2:
        raise ValueError("%s: logits %s must be [-1, C]" % (layer, _desc(x)))
    if soft_label:
        if not _same_shape(y.shape, shape) or y.dtype != x.dtype:
            raise ValueError("%s: soft label %s must match logits %s" % (layer, _desc(y), _desc(x)))
    else:
        if fw.convert_dtype(y.dtype) not in (fw.INT64, fw.INT32):
            raise ValueError("%s: label %s must be int64 class ids" % (layer, _desc(y)))
        if list(y.shape) != shape[:-1] + [1]:
            raise ValueError("%s: label %s must be %s for logits %s" %
                             (layer, _desc(y), shape_str(shape[:-1] + [1]), _desc(x)))
    _out_name(model, layer, None, "softmax.out")
    _out_name(model, layer, None, "cross_entropy.out")
    sm = model.unique_name("softmax.out")
    loss = model.unique_name("cross_entropy.out")
    model.create_var(sm, shape, x.dtype)
    model.create_var(loss, [shape[0], 1], x.dtype)
    attrs = []
    if soft_label:
        attrs.append(("soft_label", True, "b"))
    if ignore_index != -100:
        attrs.append(("ignore_index", ignore_index, "i"))
    model.append_op(layer, [("Logits", [x]), ("Label", [y])],
                    [("Softmax", [sm]), ("Loss", [loss])], attrs)
    if return_softmax:
        return model.var(loss), model.var(sm)
    return model.var(loss)


def sigmoid_cross_entropy_with_logits(x, label, ignore_index=-100, normalize=False, name=None):
    """Per-element logistic loss of logits x against 0/1 labels of x's shape."""
    layer = "sigmoid_cross_entropy_with_logits"
    model = _model_of(layer, x, label)
    x = _var(model, layer, x, "x")
    y = _var(model, layer, label, "label")
    _check_float(layer, x, "x")
    _per_example(layer, [("x", x), ("label", y)])
    if not _same_shape(x.shape, y.shape) or x.dtype != y.dtype:
        raise ValueError("%s: x %s and label %s must have one shape and dtype" %
                         (layer, _desc(x), _desc(y)))
    _out_name(model, layer, name, "sigmoid_ce.out")
    out = model.create_var(_take_name(model, name, "sigmoid_ce.out"), x.shape, x.dtype)
    attrs = []
    if ignore_index != -100:
        attrs.append(("ignore_index", ignore_index, "i"))
    if normalize:
        attrs.append(("normalize", True, "b"))
    model.append_op(layer, [("X", [x]), ("Label", [y])], [("Out", [out])], attrs)
    return out


# -- metrics ---------------------------------------------------------------------------------

Metric = collections.namedtuple("Metric", ["name", "prediction", "label"])


def _metric(metric, input, label):
    model = _model_of(metric, input, label)
    p = _var(model, metric, input)
    y = _var(model, metric, label, "label")
    _per_example(metric, [("input", p), ("label", y)])
    width_ok = len(p.shape) == 2 and (p.shape[1] == 1 or
                                      (metric == "accuracy" and p.shape[1] > 1))
    if not width_ok or fw.convert_dtype(p.dtype) not in fw.FLOAT_DTYPES:
        if metric == "accuracy":
            raise ValueError("%s: input %s must be [-1, C] class scores or the [-1, 1] "
                             "probability of the positive class" % (metric, _desc(p)))
        raise ValueError("%s: input %s must be the [-1, 1] probability of the positive class" %
                         (metric, _desc(p)))
    if not y.is_data:
        raise ValueError("%s: label %r must be the label input (layers.data)" % (metric, y.name))
    if model.prediction not in (None, p.name):
        raise ValueError("%s: the model's prediction is already %r (metrics share one)" %
                         (metric, model.prediction))
    if metric in model.metrics:
        raise ValueError("%s: the model already has this metric" % metric)
    model.prediction = p.name
    model.metrics.append(metric)
    model._metric_labels[metric] = y.name
    return Metric(metric, p, y)


def auc(input, label):
    """Declares the model file metric "auc" of prediction `input` (no ops: the trainer's)."""
    return _metric("auc", input, label)


def accuracy(input, label):
    """Declares the model file metric "accuracy" of prediction `input` (no ops): the top-1 class
    of [-1, C] class scores, or a [-1, 1] probability thresholded at 0.5."""
    return _metric("accuracy", input, label)


def exponential_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """A learning-rate schedule lr * decay_rate^(step / decay_steps) for an optimizer."""
    from tessera import optimizer
    return optimizer.ExponentialDecay(learning_rate, decay_steps, decay_rate, staircase)
