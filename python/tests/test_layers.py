"""Layers: names, shapes, ops and attributes as the C++ layers make them; shape errors name the
layer and leave the model unchanged."""

import unittest

import testutil  # noqa: F401  (sets sys.path)
import tessera
from tessera import framework as fw
from tessera import layers


def state(model):
    """What a failed layer must not change."""
    return (model.main_program.desc.SerializeToString(),
            model.startup_program.desc.SerializeToString(), dict(model._counters))


class LayerTestCase(unittest.TestCase):

    def setUp(self):
        self.model = tessera.Model()
        self._guard = tessera.model_guard(self.model)
        self._guard.__enter__()

    def tearDown(self):
        self._guard.__exit__(None, None, None)

    def assertUnchangedAfter(self, regex, fn, *args, **kwargs):
        before = state(self.model)
        with self.assertRaisesRegex(ValueError, regex):
            fn(*args, **kwargs)
        self.assertEqual(state(self.model), before)

    def ops(self):
        return list(self.model.main_program.ops)


class FcTest(LayerTestCase):

    def test_names_shapes_and_attrs(self):
        x = layers.data("x", [-1, 4, 3])
        out = layers.fc(x, 5, act="relu")
        self.assertEqual(out.name, "relu.out_0")
        self.assertEqual(out.shape, (-1, 5))
        names = [v.name for v in self.model.main_program.vars]
        self.assertEqual(names, ["x", "fc_0.w", "fc_0.mul", "fc_0.b", "fc_0.pre_act",
                                 "relu.out_0"])
        self.assertEqual(self.model.var("fc_0.w").shape, (12, 5))  # flattened after dim 0
        mul, add, relu = self.ops()
        self.assertEqual((mul.type, testutil.attr_names(mul)), ("mul",
                                                                ["op_role", "x_num_col_dims"]))
        self.assertEqual(fw.get_attr(mul, "x_num_col_dims"), 1)
        self.assertEqual([(s.parameter, list(s.arguments)) for s in mul.inputs],
                         [("X", ["x"]), ("Y", ["fc_0.w"])])
        self.assertEqual((add.type, fw.get_attr(add, "axis")), ("elementwise_add", 1))
        self.assertEqual(relu.type, "relu")
        startup = self.model.startup_program.ops
        self.assertEqual([op.type for op in startup], ["uniform_random", "fill_constant"])
        self.assertEqual(layers.fc(x, 2).name, "fc_1.pre_act")

    def test_named_without_bias(self):
        x = layers.data("x", [-1, 3])
        out = layers.fc(x, 1, name="lin", bias_attr=False,
                        param_attr=tessera.initializer.Constant(0.0))
        self.assertEqual(out.name, "lin.mul")
        self.assertFalse(self.model.has_var("lin.b"))
        self.assertEqual(self.model.startup_program.ops[0].type, "fill_constant")
        self.assertEqual(self.model.peek_unique_name("fc"), "fc_0")  # a name takes no counter

    def test_errors_name_the_layer(self):
        x = layers.data("x", [-1])
        self.assertUnchangedAfter(r"^fc 'deep_fc_0': input 'x' float32 \[-1\] has 1 dims",
                                  layers.fc, x, 4, name="deep_fc_0")
        self.assertUnchangedAfter(r"^fc 'fc_0': input", layers.fc, x, 4)
        y = layers.data("y", [-1, 3])
        self.assertUnchangedAfter(r"^fc 'fc_0': size 0 < 1", layers.fc, y, 0)
        self.assertUnchangedAfter(r"^fc 'h': unknown act 'gelu'", layers.fc, y, 2, act="gelu",
                                  name="h")
        ids = layers.data("ids", [-1, 1], dtype="int64")
        self.assertUnchangedAfter(r"^fc 'fc_0': input 'ids' int64 .* must be float32",
                                  layers.fc, ids, 2)
        layers.fc(y, 2, name="taken")
        self.assertUnchangedAfter(r"^fc 'taken': variable 'taken.w' already exists",
                                  layers.fc, y, 2, name="taken")


class EmbeddingTest(LayerTestCase):

    def test_as_the_cpp_layer(self):
        ids = layers.data("slot_0", [-1, 1], dtype="int64", slot=0)
        out = layers.embedding(ids, size=[100, 8], is_sparse=True, name="emb_0")
        self.assertEqual((out.name, out.shape, out.dtype), ("emb_0.out_0", (-1, 8), "float32"))
        table = self.model.var("emb_0")
        self.assertTrue(table.is_parameter and table.is_sparse)
        self.assertFalse(table.is_distributed)
        self.assertFalse(self.model.startup_program.find_var("emb_0").is_sparse)  # as in C++
        op = self.ops()[0]
        self.assertEqual(op.type, "lookup_table")
        self.assertEqual([(s.parameter, list(s.arguments)) for s in op.inputs],
                         [("W", ["emb_0"]), ("Ids", ["slot_0"])])
        self.assertEqual(testutil.attr_names(op),
                         ["op_role", "is_sparse", "is_distributed", "padding_idx"])
        self.assertEqual([fw.get_attr(op, a) for a in ("is_sparse", "is_distributed",
                                                       "padding_idx")], [True, False, -1])
        init = self.model.startup_program.ops[0]
        self.assertEqual((fw.get_attr(init, "min"), fw.get_attr(init, "max")),
                         (tessera.initializer.float32(-0.05), tessera.initializer.float32(0.05)))

    def test_default_name_and_distributed(self):
        ids = layers.data("ids", [-1, 1], dtype="int64")
        out = layers.embedding(ids, size=[10, 2], is_distributed=True)
        self.assertEqual(out.name, "embedding_0.out_0")
        table = self.model.var("embedding_0")
        self.assertTrue(table.is_distributed and table.is_sparse)  # distributed implies sparse

    def test_shared_table(self):
        a = layers.data("a", [-1, 1], dtype="int64")
        b = layers.data("b", [-1, 1], dtype="int64")
        layers.embedding(a, size=[10, 2], name="shared")
        out = layers.embedding(b, size=[10, 2], name="shared")
        self.assertEqual(out.name, "shared.out_1")
        self.assertEqual(len(self.model.startup_program.ops), 1)
        self.assertUnchangedAfter("shared table must be a \\[10, 3\\]", layers.embedding, b,
                                  size=[10, 3], name="shared")

    def test_errors(self):
        ids = layers.data("ids", [-1, 1], dtype="int64")
        self.assertUnchangedAfter(r"^embedding 'emb': dim 0 < 1", layers.embedding, ids,
                                  size=[10, 0], name="emb")
        self.assertUnchangedAfter(r"^embedding 'embedding_0': rows 0 < 1", layers.embedding,
                                  ids, size=[0, 4])
        x = layers.data("x", [-1, 1])
        self.assertUnchangedAfter(r"^embedding 'e': ids 'x' float32 \[-1, 1\] must be int64",
                                  layers.embedding, x, size=[10, 4], name="e")
        self.assertUnchangedAfter("padding_idx 10 is outside", layers.embedding, ids,
                                  size=[10, 4], padding_idx=10)


class ElementwiseTest(LayerTestCase):

    def test_broadcast_error_names_the_layer(self):
        a = layers.data("a", [-1, 8])
        b = layers.data("b", [-1, 4])
        self.assertUnchangedAfter(
            r"^elementwise_add: shapes \[-1, 8\] and \[-1, 4\] do not broadcast",
            layers.elementwise_add, a, b)
        self.assertUnchangedAfter(r"^elementwise_mul: shapes \[-1, 8\] and \[-1, 4\]",
                                  layers.elementwise_mul, a, b)
        c = layers.data("c", [-1, 1])
        self.assertUnchangedAfter(r"^elementwise_sub: shapes \[-1, 1\] and \[-1, 8\]",
                                  layers.elementwise_sub, c, a)  # output would need y's shape

    def test_broadcasts_as_the_kernels(self):
        a = layers.data("a", [-1, 8])
        bias = self.model.create_parameter("bias", [8])
        s = layers.data("s", [-1, 1])
        out = layers.elementwise_add(a, bias)
        self.assertEqual((out.name, out.shape), ("elementwise_add.out_0", (-1, 8)))
        self.assertEqual(layers.elementwise_mul(a, s).shape, (-1, 8))  # per-row scalar
        self.assertEqual(layers.elementwise_mul(a, s, axis=0).shape, (-1, 8))
        self.assertEqual(layers.elementwise_add(a, bias, axis=1).shape, (-1, 8))
        with self.assertRaisesRegex(ValueError, "do not broadcast"):
            layers.elementwise_add(a, bias, axis=0)
        op = self.ops()[0]
        self.assertEqual((testutil.attr_names(op), fw.get_attr(op, "axis")),
                         (["op_role", "axis"], -1))

    def test_operators(self):
        a = layers.data("a", [-1, 2])
        b = layers.data("b", [-1, 2])
        self.assertEqual([(a + b).name, (a - b).name, (a * b).name],
                         ["elementwise_add.out_0", "elementwise_sub.out_0",
                          "elementwise_mul.out_0"])
        half = a * 0.5
        op = self.ops()[-1]
        self.assertEqual((half.name, fw.get_attr(op, "scale"), fw.get_attr(op, "bias")),
                         ("scale.out_0", 0.5, 0.0))

    def test_dtype_mismatch(self):
        a = layers.data("a", [-1, 2])
        b = layers.data("b", [-1, 2], dtype="float64")
        self.assertUnchangedAfter("different dtypes", layers.elementwise_add, a, b)


class ShapeOpsTest(LayerTestCase):

    def test_concat(self):
        a = layers.data("a", [-1, 3])
        b = layers.data("b", [-1, 5])
        out = layers.concat([a, b], axis=1)
        self.assertEqual((out.name, out.shape), ("concat.out_0", (-1, 8)))
        self.assertEqual(fw.get_attr(self.ops()[0], "axis"), 1)
        self.assertEqual(layers.concat([a, a], axis=0).shape, (-1, 3))  # batch stays -1
        self.assertUnchangedAfter(r"^concat: input 1 'b' float32 \[-1, 5\] does not match "
                                  r"input 0 'a' float32 \[-1, 3\] except along axis 0",
                                  layers.concat, [a, b], axis=0)
        self.assertUnchangedAfter(r"^concat: axis 2 is out of range", layers.concat, [a, b],
                                  axis=2)
        self.assertUnchangedAfter("^concat: input must be a non-empty list", layers.concat, [])

    def test_reshape(self):
        x = layers.data("x", [-1, 26, 8])
        out = layers.reshape(x, [-1, 208])
        self.assertEqual(out.shape, (-1, 208))
        op = self.ops()[0]
        self.assertEqual((testutil.attr_names(op), fw.get_attr(op, "shape")),
                         (["op_role", "shape"], [-1, 208]))
        self.assertEqual(layers.reshape(x, [0, 13, 16]).shape, (-1, 13, 16))
        self.assertEqual(fw.get_attr(self.ops()[1], "shape"), [0, 13, 16])
        w = self.model.create_parameter("w", [4, 6])
        self.assertEqual(layers.reshape(w, [3, -1]).shape, (3, 8))
        self.assertUnchangedAfter(r"^reshape: x 'x' float32 \[-1, 26, 8\] cannot be reshaped "
                                  r"to \[-1, 100\]", layers.reshape, x, [-1, 100])
        self.assertUnchangedAfter("more than one -1", layers.reshape, x, [-1, -1])

    def test_cast_mean_sums(self):
        ids = layers.data("ids", [-1, 1], dtype="int64")
        f = layers.cast(ids, "float32")
        op = self.ops()[0]
        self.assertEqual((f.name, f.dtype, fw.get_attr(op, "out_dtype")),
                         ("cast.out_0", "float32", fw.FLOAT32))
        m = layers.mean(f)
        self.assertEqual((m.name, m.shape), ("mean.out_0", (1,)))
        s = layers.sums([f, f], name="total")
        self.assertEqual((s.name, self.ops()[-1].type, self.ops()[-1].inputs[0].arguments[:]),
                         ("total", "sum", ["cast.out_0", "cast.out_0"]))
        g = layers.data("g", [-1, 2])
        self.assertUnchangedAfter(r"^sums: input 1 'g' float32 \[-1, 2\] differs", layers.sums,
                                  [f, g])

    def test_reduce(self):
        x = layers.data("x", [-1, 4, 3])
        out = layers.reduce_sum(x, dim=-1, keep_dim=True)
        self.assertEqual((out.name, out.shape), ("reduce_sum.out_0", (-1, 4, 1)))
        op = self.ops()[0]
        self.assertEqual(testutil.attr_names(op), ["op_role", "dim", "keep_dim", "reduce_all"])
        self.assertEqual([fw.get_attr(op, a) for a in ("dim", "keep_dim", "reduce_all")],
                         [[2], True, False])
        self.assertEqual(layers.reduce_mean(x, dim=[1, 2]).shape, (-1,))
        total = layers.reduce_sum(x)
        self.assertEqual((total.shape, fw.get_attr(self.ops()[-1], "reduce_all"),
                          fw.get_attr(self.ops()[-1], "dim")), ((1,), True, [0, 1, 2]))
        self.assertUnchangedAfter(r"^reduce_sum: axis 3 is out of range", layers.reduce_sum, x,
                                  dim=3)

    def test_matmul_and_dot(self):
        x = layers.data("x", [-1, 4, 3])
        w = self.model.create_parameter("w", [3, 5])
        out = layers.matmul(x, w)
        self.assertEqual(out.shape, (-1, 4, 5))
        self.assertEqual(testutil.attr_names(self.ops()[0]),
                         ["op_role", "transpose_X", "transpose_Y", "alpha"])
        self.assertEqual(layers.matmul(x, x, transpose_y=True).shape, (-1, 4, 4))
        self.assertUnchangedAfter(r"^matmul: .* disagree in the inner dimension: 3 vs 4",
                                  layers.matmul, x, x)
        a = layers.data("a", [-1, 6])
        d = layers.dot(a, a)
        self.assertEqual(d.shape, (-1, 1))
        self.assertEqual([op.type for op in self.ops()[-2:]], ["elementwise_mul", "reduce_sum"])

    def test_dropout_and_sequence_pool(self):
        x = layers.data("x", [-1, 5, 4])
        d = layers.dropout(x, dropout_prob=0.25)
        op = self.ops()[0]
        self.assertEqual((d.name, [s.parameter for s in op.outputs]), ("dropout.out_0",
                                                                       ["Out", "Mask"]))
        self.assertEqual(testutil.attr_names(op), ["op_role", "dropout_prob", "is_test", "seed",
                                                   "dropout_implementation"])
        self.assertEqual(fw.get_attr(op, "seed"),
                         self.model.seed_for("dropout.out_0") & fw.SEED_MASK)
        self.assertUnchangedAfter("dropout_prob 1.0", layers.dropout, x, dropout_prob=1.0)
        # sequence_pool pools sequences (lod_level 1), not a padded [-1, L, D].
        self.assertUnchangedAfter(r"^sequence_pool: input 'dropout.out_0' float32 \[-1, 5, 4\] "
                                  r"must be \[-1, D\]", layers.sequence_pool, d, "sum")


class ImageLayersTest(LayerTestCase):
    """conv2d, pool2d, flatten and batch_norm: names, shapes and attrs as the C++ layers."""

    def test_lenet_shapes(self):
        x = layers.data("x", [-1, 1, 28, 28])
        c = layers.conv2d(x, 20, 5, act="relu", name="conv1")
        self.assertEqual((c.name, list(c.shape)), ("relu.out_0", [-1, 20, 24, 24]))
        w = self.model.var("conv1.w")
        self.assertEqual(list(w.shape), [20, 1, 5, 5])
        p = layers.pool2d(c, 2, "max")
        self.assertEqual((p.name, list(p.shape)), ("pool2d.out_0", [-1, 20, 12, 12]))
        c2 = layers.conv2d(p, 50, 5, stride=2, padding=1, dilation=2)
        self.assertEqual(list(c2.shape), [-1, 50, 3, 3])  # (12 + 2 - 9) // 2 + 1
        f = layers.flatten(c2)
        self.assertEqual((f.name, list(f.shape)), ("flatten.out_0", [-1, 450]))
        types = [op.type for op in self.ops()]
        self.assertEqual(types, ["conv2d", "elementwise_add", "relu", "pool2d", "conv2d",
                                 "elementwise_add", "flatten"])
        conv = self.ops()[4]
        self.assertEqual(testutil.attr_names(conv), ["op_role", "strides", "paddings",
                                                     "dilations"])
        self.assertEqual([fw.get_attr(conv, a) for a in ("strides", "paddings", "dilations")],
                         [[2, 2], [1, 1], [2, 2]])
        self.assertEqual(fw.get_attr(self.ops()[3], "pooling_type"), "max")

    def test_batch_norm(self):
        x = layers.data("x", [-1, 3, 8, 8])
        y = layers.batch_norm(x, act="relu", name="bn")
        self.assertEqual(list(y.shape), [-1, 3, 8, 8])
        op = self.ops()[0]
        self.assertEqual(op.type, "batch_norm")
        self.assertEqual([a for s in op.outputs for a in s.arguments],
                         ["bn.out_0", "bn.mean", "bn.variance", "bn.saved_mean",
                          "bn.saved_variance"])
        self.assertTrue(self.model.var("bn.scale").trainable)
        self.assertTrue(self.model.var("bn.mean").persistable)
        self.assertFalse(self.model.var("bn.mean").trainable)

    def test_accuracy_of_class_scores(self):
        x = layers.data("x", [-1, 1, 4, 4], feed=None)
        label = layers.data("label", [-1, 1], dtype="int64", feed="label")
        scores = layers.fc(layers.flatten(x), 10)
        m = layers.accuracy(scores, label)
        self.assertEqual((m.name, self.model.prediction, self.model.metrics),
                         ("accuracy", scores.name, ["accuracy"]))

    def test_bad_arguments_change_nothing(self):
        x = layers.data("x", [-1, 1, 4, 4])
        self.assertUnchangedAfter("is larger than input", layers.conv2d, x, 2, 5)
        self.assertUnchangedAfter("pool_type 'median'", layers.pool2d, x, 2, "median")
        self.assertUnchangedAfter("must be smaller than pool_size", layers.pool2d, x, 2,
                                  pool_padding=2)
        self.assertUnchangedAfter(r"axis 5 must be in \[0, 4\]", layers.flatten, x, 5)
        flat = layers.data("flat", [-1, 16])
        self.assertUnchangedAfter(r"must be \[-1, C, H, W\]", layers.conv2d, flat, 2, 3)


class LodTest(LayerTestCase):
    """Multi-hot inputs (lod_level 1): declared with layers.data, kept by embedding and row-wise
    layers, pooled by sequence_pool; never mixed with per-example tensors."""

    def multi_hot(self, name="m0", slot=0, dim=4, table=None):
        ids = layers.data(name, [-1, 1], dtype="int64", slot=slot, lod_level=1)
        return ids, layers.embedding(ids, size=[100, dim], is_sparse=True, name=table)

    def test_data_and_propagation(self):
        ids, emb = self.multi_hot(table="t")
        self.assertEqual((ids.lod_level, ids.lod_source, ids.is_data), (1, "m0", True))
        self.assertEqual([(f.var_name, f.source, f.slot) for f in self.model.feeds],
                         [("m0", "multi_slot", 0)])
        # embedding keeps the sequences: one row per id ...
        self.assertEqual((emb.name, emb.shape, emb.lod_level, emb.lod_source),
                         ("t.out_0", (-1, 4), 1, "m0"))
        self.assertIn("lod_level=1", repr(emb))
        other = layers.embedding(ids, size=[100, 2], name="u")
        self.assertEqual((other.lod_level, other.lod_source), (1, "m0"))
        # ... and sequence_pool makes one row per example.
        pooled = layers.sequence_pool(emb, "sum")
        self.assertEqual((pooled.name, pooled.shape, pooled.lod_level, pooled.lod_source),
                         ("sequence_pool.out_0", (-1, 4), 0, None))
        self.assertEqual(layers.fc(pooled, 2, act="relu").lod_level, 0)
        # Per-example inputs and their embeddings stay lod_level 0.
        s0 = layers.data("s0", [-1, 1], dtype="int64", slot=0)
        self.assertEqual((s0.lod_level, layers.embedding(s0, size=[9, 2]).lod_level), (0, 0))

    def test_only_embedding_and_sequence_pool_take_per_id_tensors(self):
        # The runners keep the sequences through lookup_table alone: any other layer on a per-id
        # tensor would give one sequence_pool cannot pool, so it is refused.
        _, emb = self.multi_hot(table="t")
        only = (r"is per id \(lod_level 1: one row per id of multi-hot input 'm0'\); only "
                r"embedding and sequence_pool take per-id tensors: pool it with sequence_pool "
                r"first")
        w = self.model.create_parameter("w", [4, 2])
        p = self.model.create_parameter("p", [4])
        calls = [
            ("fc 'fc_0': input 't.out_0' ", layers.fc, (emb, 3)),
            ("relu: x 't.out_0' ", layers.relu, (emb,)),
            ("sigmoid: x ", layers.sigmoid, (emb,)),
            ("tanh: x ", layers.tanh, (emb,)),
            ("scale: x ", layers.scale, (emb, 2.0)),
            ("cast: x ", layers.cast, (emb, "float64")),
            ("reshape: x ", layers.reshape, (emb, [-1, 2, 2])),
            ("dropout: x ", layers.dropout, (emb,)),
            ("mean: x ", layers.mean, (emb,)),
            ("reduce_sum: input ", layers.reduce_sum, (emb,)),
            ("reduce_mean: input ", layers.reduce_mean, (emb, 1)),
            ("elementwise_add: x ", layers.elementwise_add, (emb, emb)),
            ("elementwise_mul: x ", layers.elementwise_mul, (emb, p)),
            ("sums: input 0 ", layers.sums, ([emb, emb],)),
            ("concat: input 0 ", layers.concat, ([emb, emb], 1)),
            ("matmul: x ", layers.matmul, (emb, w)),
            ("dot: x ", layers.dot, (emb, emb)),
        ]
        for prefix, fn, args in calls:
            self.assertUnchangedAfter("^" + prefix + ".*" + only, fn, *args)
        self.assertUnchangedAfter("^cast: x 'm0' " + only, layers.cast, "m0", "float32")

    def test_sequence_pool_op(self):
        _, emb = self.multi_hot()
        for i, (given, attr) in enumerate([("sum", "SUM"), ("AVERAGE", "AVERAGE"),
                                           ("Sqrt", "SQRT"), ("max", "MAX")]):
            out = layers.sequence_pool(emb, given)
            op = self.ops()[-1]
            self.assertEqual(out.name, "sequence_pool.out_%d" % i)
            self.assertEqual((op.type, testutil.attr_names(op), fw.get_attr(op, "pooltype")),
                             ("sequence_pool", ["op_role", "pooltype"], attr))
            self.assertEqual([(s.parameter, list(s.arguments)) for s in op.inputs],
                             [("X", [emb.name])])
            self.assertEqual([(s.parameter, list(s.arguments)) for s in op.outputs],
                             [("Out", [out.name])])
        named = layers.sequence_pool(emb, "sum", name="pooled")
        self.assertEqual((named.name, self.model.peek_unique_name("sequence_pool.out")),
                         ("pooled", "sequence_pool.out_4"))

    def test_sequence_pool_errors(self):
        _, emb = self.multi_hot()
        dense = layers.data("dense", [-1, 4], feed="dense")
        self.assertUnchangedAfter(r"^sequence_pool: input 'dense' float32 \[-1, 4\] has "
                                  r"lod_level 0 .*lod_level=1", layers.sequence_pool, dense, "sum")
        self.assertUnchangedAfter(r"^sequence_pool: pool_type 'median' is not one of sum, "
                                  r"average, sqrt, max", layers.sequence_pool, emb, "median")
        for kind in ("first", "last", None):
            self.assertUnchangedAfter("^sequence_pool: pool_type", layers.sequence_pool, emb,
                                      kind)
        wide = layers.embedding(layers.data("m9", [-1, 1], dtype="int64", lod_level=1),
                                size=[10, 4], dtype="float64", name="wide")
        self.assertUnchangedAfter(r"^sequence_pool: input 'wide.out_0' float64 .* must be "
                                  "float32", layers.sequence_pool, wide, "sum")
        pooled = layers.sequence_pool(emb, "sum")
        self.assertUnchangedAfter(r"^sequence_pool: input 'sequence_pool.out_0' .* lod_level 0",
                                  layers.sequence_pool, pooled, "sum")

    def test_mixing_per_id_and_per_example_tensors(self):
        _, emb = self.multi_hot(table="t")
        dense = layers.data("dense", [-1, 4], feed="dense")
        label = layers.data("label", [-1, 1], feed="label")
        mixed = (r"is per id \(lod_level 1: one row per id of multi-hot input 'm0'\) but %s "
                 r"is per example \(lod_level 0\); pool it with sequence_pool first")
        self.assertUnchangedAfter("^concat: input 0 't.out_0' " + mixed % "input 1 'dense'",
                                  layers.concat, [emb, dense], axis=1)
        self.assertUnchangedAfter("^concat: input 1 't.out_0' " + mixed % "input 0 'dense'",
                                  layers.concat, [dense, emb], axis=1)
        for fn in (layers.elementwise_add, layers.elementwise_sub, layers.elementwise_mul):
            name = fn.__name__
            self.assertUnchangedAfter("^%s: x 't.out_0' " % name + mixed % "y 'dense'", fn, emb,
                                      dense)
            self.assertUnchangedAfter("^%s: y 't.out_0' " % name + mixed % "x 'dense'", fn, dense,
                                      emb)
        self.assertUnchangedAfter("^sums: input 0 't.out_0' " + mixed % "input 1 'dense'",
                                  layers.sums, [emb, dense])
        self.assertUnchangedAfter("^matmul: x 't.out_0' " + mixed % "y 'dense'", layers.matmul,
                                  emb, dense, transpose_y=True)
        one = layers.embedding("m0", size=[100, 1], name="one")
        self.assertUnchangedAfter("^sigmoid_cross_entropy_with_logits: x 'one.out_0' " +
                                  mixed % "label 'label'",
                                  layers.sigmoid_cross_entropy_with_logits, one, label)
        self.assertUnchangedAfter("^square_error_cost: input 'one.out_0' " +
                                  mixed % "label 'label'", layers.square_error_cost, one, label)
        self.assertUnchangedAfter("^auc: input 'one.out_0' " + mixed % "label 'label'",
                                  layers.auc, one, label)
        # Per-id tensors of two multi-hot inputs (different row counts) do not mix either.
        _, other = self.multi_hot("m1", slot=1, table="u")
        self.assertUnchangedAfter(r"^elementwise_add: x 't.out_0' is per id .* 'm0'\); only "
                                  "embedding and sequence_pool", layers.elementwise_add, emb,
                                  other)
        # Pooled, they mix freely.
        joined = layers.concat([layers.sequence_pool(emb, "sum"),
                                layers.sequence_pool(other, "max"), dense], axis=1)
        self.assertEqual((joined.shape, joined.lod_level), ((-1, 12), 0))
        self.assertEqual(layers.elementwise_add(layers.sequence_pool(one, "sqrt"), label).shape,
                         (-1, 1))

    def test_data_lod_level(self):
        ids = layers.data("m", [-1, 1], dtype="int64", feed="multi_slot", slot=0)
        self.assertEqual(ids.lod_level, 1)  # feed="multi_slot" implies lod_level 1
        free = layers.data("free", [-1, 1], dtype="int64", lod_level=1)
        self.assertEqual((free.lod_level, self.model.feeds[-1].var_name), (1, "m"))
        self.assertUnchangedAfter(r"^data 'x': a lod_level 1 input is a multi-hot slot's ids, "
                                  r"int64 \[-1, 1\]; got float32 \[-1, 4\]", layers.data, "x",
                                  [-1, 4], lod_level=1)
        self.assertUnchangedAfter(r"^data 'x': a lod_level 1 input .* got int64 \[-1, 2\]",
                                  layers.data, "x", [-1, 2], dtype="int64", slot=1, lod_level=1)
        self.assertUnchangedAfter("^data 'x': lod_level 2 is not supported", layers.data, "x",
                                  [-1, 1], dtype="int64", lod_level=2)
        self.assertUnchangedAfter("^data 'x': a multi_slot feed is a lod_level 1 input",
                                  layers.data, "x", [-1, 1], dtype="int64", feed="multi_slot",
                                  slot=1, lod_level=0)
        self.assertUnchangedAfter("^data 'x': a lod_level 1 input is fed by a multi-hot slot",
                                  layers.data, "x", [-1, 1], dtype="int64", feed="slot", slot=1,
                                  lod_level=1)
        self.assertUnchangedAfter("^data 'x': multi-hot slot 0 is already bound to 'm'",
                                  layers.data, "x", [-1, 1], dtype="int64", slot=0, lod_level=1)
        # Categorical slot 0 and multi-hot slot 0 are different columns.
        s0 = layers.data("s0", [-1, 1], dtype="int64", slot=0)
        self.assertEqual((s0.lod_level, [f.source for f in self.model.feeds]),
                         (0, ["multi_slot", "slot"]))
        self.assertUnchangedAfter("^data 'x': slot 0 is already bound to 's0'", layers.data, "x",
                                  [-1, 1], dtype="int64", slot=0)
        self.assertUnchangedAfter("^reshape: x 'm' is per id", layers.reshape, ids, [1, -1])


class LossTest(LayerTestCase):

    def test_softmax_with_cross_entropy(self):
        logits = layers.data("logits", [-1, 10])
        label = layers.data("label", [-1, 1], dtype="int64")
        loss, sm = layers.softmax_with_cross_entropy(logits, label, return_softmax=True)
        self.assertEqual((sm.name, sm.shape, loss.name, loss.shape),
                         ("softmax.out_0", (-1, 10), "cross_entropy.out_0", (-1, 1)))
        op = self.ops()[0]
        self.assertEqual([s.parameter for s in op.outputs], ["Softmax", "Loss"])
        self.assertEqual(testutil.attr_names(op), ["op_role"])
        bad = layers.data("bad", [-1, 1])
        self.assertUnchangedAfter("^softmax_with_cross_entropy: label 'bad' float32",
                                  layers.softmax_with_cross_entropy, logits, bad)

    def test_sigmoid_ce_and_square_error(self):
        x = layers.data("x", [-1, 1])
        y = layers.data("y", [-1, 1])
        self.assertEqual(layers.sigmoid_cross_entropy_with_logits(x, y).name, "sigmoid_ce.out_0")
        self.assertEqual(layers.square_error_cost(x, y).name, "square_error.out_0")
        self.assertEqual([op.type for op in self.ops()],
                         ["sigmoid_cross_entropy_with_logits", "square_error"])
        z = layers.data("z", [-1, 2])
        self.assertUnchangedAfter("^square_error_cost: input 'z' float32 \\[-1, 2\\] and label",
                                  layers.square_error_cost, z, y)
        self.assertUnchangedAfter("^sigmoid_cross_entropy_with_logits: x 'z'",
                                  layers.sigmoid_cross_entropy_with_logits, z, y)


class DataAndMetricTest(LayerTestCase):

    def test_data(self):
        x = layers.data("x", [-1, 13], feed="dense")
        self.assertTrue(x.stop_gradient and x.is_data)
        self.assertFalse(x.persistable)
        self.assertUnchangedAfter("already exists", layers.data, "x", [-1, 1])
        self.assertUnchangedAfter(r"^data 's': a slot feed must be int64 \[-1, 1\]", layers.data,
                                  "s", [-1, 1], slot=0)
        self.assertUnchangedAfter("^data 'd2': the model already has a dense feed", layers.data,
                                  "d2", [-1, 2], feed="dense")
        layers.data("s0", [-1, 1], dtype="int64", slot=0)
        self.assertUnchangedAfter("slot 0 is already bound", layers.data, "s1", [-1, 1],
                                  dtype="int64", slot=0)
        self.assertUnchangedAfter("dims are >= 1 or -1", layers.data, "z", [-1, 0])

    def test_metrics(self):
        label = layers.data("label", [-1, 1], feed="label")
        p = layers.sigmoid(layers.data("x", [-1, 1]))
        m = layers.auc(p, label)
        self.assertEqual((m.name, self.model.prediction, self.model.metrics),
                         ("auc", p.name, ["auc"]))
        layers.accuracy(p, label)
        self.assertEqual(self.model.metrics, ["auc", "accuracy"])
        self.assertEqual(len(self.ops()), 1)  # metrics add no ops
        q = layers.sigmoid(p)
        with self.assertRaisesRegex(ValueError, "prediction is already"):
            layers.auc(q, label)

    def test_inputs_of_two_models(self):
        other = tessera.Model()
        a = layers.data("a", [-1, 2])
        b = layers.data("b", [-1, 2], model=other)
        with self.assertRaisesRegex(ValueError, "different models"):
            layers.elementwise_add(a, b)


if __name__ == "__main__":
    unittest.main()
