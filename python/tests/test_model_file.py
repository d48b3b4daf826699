"""Model files: building, checking (as the C++ loader would), saving atomically, loading back;
optimizer configurations."""

import os
import tempfile
import unittest
import warnings

import testutil
import tessera
from tessera import layers
from tessera.proto import model_pb2

FB = model_pb2.FeedBinding


class SaveLoadTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "model.pbtxt")

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip(self):
        model = testutil.small_model()
        written = model.save(self.path)
        loaded = tessera.load_model(self.path)
        self.assertEqual(loaded, written)
        self.assertEqual(loaded.format_version, 1)
        self.assertEqual(loaded.forward, model.main_program.desc)
        self.assertEqual(loaded.startup, model.startup_program.desc)
        self.assertEqual((loaded.loss, loaded.prediction, list(loaded.metrics)),
                         ("mean.out_0", "sigmoid.out_0", ["auc"]))
        self.assertEqual(loaded.optimizer.type, "adam")
        self.assertAlmostEqual(loaded.optimizer.learning_rate, 0.01, places=6)
        with open(self.path) as f:
            text = f.read()
        self.assertTrue(text.startswith("format_version: 1\n"))
        tessera.check_model_file(loaded)  # what was written passes the checks again

    def test_write_is_atomic_and_replaces(self):
        with open(self.path, "w") as f:
            f.write("old")
        tessera.save_model(self.path, model=testutil.small_model())
        self.assertEqual(os.listdir(self.dir.name), ["model.pbtxt"])  # no temporary left
        with open(self.path) as f:
            self.assertTrue(f.read().startswith("format_version: 1"))
        # A failed check writes nothing.
        os.remove(self.path)
        bare = tessera.Model()
        with self.assertRaisesRegex(ValueError, "no loss"):
            tessera.save_model(self.path, model=bare)
        self.assertEqual(os.listdir(self.dir.name), [])

    def test_unwritable_path_leaves_no_temporary(self):
        target = os.path.join(self.dir.name, "sub")
        os.mkdir(target)  # renaming a file over a directory fails
        with self.assertRaises(OSError):
            tessera.save_model(target, model=testutil.small_model())
        self.assertEqual(os.listdir(self.dir.name), ["sub"])

    def test_load_reports_the_path(self):
        with open(self.path, "w") as f:
            f.write("format_version: x\n")
        with self.assertRaisesRegex(ValueError, "model.pbtxt"):
            tessera.load_model(self.path)


class FeedTest(unittest.TestCase):

    def test_canonical_order_and_id_modulo(self):
        mf = testutil.small_model(rows=50).to_proto()
        self.assertEqual([(f.var, f.source, f.slot, f.id_modulo) for f in mf.feeds],
                         [("dense", FB.DENSE, 0, 0), ("s0", FB.SLOT, 0, 50),
                          ("s1", FB.SLOT, 1, 50), ("label", FB.LABEL, 0, 0)])
        mf = testutil.small_model(distributed=True).to_proto()
        self.assertEqual([f.id_modulo for f in mf.feeds if f.source == FB.SLOT], [0, 0])

    def test_declaration_order_does_not_matter(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            s1 = layers.data("s1", [-1, 1], dtype="int64", slot=1)
            y = layers.data("y", [-1, 1], feed="label")
            s0 = layers.data("s0", [-1, 1], dtype="int64", slot=0)
            e = layers.concat([layers.embedding(s, size=[7, 2], name="e%d" % i)
                               for i, s in enumerate([s0, s1])], axis=1)
            loss = layers.mean(layers.square_error_cost(layers.fc(e, 1), y))
            tessera.optimizer.SGD(0.1).minimize(loss)
        mf = m.to_proto(metrics=["mse"])
        self.assertEqual([f.var for f in mf.feeds], ["s0", "s1", "y"])
        self.assertEqual([f.id_modulo for f in mf.feeds[:2]], [7, 7])

    def test_id_modulo_conflicts(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            y = layers.data("y", [-1, 1], feed="label")
            s = layers.data("s", [-1, 1], dtype="int64", slot=0)
            a = layers.embedding(s, size=[10, 2], name="a")
            b = layers.embedding(s, size=[20, 2], name="b")
            loss = layers.mean(layers.square_error_cost(layers.fc(layers.concat([a, b], 1), 1),
                                                        y))
            tessera.optimizer.SGD(0.1).minimize(loss)
        with self.assertRaisesRegex(ValueError, "local tables of different sizes"):
            m.to_proto()
        feeds = [tessera.Feed.label(y), tessera.Feed.slot_of(s, 0, id_modulo=10)]
        self.assertEqual(m.to_proto(feeds=feeds).feeds[0].id_modulo, 10)
        with self.assertRaisesRegex(ValueError, "outside \\[0, 10\\) of local table 'a'"):
            m.to_proto(feeds=[tessera.Feed.label(y), tessera.Feed.slot_of(s, 0, id_modulo=20)])

    def test_check_refusals(self):
        m = testutil.small_model()
        with self.assertRaisesRegex(ValueError, "no LABEL feed"):
            m.to_proto(feeds=[tessera.Feed.dense("dense"), tessera.Feed.slot_of("s0", 0),
                              tessera.Feed.slot_of("s1", 1)])
        with self.assertRaisesRegex(ValueError, "op 0 \\(lookup_table\\) reads 's0', which no "
                                    "op writes and no feed binds"):
            m.to_proto(feeds=[tessera.Feed.dense("dense"), tessera.Feed.label("label"),
                              tessera.Feed.slot_of("s1", 0)])
        with self.assertRaisesRegex(ValueError, "slots 0..1 with none missing; slot 0"):
            m.to_proto(feeds=[tessera.Feed.dense("dense"), tessera.Feed.label("label"),
                              tessera.Feed.slot_of("s0", 1), tessera.Feed.slot_of("s1", 2)])
        with self.assertRaisesRegex(ValueError, "metric 'recall' is unknown"):
            m.to_proto(metrics=["recall"])
        with self.assertRaisesRegex(ValueError, "differs from the loss"):
            m.to_proto(loss="sigmoid.out_0")

    def test_metric_needs_prediction(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            x = layers.data("x", [-1, 2], feed="dense")
            y = layers.data("y", [-1, 1], feed="label")
            loss = layers.mean(layers.square_error_cost(layers.fc(x, 1), y))
            tessera.optimizer.SGD(0.1).minimize(loss)
        with self.assertRaisesRegex(ValueError, "metric 'auc' needs a prediction"):
            m.to_proto(metrics=["auc"])
        self.assertEqual(list(m.to_proto(metrics=["mse"]).metrics), ["mse"])
        self.assertEqual(m.to_proto().prediction, "")

    def test_check_model_file_on_edited_files(self):
        mf = testutil.small_model().to_proto()
        mf.format_version = 2
        with self.assertRaisesRegex(ValueError, "format_version is 2"):
            tessera.check_model_file(mf)
        mf = testutil.small_model().to_proto()
        mf.forward.blocks[0].ops[0].attrs[0].i = 1  # op_role backward
        with self.assertRaisesRegex(ValueError, "forward ops only"):
            tessera.check_model_file(mf)
        mf = testutil.small_model().to_proto()
        del mf.startup.blocks[0].ops[0]
        with self.assertRaisesRegex(ValueError, "parameter 't0' has no initializer"):
            tessera.check_model_file(mf)

    def test_unregistered_ops_warn_or_refuse(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            x = layers.data("x", [-1, 4], feed="dense")
            y = layers.data("y", [-1, 1], feed="label")
            h = layers.dropout(layers.fc(x, 4), dropout_prob=0.1)
            soft = m.create_var("soft.out_0", h.shape, h.dtype)
            m.append_op("softsign", [("X", [h])], [("Out", [soft])], [])
            pred = layers.reduce_sum(soft, dim=1, keep_dim=True)
            tessera.optimizer.SGD(0.1).minimize(layers.mean(layers.square_error_cost(pred, y)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mf = m.to_proto()
        # dropout and reduce_sum are registered.
        self.assertEqual(tessera.unregistered_ops(mf), ["softsign"])
        self.assertTrue(any("softsign" in str(w.message) for w in caught))
        with self.assertRaisesRegex(ValueError, "softsign"):
            m.to_proto(strict=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            testutil.small_model().to_proto()
        self.assertEqual(caught, [])


def multi_hot_model(num_multi=2, rows=30, distributed=False):
    """A model with a dense input, categorical slot 0 and `num_multi` multi-hot slots."""
    m = tessera.Model()
    with tessera.model_guard(m):
        dense = layers.data("dense", [-1, 3], feed="dense")
        y = layers.data("y", [-1, 1], feed="label")
        s0 = layers.data("s0", [-1, 1], dtype="int64", slot=0)
        parts = [layers.embedding(s0, size=[rows, 2], name="e_s0"), dense]
        for k in range(num_multi):
            ids = layers.data("m%d" % k, [-1, 1], dtype="int64", slot=k, lod_level=1)
            e = layers.embedding(ids, size=[rows, 2], is_sparse=True, is_distributed=distributed,
                                 name="e_m%d" % k)
            parts.append(layers.sequence_pool(e, "average"))
        logit = layers.fc(layers.concat(parts, axis=1), 1)
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, y))
        layers.auc(layers.sigmoid(logit), y)
        tessera.optimizer.Adagrad(0.1).minimize(loss)
    return m


class MultiSlotFeedTest(unittest.TestCase):
    """MULTI_SLOT feeds: written after the SLOTs, with slot and id_modulo; indices checked apart
    from the SLOTs'; only int64 [-1, 1] lod_level 1 variables."""

    def test_saved_bindings(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "m.pbtxt")
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # sequence_pool is registered: no warning
                written = multi_hot_model(rows=30).save(path)
            loaded = tessera.load_model(path)
            with open(path) as f:
                text = f.read()
        self.assertEqual(loaded, written)
        self.assertEqual([(f.var, f.source, f.slot, f.id_modulo) for f in loaded.feeds],
                         [("dense", FB.DENSE, 0, 0), ("s0", FB.SLOT, 0, 30),
                          ("m0", FB.MULTI_SLOT, 0, 30), ("m1", FB.MULTI_SLOT, 1, 30),
                          ("y", FB.LABEL, 0, 0)])
        self.assertIn('feeds {\n  var: "m1"\n  source: MULTI_SLOT\n  slot: 1\n  id_modulo: 30\n}',
                      text)
        pools = [op for op in loaded.forward.blocks[0].ops if op.type == "sequence_pool"]
        self.assertEqual(len(pools), 2)
        self.assertEqual(tessera.unregistered_ops(loaded), [])
        mf = multi_hot_model(distributed=True).to_proto()
        self.assertEqual([f.id_modulo for f in mf.feeds if f.source == FB.MULTI_SLOT], [0, 0])

    def test_declaration_order_does_not_matter(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            y = layers.data("y", [-1, 1], feed="label")
            pooled = []
            for k in (1, 0):
                ids = layers.data("m%d" % k, [-1, 1], dtype="int64", slot=k, lod_level=1)
                pooled.append(layers.sequence_pool(layers.embedding(ids, size=[9, 2]), "sum"))
            s0 = layers.data("s0", [-1, 1], dtype="int64", slot=0)
            x = layers.concat(pooled + [layers.embedding(s0, size=[5, 2])], axis=1)
            tessera.optimizer.SGD(0.1).minimize(
                layers.mean(layers.square_error_cost(layers.fc(x, 1), y)))
        mf = m.to_proto(metrics=["mse"])
        self.assertEqual([(f.var, f.slot, f.id_modulo) for f in mf.feeds],
                         [("s0", 0, 5), ("m0", 0, 9), ("m1", 1, 9), ("y", 0, 0)])

    def test_slot_indices(self):
        m = multi_hot_model(num_multi=2)
        dense, label, s0 = (tessera.Feed.dense("dense"), tessera.Feed.label("y"),
                            tessera.Feed.slot_of("s0", 0))
        multi = tessera.Feed.multi_slot_of
        ok = m.to_proto(feeds=[dense, label, s0, multi("m0", 1), multi("m1", 0)])
        self.assertEqual([(f.var, f.slot) for f in ok.feeds if f.source == FB.MULTI_SLOT],
                         [("m1", 0), ("m0", 1)])
        with self.assertRaisesRegex(ValueError, "MULTI_SLOT feeds must bind multi-hot slots "
                                    "0..1 with none missing; multi-hot slot 0 is not bound"):
            m.to_proto(feeds=[dense, label, s0, multi("m0", 1), multi("m1", 2)])
        with self.assertRaisesRegex(ValueError, "feed 'm1': multi-hot slot 0 is bound twice"):
            m.to_proto(feeds=[dense, label, s0, multi("m0", 0), multi("m1", 0)])
        # SLOT and MULTI_SLOT indices are counted apart: SLOT 0 and MULTI_SLOT 0 coexist, and
        # multi-hot slots do not fill a gap in the categorical ones.
        with self.assertRaisesRegex(ValueError, "SLOT feeds must bind slots 0..0 with none "
                                    "missing; slot 0 is not bound"):
            m.to_proto(feeds=[dense, label, tessera.Feed.slot_of("s0", 1), multi("m0", 0),
                              multi("m1", 1)])
        with self.assertRaisesRegex(ValueError, "a multi_slot feed needs slot=<index >= 0>"):
            multi("m0", -1)
        with self.assertRaisesRegex(ValueError, "feed 'm1': multi_slot 0 is already bound to "
                                    "'m0'"):
            m.bind_feed("m1", "multi_slot", slot=0)

    def test_lod_level_must_match_the_source(self):
        m = multi_hot_model(num_multi=1)
        dense, label, s0 = (tessera.Feed.dense("dense"), tessera.Feed.label("y"),
                            tessera.Feed.slot_of("s0", 0))
        with self.assertRaisesRegex(ValueError, "feed 'm0': a lod_level 1 variable can only be "
                                    "fed by a multi_slot feed, not slot"):
            m.to_proto(feeds=[dense, label, s0, tessera.Feed.slot_of("m0", 1)])
        with self.assertRaisesRegex(ValueError, "feed 's0': a multi_slot feed binds a variable "
                                    "declared with lod_level=1"):
            m.to_proto(feeds=[dense, label, tessera.Feed.multi_slot_of("s0", 0),
                              tessera.Feed.multi_slot_of("m0", 1)])
        with self.assertRaisesRegex(ValueError, "op .* reads 'm0', which no op writes and no "
                                    "feed binds"):
            m.to_proto(feeds=[dense, label, s0])

    def test_check_refuses_a_multi_slot_feed_of_another_shape_or_dtype(self):
        for field, value, described in (("dtype", tessera.FLOAT32, r"float32 \[-1, 1\]"),
                                        ("shape", [-1, 3], r"int64 \[-1, 3\]"),
                                        ("shape", [4, 1], r"int64 \[4, 1\]")):
            mf = multi_hot_model().to_proto()
            v = next(v for v in mf.forward.blocks[0].vars if v.name == "m1")
            if field == "dtype":
                v.dtype = value
            else:
                del v.shape[:]
                v.shape.extend(value)
            with self.assertRaisesRegex(ValueError, "MULTI_SLOT feed 'm1' is %s; it must be "
                                        r"int64 \[-1, 1\]" % described):
                tessera.check_model_file(mf)
        mf = multi_hot_model().to_proto()
        mf.feeds[3].slot = -2
        with self.assertRaisesRegex(ValueError, "multi-hot slot -2 < 0"):
            tessera.check_model_file(mf)


class OptimizerTest(unittest.TestCase):

    def minimized(self, opt, distributed=False):
        m = tessera.Model()
        with tessera.model_guard(m):
            ids = layers.data("s", [-1, 1], dtype="int64", slot=0)
            y = layers.data("y", [-1, 1], feed="label")
            e = layers.embedding(ids, size=[5, 2], is_distributed=distributed)
            loss = layers.mean(layers.square_error_cost(layers.fc(e, 1), y))
            config = opt.minimize(loss)
        return m, loss, config

    def test_adam_defaults_are_left_unset(self):
        _, _, c = self.minimized(tessera.optimizer.Adam(learning_rate=0.001))
        self.assertEqual(c.type, "adam")
        for field in ("beta1", "beta2", "epsilon", "momentum"):
            self.assertFalse(c.HasField(field), field)
        _, _, c = self.minimized(tessera.optimizer.Adam(0.002, beta1=0.8, epsilon=1e-7))
        self.assertTrue(c.HasField("beta1") and c.HasField("epsilon"))
        self.assertFalse(c.HasField("beta2"))
        self.assertAlmostEqual(c.beta1, 0.8, places=6)

    def test_momentum_records_mu(self):
        m, loss, c = self.minimized(tessera.optimizer.Momentum(0.01))
        self.assertTrue(c.HasField("momentum"))
        self.assertAlmostEqual(c.momentum, 0.9, places=6)
        self.assertFalse(c.nesterov)
        self.assertEqual((m.loss, m.optimizer), (loss.name, c))
        _, _, c = self.minimized(tessera.optimizer.Momentum(0.01, momentum=0.5, nesterov=True))
        self.assertEqual((c.momentum, c.nesterov), (0.5, True))
        with self.assertRaisesRegex(ValueError, "momentum cannot update distributed table"):
            self.minimized(tessera.optimizer.Momentum(0.01), distributed=True)

    def test_adagrad_sgd_decay_and_l2(self):
        _, _, c = self.minimized(tessera.optimizer.Adagrad(0.1))
        self.assertFalse(c.HasField("epsilon"))
        _, _, c = self.minimized(tessera.optimizer.Adagrad(0.1, epsilon=1e-6))
        self.assertAlmostEqual(c.epsilon, 1e-6, places=12)
        schedule = layers.exponential_decay(0.1, decay_steps=100, decay_rate=0.5, staircase=True)
        _, _, c = self.minimized(tessera.optimizer.SGD(
            schedule, regularization=tessera.regularizer.L2Decay(1e-4)))
        self.assertEqual((c.type, c.decay_steps, c.decay_rate, c.staircase), ("sgd", 100, 0.5,
                                                                              True))
        self.assertAlmostEqual(c.learning_rate, 0.1, places=6)
        self.assertAlmostEqual(c.l2_decay, 1e-4, places=9)
        _, _, c = self.minimized(tessera.optimizer.SGD(0.1))
        self.assertEqual((c.decay_steps, c.decay_rate, c.l2_decay), (0, 0.0, 0.0))

    def test_bad_hyper_parameters(self):
        opt = tessera.optimizer
        for make in (lambda: opt.SGD(0), lambda: opt.SGD(float("nan")),
                     lambda: opt.Momentum(0.1, momentum=1.0), lambda: opt.Adam(beta1=1.5),
                     lambda: opt.SGD(0.1, l2_decay=-1), lambda: opt.ExponentialDecay(0.1, 0, 0.5),
                     lambda: opt.ExponentialDecay(0.1, 10, 0)):
            with self.assertRaises(ValueError):
                make()

    def test_clip_global_norm_is_recorded(self):
        _, _, c = self.minimized(tessera.optimizer.Adam(0.01, clip_global_norm=5.0))
        self.assertAlmostEqual(c.clip_global_norm, 5.0, places=6)
        _, _, c = self.minimized(tessera.optimizer.Adam(0.01))
        self.assertEqual(c.clip_global_norm, 0.0)
        with self.assertRaisesRegex(ValueError, "clip_global_norm must be positive"):
            tessera.optimizer.SGD(0.1, clip_global_norm=0)

    def table_model(self, table_opt, distributed=False, model_opt=None):
        m = tessera.Model()
        with tessera.model_guard(m):
            ids = layers.data("s", [-1, 1], dtype="int64", slot=0)
            y = layers.data("y", [-1, 1], feed="label")
            e = layers.embedding(ids, size=[5, 2], is_distributed=distributed,
                                 param_attr=tessera.ParamAttr(name="emb", optimizer=table_opt))
            loss = layers.mean(layers.square_error_cost(layers.fc(e, 1), y))
            (model_opt or tessera.optimizer.Adam(0.001)).minimize(loss)
        return m

    def test_table_optimizers_are_saved(self):
        m = self.table_model(tessera.optimizer.Adagrad(0.05), distributed=True,
                             model_opt=tessera.optimizer.Momentum(0.01))
        with tempfile.TemporaryDirectory() as d:
            written = m.save(os.path.join(d, "m.pbtxt"))
        self.assertEqual(len(written.table_optimizers), 1)
        t = written.table_optimizers[0]
        self.assertEqual((t.table, t.optimizer.type), ("emb", "adagrad"))
        self.assertAlmostEqual(t.optimizer.learning_rate, 0.05, places=6)
        self.assertEqual(written.optimizer.type, "momentum")  # the table is not momentum's

    def test_table_optimizer_refusals(self):
        opt = tessera.optimizer
        with self.assertRaisesRegex(ValueError, "no schedule or clipping of its own"):
            self.table_model(opt.SGD(0.1, clip_global_norm=1.0))
        with self.assertRaisesRegex(ValueError, "no schedule or clipping of its own"):
            self.table_model(opt.SGD(opt.ExponentialDecay(0.1, 10, 0.5)))
        with self.assertRaisesRegex(ValueError, "momentum cannot update distributed table"):
            self.table_model(opt.Momentum(0.1), distributed=True)
        with self.assertRaisesRegex(TypeError, "must be a tessera.optimizer.Optimizer"):
            tessera.ParamAttr(optimizer="adam")
        m = tessera.Model()
        with tessera.model_guard(m):
            x = layers.data("x", [-1, 2], feed="dense")
            with self.assertRaisesRegex(ValueError, "only embedding tables take an optimizer"):
                layers.fc(x, 1, param_attr=tessera.ParamAttr(optimizer=opt.SGD(0.1)))
        # An edited file is checked as the C++ loader checks it.
        mf = self.table_model(opt.Adagrad(0.05)).to_proto()
        mf.table_optimizers[0].table = "nope"
        with self.assertRaisesRegex(ValueError, "table_optimizers 'nope' names no embedding"):
            tessera.check_model_file(mf)
        mf = self.table_model(opt.Adagrad(0.05)).to_proto()
        mf.table_optimizers.add().CopyFrom(mf.table_optimizers[0])
        with self.assertRaisesRegex(ValueError, "table_optimizers 'emb' is given twice"):
            tessera.check_model_file(mf)
        mf = self.table_model(opt.Adagrad(0.05)).to_proto()
        mf.table_optimizers[0].optimizer.learning_rate = 0  # the model's: allowed
        tessera.check_model_file(mf)
        mf.optimizer.clip_global_norm = -1
        with self.assertRaisesRegex(ValueError, "clip_global_norm -1.0 must be >= 0"):
            tessera.check_model_file(mf)

    def test_loss_must_be_a_scalar(self):
        m = tessera.Model()
        with tessera.model_guard(m):
            x = layers.data("x", [-1, 2], feed="dense")
            per_example = layers.fc(x, 1)
        with self.assertRaisesRegex(ValueError, r"loss 'fc_0.pre_act' is float32 \[-1, 1\]; it "
                                    r"must be a \[1\] \(scalar\)"):
            tessera.optimizer.SGD(0.1).minimize(per_example)
        loss = layers.mean(per_example)
        tessera.optimizer.SGD(0.1).minimize(loss)
        with self.assertRaisesRegex(ValueError, "already has an optimizer"):
            tessera.optimizer.Adam(0.1).minimize(loss)
        self.assertIsNone(m.prediction)


if __name__ == "__main__":
    unittest.main()
