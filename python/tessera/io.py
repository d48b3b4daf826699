"""Model files: feed bindings, building and checking a ``tessera.ModelFile``, saving, loading.

A model file (proto/model.proto) is what every C++ runner loads with ``--model=PATH``: the
forward program, its startup program, feed bindings, the loss, the prediction, metrics and the
optimizer configuration. ``save_model`` writes it in text format, atomically (a temporary file
in the same directory, then a rename), with ``format_version`` 1.

Feeds are written in a canonical order -- DENSE, then the SLOTs by slot index, then the
MULTI_SLOTs by slot index, then LABEL -- the order ``tessera::MakeModelFile`` uses for DENSE,
SLOT and LABEL, whatever order they were declared in.

``check_model_file`` repeats the static checks of the C++ loader (``ValidateModel`` in
common/layers/model_file.cc: feeds, graph, outputs, optimizer) so that mistakes surface in Python with
a message naming the variable; the loader additionally runs a batch through the program.
"""

import os
import sys
import tempfile
import warnings

from google.protobuf import text_format

from tessera import framework as fw
from tessera import text_format_cc
from tessera.proto import model_pb2

__all__ = [
    "FORMAT_VERSION", "METRICS", "Feed", "build_model_file", "check_model_file", "load_model",
    "model_to_text", "save_model", "unregistered_ops",
]

# The format this package writes (kModelFormatVersion).
FORMAT_VERSION = 1
# The metrics a model file may ask for (kModelMetrics).
METRICS = ("auc", "log_loss", "accuracy", "mse")

DENSE = "dense"
SLOT = "slot"
LABEL = "label"
MULTI_SLOT = "multi_slot"
_SOURCE_ENUM = {
    DENSE: model_pb2.FeedBinding.DENSE,
    SLOT: model_pb2.FeedBinding.SLOT,
    LABEL: model_pb2.FeedBinding.LABEL,
    MULTI_SLOT: model_pb2.FeedBinding.MULTI_SLOT,
}
_SOURCE_NAME = {v: k for k, v in _SOURCE_ENUM.items()}
# The sources that read a slot column (`slot`, `id_modulo`).
SLOT_SOURCES = (SLOT, MULTI_SLOT)
_SOURCE_ORDER = {DENSE: 0, SLOT: 1, MULTI_SLOT: 2, LABEL: 3}


class Feed(object):
    """A feed binding: which data column feeds a data variable.

    source "dense" (every dense feature, a [-1, num_dense] float32 variable), "slot" (categorical
    slot `slot`, a [-1, 1] int64 variable), "multi_slot" (multi-hot slot `slot`, 0-based among
    the multi-hot columns: every id of each example's list concatenated, a [-1, 1] int64
    variable declared with lod_level=1) or "label" ([-1, 1]). `id_modulo` (slot and multi_slot
    only): None works it out from the embedding tables the ids index -- the row count of local
    tables, 0 (ids unchanged) for distributed tables.
    """

    def __init__(self, var, source, slot=None, id_modulo=None):
        if isinstance(var, fw.Variable):
            self.var_name = var.name
        elif isinstance(var, str):
            self.var_name = var
        else:
            raise TypeError("feed: expected a Variable or a name, got %r" % (var,))
        if isinstance(source, int) and not isinstance(source, bool):
            if source not in _SOURCE_NAME:
                raise ValueError("feed %r: unknown source %d" % (self.var_name, source))
            source = _SOURCE_NAME[source]
        if not isinstance(source, str) or source.lower() not in _SOURCE_ENUM:
            raise ValueError("feed %r: source must be 'dense', 'slot', 'multi_slot' or 'label', "
                             "got %r" % (self.var_name, source))
        self.source = source.lower()
        if self.source in SLOT_SOURCES:
            if slot is None or isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
                raise ValueError("feed %r: a %s feed needs slot=<index >= 0>, got %r" %
                                 (self.var_name, self.source, slot))
            if slot > 0x7FFFFFFF:
                raise ValueError("feed %r: slot %d does not fit in int32" % (self.var_name, slot))
            if id_modulo is not None and (isinstance(id_modulo, bool) or
                                          not isinstance(id_modulo, int) or id_modulo < 0):
                raise ValueError("feed %r: id_modulo must be an int >= 0 or None, got %r" %
                                 (self.var_name, id_modulo))
        elif slot is not None or id_modulo is not None:
            raise ValueError("feed %r: slot and id_modulo go with source 'slot' or 'multi_slot', "
                             "not %r" % (self.var_name, self.source))
        self.slot = slot
        self.id_modulo = id_modulo

    @classmethod
    def dense(cls, var):
        """The DENSE binding of `var`."""
        return cls(var, DENSE)

    @classmethod
    def slot_of(cls, var, slot, id_modulo=None):
        """The SLOT binding of `var` to categorical slot `slot`."""
        return cls(var, SLOT, slot=slot, id_modulo=id_modulo)

    @classmethod
    def multi_slot_of(cls, var, slot, id_modulo=None):
        """The MULTI_SLOT binding of `var` (declared with lod_level=1) to multi-hot slot `slot`."""
        return cls(var, MULTI_SLOT, slot=slot, id_modulo=id_modulo)

    @classmethod
    def label(cls, var):
        """The LABEL binding of `var`."""
        return cls(var, LABEL)

    def sort_key(self):
        """DENSE first, then SLOTs by index, then MULTI_SLOTs by index, then LABEL."""
        return (_SOURCE_ORDER[self.source], self.slot or 0)

    def __repr__(self):
        extra = ""
        if self.source in SLOT_SOURCES:
            extra = ", slot=%d, id_modulo=%r" % (self.slot, self.id_modulo)
        return "Feed(%r, %r%s)" % (self.var_name, self.source, extra)


def check_feed_lod(model, feed):
    """Raises ValueError unless `feed` agrees with the lod_level its variable was declared with:
    a MULTI_SLOT feed binds a lod_level 1 variable, every other source a lod_level 0 one."""
    if not model.has_var(feed.var_name):
        return
    lod = model.var(feed.var_name).lod_level
    if feed.source == MULTI_SLOT and lod != 1:
        raise ValueError("feed %r: a multi_slot feed binds a variable declared with lod_level=1 "
                         "(layers.data(..., slot=k, lod_level=1)); %r has lod_level 0" %
                         (feed.var_name, feed.var_name))
    if feed.source != MULTI_SLOT and lod != 0:
        raise ValueError("feed %r: a lod_level 1 variable can only be fed by a multi_slot feed, "
                         "not %s" % (feed.var_name, feed.source))


def _lookup_tables(forward_block, ids):
    """(table VarDesc, op index) for every lookup_table op of the block reading `ids`."""
    found = []
    for i, op in enumerate(forward_block.ops):
        if op.type == "lookup_table" and ids in fw.op_inputs(op, "Ids"):
            for w in fw.op_inputs(op, "W"):
                table = next((v for v in forward_block.vars if v.name == w), None)
                if table is not None:
                    found.append((table, i))
    return found


def resolve_id_modulo(forward_block, feed):
    """The id_modulo of a slot / multi_slot feed: explicit, else from the tables its ids index."""
    tables = _lookup_tables(forward_block, feed.var_name)
    local = [t for t, _ in tables if not t.is_distributed]
    if feed.id_modulo is not None:
        for t in local:
            if t.shape and (feed.id_modulo < 1 or feed.id_modulo > t.shape[0]):
                raise ValueError(
                    "feed %r: id_modulo %d would feed ids outside [0, %d) of local table %r" %
                    (feed.var_name, feed.id_modulo, t.shape[0], t.name))
        return feed.id_modulo
    if not tables:
        return 0  # ids used some other way: fed unchanged
    if local and len(local) != len(tables):
        raise ValueError("feed %r: ids index both local and distributed tables (%s); pass "
                         "id_modulo" % (feed.var_name, ", ".join(repr(t.name) for t, _ in tables)))
    if not local:
        return 0
    rows = sorted(set(t.shape[0] for t in local))
    if len(rows) > 1:
        raise ValueError("feed %r: ids index local tables of different sizes (%s); pass "
                         "id_modulo" % (feed.var_name, ", ".join(
                             "%r %d rows" % (t.name, t.shape[0]) for t in local)))
    return rows[0]


def unregistered_ops(model_file_or_program):
    """Sorted op types of a ModelFile / ProgramDesc that the C++ registry lacks (REGISTERED_OPS)."""
    msg = model_file_or_program
    programs = [msg.forward, msg.startup] if hasattr(msg, "forward") else [msg]
    types = set()
    for p in programs:
        for b in p.blocks:
            types.update(op.type for op in b.ops)
    return sorted(types - fw.REGISTERED_OPS)


def _var_name(model, what, v):
    if v is None or v == "":
        return ""
    if isinstance(v, fw.Variable):
        if v.model is not model:
            raise ValueError("%s %r belongs to another model" % (what, v.name))
        return v.name
    if isinstance(v, str):
        if not model.has_var(v):
            raise ValueError("%s %r is not a variable of the model" % (what, v))
        return v
    raise TypeError("%s must be a Variable or a name, got %r" % (what, v))


def build_model_file(model, loss=None, prediction=None, metrics=None, feeds=None, strict=False):
    """The checked tessera.ModelFile of `model` (see save_model for the arguments)."""
    loss_name = _var_name(model, "loss", loss)
    if model.loss and loss_name and loss_name != model.loss:
        raise ValueError("loss %r differs from the loss %r the optimizer minimizes" %
                         (loss_name, model.loss))
    loss_name = loss_name or model.loss or ""
    if not loss_name:
        raise ValueError("no loss: call optimizer.minimize(loss) before saving the model")
    if model.optimizer is None:
        raise ValueError("no optimizer: call optimizer.minimize(%r) before saving the model" %
                         loss_name)
    pred_name = _var_name(model, "prediction", prediction)
    if model.prediction and pred_name and pred_name != model.prediction:
        raise ValueError("prediction %r differs from %r, the input of the metrics declared with "
                         "layers.auc/accuracy" % (pred_name, model.prediction))
    pred_name = pred_name or model.prediction or ""
    if isinstance(metrics, str):
        raise TypeError("metrics must be a list of names, got the str %r" % metrics)
    metric_names = list(model.metrics if metrics is None else metrics)
    seen = set()
    for m in metric_names:
        if m in seen:
            raise ValueError("metric %r is listed twice" % m)
        seen.add(m)

    if feeds is None:
        feed_list = model.feeds
    else:
        feed_list = []
        for f in feeds:
            if not isinstance(f, Feed):
                raise TypeError("feeds must be tessera.Feed objects, got %r" % (f,))
            feed_list.append(f)
    for f in feed_list:
        check_feed_lod(model, f)

    mf = model_pb2.ModelFile()
    mf.format_version = FORMAT_VERSION
    mf.forward.CopyFrom(model.main_program.desc)
    mf.startup.CopyFrom(model.startup_program.desc)
    block = mf.forward.blocks[0]
    for f in sorted(feed_list, key=Feed.sort_key):
        b = mf.feeds.add()
        b.var = f.var_name
        b.source = _SOURCE_ENUM[f.source]
        if f.source in SLOT_SOURCES:
            b.slot = f.slot
            b.id_modulo = resolve_id_modulo(block, f)
    mf.loss = loss_name
    mf.prediction = pred_name
    mf.metrics.extend(metric_names)
    mf.optimizer.CopyFrom(model.optimizer)
    for table in sorted(model.table_optimizers):
        t = mf.table_optimizers.add()
        t.table = table
        t.optimizer.CopyFrom(model.table_optimizers[table])

    check_model_file(mf)
    for metric, label in model._metric_labels.items():
        if metric not in metric_names:
            continue
        bound = [b.var for b in mf.feeds if b.source == model_pb2.FeedBinding.LABEL]
        if bound and label != bound[0]:
            raise ValueError("metric %r was declared with label %r but the LABEL feed is %r" %
                             (metric, label, bound[0]))
    missing = unregistered_ops(mf)
    if missing:
        message = ("the model uses op types the C++ op registry does not have yet: %s; the "
                   "runners refuse it until kernels are registered" % ", ".join(missing))
        if strict:
            raise ValueError(message)
        warnings.warn(message, UserWarning, stacklevel=_caller_stacklevel())
    return mf


def _caller_stacklevel():
    """The warnings stacklevel of the first frame outside this package (the user's call)."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(
            os.path.abspath(frame.f_code.co_filename)) == package_dir:
        frame, level = frame.f_back, level + 1
    return level


def _refuse(fmt, *args):
    raise ValueError("model file: " + (fmt % args if args else fmt))


def _input(op, slot):
    """The first argument of `op`'s input `slot` ("" if none)."""
    for i in op.inputs:
        if i.parameter == slot and i.arguments:
            return i.arguments[0]
    return ""


def _check_optimizer_values(o, what, table):
    """One OptimizerConfig's own values (CheckOptimizerValues): a table's optimizer may leave
    learning_rate at 0 (the model's) and has no schedule or clipping of its own."""
    inf = float("inf")
    if o.type not in ("sgd", "momentum", "adagrad", "adam"):
        _refuse("%s type %r is unknown (sgd, momentum, adagrad or adam)", what, o.type)
    if not (o.learning_rate > 0 or (table and o.learning_rate == 0)) or o.learning_rate == inf:
        if table:
            _refuse("%s learning_rate %r must be >= 0 and finite (0: the model's)", what,
                    o.learning_rate)
        _refuse("%s learning_rate %r must be positive and finite", what, o.learning_rate)
    if not (o.l2_decay >= 0) or o.l2_decay == inf:
        _refuse("%s l2_decay %r must be >= 0", what, o.l2_decay)
    if not (o.clip_global_norm >= 0) or o.clip_global_norm == inf:
        _refuse("%s clip_global_norm %r must be >= 0 and finite", what, o.clip_global_norm)
    if table and (o.decay_steps != 0 or o.clip_global_norm != 0):
        _refuse("%s sets %s: a table has no schedule or clipping of its own (the model's "
                "optimizer sets them for every parameter)", what,
                "decay_steps" if o.decay_steps != 0 else "clip_global_norm")
    if o.decay_steps < 0:
        _refuse("%s decay_steps %d < 0", what, o.decay_steps)
    if o.decay_steps > 0 and not (0 < o.decay_rate < inf):
        _refuse("%s decay_rate %r must be positive with decay_steps", what, o.decay_rate)
    if not (0 <= o.momentum < 1):
        _refuse("%s momentum %r must be in [0, 1)", what, o.momentum)
    for beta in (o.beta1, o.beta2):
        if not (0 <= beta < 1):
            _refuse("%s beta %r must be in [0, 1)", what, beta)
    if not (o.epsilon >= 0) or o.epsilon == inf:
        _refuse("%s epsilon %r must be >= 0", what, o.epsilon)


def check_model_file(mf):
    """Raises ValueError (naming the variable) where the C++ loader would refuse `mf`.

    Repeats ValidateModel's static checks: format version, one forward block, feeds (sources,
    dtypes, shapes, SLOT indices 0..n-1 and MULTI_SLOT indices 0..m-1 each with none missing and
    none bound twice, one LABEL), every op input fed, written earlier or persistable,
    forward-only ops, parameters with dims >= 1 and an initializer, a float32 [1] loss written
    by an op, a written prediction, known metrics, and the optimizer's hyper-parameters. The
    loader's dry run (a batch through the kernels) is not repeated; op types are not checked
    (see unregistered_ops).
    """
    if mf.format_version <= 0 or mf.format_version > FORMAT_VERSION:
        _refuse("format_version is %d; this package writes %d", mf.format_version, FORMAT_VERSION)
    if len(mf.forward.blocks) != 1:
        _refuse("the forward program has %d blocks; it must have exactly one",
                len(mf.forward.blocks))
    if len(mf.startup.blocks) > 1:
        _refuse("the startup program has %d blocks (max 1)", len(mf.startup.blocks))
    block = mf.forward.blocks[0]
    vars_by_name = {v.name: v for v in block.vars}
    FB = model_pb2.FeedBinding

    def describe(v):
        return "%s %s" % (fw.dtype_name(v.dtype), fw.shape_str(v.shape))

    # Feeds (CheckFeeds).
    fed, slots, multi_slots = set(), set(), set()
    dense = labels = 0
    for f in mf.feeds:
        v = vars_by_name.get(f.var)
        if v is None:
            _refuse("feed %r names no variable of the forward program", f.var)
        if v.persistable:
            _refuse("feed %r is a parameter", f.var)
        if f.var in fed:
            _refuse("feed %r is bound twice", f.var)
        fed.add(f.var)
        batch_first = len(v.shape) >= 1 and v.shape[0] == -1
        if f.source == FB.DENSE:
            dense += 1
            if dense > 1:
                _refuse("feed %r: a second DENSE feed (one holds all dense features)", f.var)
            if v.dtype != fw.FLOAT32 or len(v.shape) != 2 or not batch_first or v.shape[1] < 1:
                _refuse("DENSE feed %r is %s; it must be float32 [-1, num_dense]", f.var,
                        describe(v))
        elif f.source in (FB.SLOT, FB.MULTI_SLOT):
            multi = f.source == FB.MULTI_SLOT
            kind, bound = ("multi-hot slot", multi_slots) if multi else ("slot", slots)
            if f.slot < 0:
                _refuse("feed %r: %s %d < 0", f.var, kind, f.slot)
            if f.slot in bound:
                _refuse("feed %r: %s %d is bound twice", f.var, kind, f.slot)
            bound.add(f.slot)
            if f.id_modulo < 0:
                _refuse("feed %r: id_modulo %d < 0", f.var, f.id_modulo)
            if v.dtype != fw.INT64 or len(v.shape) != 2 or not batch_first or v.shape[1] != 1:
                _refuse("%s feed %r is %s; it must be int64 [-1, 1]%s",
                        "MULTI_SLOT" if multi else "SLOT", f.var, describe(v),
                        " (every id of the batch, one sequence per example)" if multi else "")
        elif f.source == FB.LABEL:
            labels += 1
            if labels > 1:
                _refuse("feed %r: a second LABEL feed", f.var)
            if (v.dtype not in (fw.FLOAT32, fw.FLOAT64, fw.INT64) or len(v.shape) != 2 or
                    not batch_first or v.shape[1] != 1):
                _refuse("LABEL feed %r is %s; it must be float32, float64 or int64 [-1, 1]",
                        f.var, describe(v))
        else:
            _refuse("feed %r has unknown source %d", f.var, f.source)
    if labels == 0:
        _refuse("no LABEL feed (declare the label with layers.data(..., feed='label'))")
    for expect, s in enumerate(sorted(slots)):
        if s != expect:
            _refuse("SLOT feeds must bind slots 0..%d with none missing; slot %d is not bound",
                    len(slots) - 1, expect)
    for expect, s in enumerate(sorted(multi_slots)):
        if s != expect:
            _refuse("MULTI_SLOT feeds must bind multi-hot slots 0..%d with none missing; "
                    "multi-hot slot %d is not bound", len(multi_slots) - 1, expect)

    # Graph (CheckGraph).
    def op_name(op, i):
        return "op %d (%s)" % (i, op.type)

    first_writer = {}
    for i, op in enumerate(block.ops):
        for out in fw.all_args(op.outputs):
            first_writer.setdefault(out, i)
    available = set(fed) | set(v.name for v in block.vars if v.persistable)
    forbidden_roles = fw.ROLE_BACKWARD | fw.ROLE_OPTIMIZE | fw.ROLE_RPC | fw.ROLE_DIST
    for i, op in enumerate(block.ops):
        role = fw.get_attr(op, fw.OP_ROLE_ATTR, fw.ROLE_FORWARD)
        if isinstance(role, int) and role & forbidden_roles:
            _refuse("%s has op_role %d; a model file holds forward ops only", op_name(op, i), role)
        for name in fw.all_args(op.inputs):
            if name == fw.EMPTY_VAR_NAME:
                continue
            if name not in vars_by_name:
                _refuse("%s reads %r, which the forward program does not declare",
                        op_name(op, i), name)
            if name in available:
                continue
            if name not in first_writer:
                _refuse("%s reads %r, which no op writes and no feed binds (bind it: "
                        "layers.data(..., feed=...) or save_model(feeds=...))", op_name(op, i),
                        name)
            w = first_writer[name]
            _refuse("cycle: %s reads %r, which %s writes later", op_name(op, i), name,
                    op_name(block.ops[w], w))
        for name in fw.all_args(op.outputs):
            if name == fw.EMPTY_VAR_NAME:
                continue
            if name not in vars_by_name:
                _refuse("%s writes %r, which the forward program does not declare",
                        op_name(op, i), name)
            if name in fed:
                _refuse("%s writes feed %r", op_name(op, i), name)
            available.add(name)
    initialized = set()
    for b in mf.startup.blocks:
        for op in b.ops:
            initialized.update(fw.all_args(op.outputs))
    for op in block.ops:
        if op.type != "lookup_table":
            continue
        w = vars_by_name.get(fw.op_inputs(op, "W")[0] if fw.op_inputs(op, "W") else "")
        if w is None or len(w.shape) != 2:
            _refuse("embedding %r must be a [rows, dim] parameter",
                    (fw.op_inputs(op, "W") or [""])[0])
    for v in block.vars:
        if not v.persistable:
            continue
        if any(d < 1 for d in v.shape):
            _refuse("parameter %r has shape %s; every dim of a parameter must be >= 1", v.name,
                    fw.shape_str(v.shape))
        if v.name not in initialized:
            _refuse("parameter %r has no initializer in the startup program", v.name)

    # Outputs (CheckOutputs).
    if not mf.loss:
        _refuse("no loss variable")
    loss = vars_by_name.get(mf.loss)
    if loss is None or mf.loss not in first_writer:
        _refuse("loss %r is not written by any forward op", mf.loss)
    numel = 1
    for d in loss.shape:
        numel *= d
    if loss.dtype != fw.FLOAT32 or len(loss.shape) > 1 or numel != 1:
        _refuse("loss %r is %s; it must be a float32 scalar [1] (take its mean)", mf.loss,
                describe(loss))
    if mf.prediction and (mf.prediction not in vars_by_name or
                          mf.prediction not in first_writer):
        _refuse("prediction %r is not written by any forward op", mf.prediction)
    for m in mf.metrics:
        if m not in METRICS:
            _refuse("metric %r is unknown (%s)", m, ", ".join(METRICS))
        if m in ("auc", "log_loss", "accuracy") and not mf.prediction:
            _refuse("metric %r needs a prediction variable", m)
        if m in ("auc", "log_loss"):
            p = vars_by_name[mf.prediction]
            if len(p.shape) != 2 or p.shape[1] != 1 or p.dtype not in fw.FLOAT_DTYPES:
                _refuse("metric %r needs a [-1, 1] probability as prediction; %r is %s", m,
                        mf.prediction, describe(p))

    # Optimizers (CheckOptimizers).
    _check_optimizer_values(mf.optimizer, "optimizer", False)
    tables = set(_input(op, "W") for op in block.ops if op.type == "lookup_table")
    own_types = {}
    for t in mf.table_optimizers:
        what = "table_optimizers %r" % t.table
        if t.table not in tables:
            _refuse("%s names no embedding table (the W of a lookup_table op)", what)
        if t.table in own_types:
            _refuse("%s is given twice", what)
        own_types[t.table] = t.optimizer.type
        _check_optimizer_values(t.optimizer, what + " optimizer", True)
    for v in block.vars:
        if v.is_distributed and own_types.get(v.name, mf.optimizer.type) == "momentum":
            _refuse("optimizer 'momentum' cannot update distributed table %r (distributed "
                    "tables support sgd, adagrad and adam)", v.name)
    return mf


def model_to_text(mf):
    """The text format of a ModelFile as written to disk: byte for byte what C++ writes."""
    return text_format_cc.message_to_string(mf)


def _write_atomic(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_model(path, loss=None, prediction=None, feeds=None, metrics=None, model=None,
               strict=False):
    """Checks the model and writes its model file to `path` (text format, atomically).

    loss: the minimized loss (default: the one optimizer.minimize recorded). prediction: the
    [-1, 1] probability for auc/log_loss (default: the input of layers.auc/accuracy, else none).
    feeds: a list of tessera.Feed replacing the bindings declared with layers.data. metrics:
    names from METRICS (default: those declared with layers.auc/accuracy). model: default the
    model of `loss`, else the default model. strict: refuse op types the C++ registry lacks
    (otherwise a warning). Returns the ModelFile message written.
    """
    if model is None:
        model = loss.model if isinstance(loss, fw.Variable) else fw.default_model()
    mf = build_model_file(model, loss=loss, prediction=prediction, metrics=metrics, feeds=feeds,
                          strict=strict)
    _write_atomic(os.fspath(path), model_to_text(mf))
    return mf


def load_model(path):
    """Reads a text-format model file into a tessera.ModelFile message (no checks)."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    mf = model_pb2.ModelFile()
    try:
        text_format.Parse(text, mf)
    except text_format.ParseError as e:
        raise ValueError("%s: %s" % (path, e))
    return mf
