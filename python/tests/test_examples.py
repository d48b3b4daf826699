"""The example models of examples/python: wide_deep and mlp_regression equal what the C++
builders make; DeepFM, DCN and multi_hot build, pass the checks and use the ops they should.

The Python model files are compared, byte for byte, with the C++ builders' files in
cluster/builtin_models/ (kept equal to the builders by examples/builtin_models_test.sh). When the
C++ tool `tessera_program` is available (env TESSERA_PROGRAM_BIN, else
bazel-bin/examples/tessera_program of this checkout) they are also compared with what it writes:
its --model_out file byte for byte (--distributed included), and its compiled programs: the
forward program must be the C++ main program before its backward and optimizer ops, the startup
program the C++ startup program before the optimizer state. When `tessera_transpile` is available
(env TESSERA_TRANSPILE_BIN, else bazel-bin/cluster/tessera_transpile) every example's file goes
through the C++ loader (ValidateModel, with its dry run of a batch) and the transpiler; a
binary built before the C++ side had reduce_sum, sequence_pool or MULTI_SLOT feeds skips the
models that use them.
"""

import os
import subprocess
import sys
import tempfile
import unittest

import testutil
import tessera
from tessera import framework as fw
from tessera.proto import model_pb2
from tessera.proto import program_pb2
from google.protobuf import text_format

FB = model_pb2.FeedBinding
wide_deep = testutil.find_example_module("wide_deep")
mlp_regression = testutil.find_example_module("mlp_regression")
deepfm = testutil.find_example_module("deepfm")
dcn = testutil.find_example_module("dcn")
multi_hot = testutil.find_example_module("multi_hot")
image_models = testutil.find_example_module("image_models")


def cpp_binary(env_var, *path):
    """Path of a built C++ binary ($env_var, else bazel-bin/<path>), or None."""
    binary = os.environ.get(env_var) or os.path.join(testutil.REPO_ROOT, "bazel-bin", *path)
    return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None


def tessera_program():
    """Path of the C++ tessera_program binary, or None."""
    return cpp_binary("TESSERA_PROGRAM_BIN", "examples", "tessera_program")


def cpp_env():
    """The environment for the C++ tools: without TESSERA_*/PADDLE_* (read as their flags)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "PADDLE_"))}


def write(mf, tmp, name):
    """Writes ModelFile `mf` to tmp/name; returns the path."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(tessera.model_to_text(mf))
    return path


def read_program(path):
    desc = program_pb2.ProgramDesc()
    with open(path) as f:
        text_format.Parse(f.read(), desc)
    return desc


class CppComparison(unittest.TestCase):
    """Compares Python model files with the programs of the C++ builders."""

    def run_cpp(self, tmp, flags):
        binary = tessera_program()
        if binary is None:
            self.skipTest("tessera_program not built (set TESSERA_PROGRAM_BIN)")
        main, startup = os.path.join(tmp, "main.pbtxt"), os.path.join(tmp, "startup.pbtxt")
        subprocess.run([binary] + flags + ["--out=" + main, "--startup_out=" + startup],
                       check=True, stdout=subprocess.DEVNULL, env=cpp_env())
        return read_program(main), read_program(startup), binary

    def assertForwardPrefix(self, mf, main, startup):
        fwd, ref = mf.forward.blocks[0], main.blocks[0]
        self.assertEqual(mf.forward.random_seed, main.random_seed)
        self.assertEqual(mf.startup.random_seed, startup.random_seed)
        self.assertEqual(list(fwd.vars), list(ref.vars[:len(fwd.vars)]))
        ops = []
        for op in ref.ops[:len(fwd.ops)]:
            copy = program_pb2.OpDesc()
            copy.CopyFrom(op)
            for a in copy.attrs:
                if a.name == fw.OP_ROLE_ATTR:
                    a.i &= ~fw.ROLE_LOSS  # AppendBackward marks the loss op
            ops.append(copy)
        self.assertEqual(list(fwd.ops), ops)
        # Everything the C++ side has beyond that is backward / optimizer work.
        later = fw.ROLE_BACKWARD | fw.ROLE_OPTIMIZE | fw.ROLE_LR_SCHED
        for op in ref.ops[len(fwd.ops):]:
            self.assertTrue(fw.get_attr(op, fw.OP_ROLE_ATTR) & later, op.type)
        forward_names = set(v.name for v in fwd.vars)
        for v in ref.vars[len(fwd.vars):]:
            self.assertNotIn(v.name, forward_names)
            self.assertTrue(v.name.endswith("@GRAD") or "@GRAD@" in v.name or v.persistable,
                            v.name)
        s, r = mf.startup.blocks[0], startup.blocks[0]
        self.assertEqual(list(s.vars), list(r.vars[:len(s.vars)]))
        self.assertEqual(list(s.ops), list(r.ops[:len(s.ops)]))
        params = set(v.name for v in fwd.vars if v.persistable)
        for op in r.ops[len(s.ops):]:
            self.assertFalse(set(fw.all_args(op.outputs)) & params)

    def assertWholeFileIfSupported(self, binary, flags, mf, tmp):
        help_text = subprocess.run([binary, "--help"], capture_output=True, text=True,
                                   env=cpp_env()).stdout
        if "model_out" not in help_text:
            return
        path = os.path.join(tmp, "model.pbtxt")
        subprocess.run([binary] + flags + ["--model_out=" + path], check=True,
                       stdout=subprocess.DEVNULL, env=cpp_env())
        self.assertEqual(tessera.load_model(path), mf)
        with open(path) as f:
            self.assertEqual(f.read(), tessera.model_to_text(mf))

    def assertBuiltinFile(self, name, mf):
        path = os.path.join(testutil.REPO_ROOT, "cluster", "builtin_models", name + ".pbtxt")
        if not os.path.isfile(path):
            self.skipTest("no cluster/builtin_models/%s.pbtxt" % name)
        with open(path) as f:
            text = f.read()
        self.assertEqual(tessera.load_model(path), mf)
        self.assertEqual(text, tessera.model_to_text(mf))  # byte for byte


class WideDeepTest(CppComparison):

    def test_registry_configuration(self):
        mf = wide_deep.build().to_proto()
        block = mf.forward.blocks[0]
        self.assertEqual((len(block.vars), len(block.ops), len(mf.startup.blocks[0].ops)),
                         (155, 68, 59))
        self.assertEqual(mf.forward.random_seed, 20260101)
        emb = next(v for v in block.vars if v.name == "emb_7")
        self.assertEqual((list(emb.shape), emb.is_sparse, emb.is_distributed), ([10000, 8], True,
                                                                                False))
        self.assertEqual([(f.var, f.source) for f in mf.feeds][:2],
                         [("dense_input", FB.DENSE), ("slot_0", FB.SLOT)])
        self.assertEqual([f.id_modulo for f in mf.feeds if f.source == FB.SLOT], [10000] * 26)
        self.assertEqual([f.slot for f in mf.feeds if f.source == FB.SLOT], list(range(26)))
        self.assertEqual((mf.feeds[-1].var, mf.feeds[-1].source), ("label", FB.LABEL))
        self.assertEqual((mf.loss, mf.prediction, list(mf.metrics)),
                         ("mean.out_0", "sigmoid.out_0", ["auc", "log_loss"]))
        expected = model_pb2.OptimizerConfig(type="adam", learning_rate=0.001)
        self.assertEqual(mf.optimizer, expected)
        self.assertEqual([op.type for op in block.ops[-7:]],
                         ["mul", "sum", "elementwise_add", "mul", "elementwise_add",
                          "sigmoid_cross_entropy_with_logits", "mean"][-6:] + ["sigmoid"])
        self.assertEqual(tessera.unregistered_ops(mf), [])

    def test_distributed_tables(self):
        mf = wide_deep.build(distributed_tables=True).to_proto()
        block = mf.forward.blocks[0]
        lookups = [op for op in block.ops if op.type == "lookup_table"]
        names = set(fw.op_inputs(op, "W")[0] for op in lookups)
        tables = [v for v in block.vars if v.name in names]
        self.assertEqual(len(tables), 52)
        self.assertTrue(all(v.is_distributed and v.is_sparse for v in tables))
        self.assertEqual(set(f.id_modulo for f in mf.feeds if f.source == FB.SLOT), {0})
        self.assertFalse(next(v for v in block.vars if v.name == "wide_dense.w").is_distributed)
        self.assertTrue(all(fw.get_attr(op, "is_distributed") for op in lookups))

    def test_equals_the_builtin_model_file(self):
        self.assertBuiltinFile("ctr", wide_deep.build().to_proto())

    def test_equals_the_cpp_builder(self):
        for distributed in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                flags = ["--example=ctr"] + (["--distributed"] if distributed else [])
                main, startup, binary = self.run_cpp(tmp, flags)
                mf = wide_deep.build(distributed_tables=distributed).to_proto()
                self.assertForwardPrefix(mf, main, startup)
                self.assertWholeFileIfSupported(binary, flags, mf, tmp)

    def test_script(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "ctr.pbtxt")
            script = os.path.join(testutil.EXAMPLES_DIR, "wide_deep.py")
            env = dict(os.environ, PYTHONPATH=testutil.PYTHON_DIR)
            subprocess.run([sys.executable, script, "--out", out, "--distributed_tables",
                            "--learning_rate", "0.01"], check=True, env=env)
            mf = tessera.load_model(out)
            self.assertAlmostEqual(mf.optimizer.learning_rate, 0.01, places=7)
            self.assertTrue(next(v for v in mf.forward.blocks[0].vars
                                 if v.name == "emb_0").is_distributed)
            bad = subprocess.run([sys.executable, script, "--out", out, "--learning_rate", "-1"],
                                 env=env, capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("learning_rate must be positive", bad.stderr)
            # --wide=false: the deep model alone, its tables as wide as asked.
            subprocess.run([sys.executable, script, "--out", out, "--distributed_tables",
                            "--wide=false", "--embedding_dim", "9"], check=True, env=env)
            names = {v.name: v for v in tessera.load_model(out).forward.blocks[0].vars}
            self.assertNotIn("wide_0", names)
            self.assertNotIn("wide_dense.w", names)
            self.assertEqual(list(names["emb_25"].shape), [10000, 9])


class RegisteredOpsTest(unittest.TestCase):
    """REGISTERED_OPS names only op types the C++ registry has (tessera_program --list_ops)."""

    def test_every_registered_op_is_in_the_cpp_registry(self):
        binary = tessera_program()
        if binary is None:
            self.skipTest("tessera_program is not built")
        out = subprocess.run([binary, "--list_ops"], capture_output=True, text=True,
                             env=cpp_env(), check=True).stdout.split()
        cpp = set(out)
        self.assertIn("conv2d_grad", cpp)  # the list is the whole registry
        self.assertEqual(sorted(set(fw.REGISTERED_OPS) - cpp), [])
        for op_type in ("conv2d", "pool2d", "flatten", "batch_norm", "dropout", "accuracy"):
            self.assertIn(op_type, fw.REGISTERED_OPS)


class ImageModelsTest(CppComparison):
    """examples/python/image_models.py writes the built-in fashion_mnist_mlp and lenet files."""

    def test_equal_the_builtin_model_files(self):
        self.assertBuiltinFile("fashion_mnist_mlp", image_models.build("mlp").to_proto())
        self.assertBuiltinFile("lenet", image_models.build("lenet").to_proto())

    def test_lenet(self):
        mf = image_models.build("lenet").to_proto()
        ops = [op.type for op in mf.forward.blocks[0].ops]
        self.assertEqual(ops[:8], ["reshape", "conv2d", "elementwise_add", "relu", "pool2d",
                                   "conv2d", "elementwise_add", "relu"])
        self.assertEqual((list(mf.metrics), mf.prediction), (["accuracy"], "softmax.out_0"))
        self.assertEqual([(f.var, f.source) for f in mf.feeds], [("pixels", FB.DENSE),
                                                                  ("label", FB.LABEL)])
        self.assertEqual(tessera.unregistered_ops(mf), [])


class MlpRegressionTest(CppComparison):

    def test_model(self):
        mf = mlp_regression.build().to_proto()
        ops = [op.type for op in mf.forward.blocks[0].ops]
        self.assertEqual(ops, ["scale", "mul", "elementwise_add", "relu", "mul",
                               "elementwise_add", "square_error", "mean"])
        scale = mf.forward.blocks[0].ops[0]
        k = tessera.initializer.float32(12.0 ** 0.5)
        self.assertEqual((fw.get_attr(scale, "scale"), fw.get_attr(scale, "bias")),
                         (k, tessera.initializer.float32(-1.5 * k)))
        self.assertEqual([(f.var, f.source) for f in mf.feeds], [("x", FB.DENSE),
                                                                  ("y", FB.LABEL)])
        self.assertEqual((list(mf.metrics), mf.prediction), (["mse"], ""))
        self.assertEqual(mf.optimizer, model_pb2.OptimizerConfig(
            type="momentum", learning_rate=0.001, momentum=0.9))

    def test_equals_the_builtin_model_file(self):
        self.assertBuiltinFile("mlp_regression", mlp_regression.build().to_proto())

    def test_equals_the_cpp_builder(self):
        with tempfile.TemporaryDirectory() as tmp:
            flags = ["--example=mlp_regression"]
            main, startup, binary = self.run_cpp(tmp, flags)
            mf = mlp_regression.build().to_proto()
            self.assertForwardPrefix(mf, main, startup)
            self.assertWholeFileIfSupported(binary, flags, mf, tmp)


class DeepFmTest(unittest.TestCase):

    def test_model(self):
        mf = deepfm.build(embedding_dim=4, hidden=(16, 8)).to_proto(strict=True)
        self.assertEqual(tessera.unregistered_ops(mf), [])
        block = mf.forward.blocks[0]
        shapes = {v.name: list(v.shape) for v in block.vars}
        self.assertEqual(shapes["fm_sum"], [-1, 4])
        self.assertEqual(shapes["concat.out_0"], [-1, 26 * 4 + 13])
        reduce_ops = [op for op in block.ops if op.type == "reduce_sum"]
        self.assertEqual(len(reduce_ops), 1)
        reduce_op = reduce_ops[0]
        # The registered kernel's attributes (Fluid's): dim, keep_dim, reduce_all.
        self.assertEqual(testutil.attr_names(reduce_op),
                         ["op_role", "dim", "keep_dim", "reduce_all"])
        self.assertEqual([reduce_op.attrs[i].WhichOneof("value") for i in range(1, 4)],
                         ["ints", "b", "b"])
        self.assertEqual([fw.get_attr(reduce_op, a) for a in ("dim", "keep_dim", "reduce_all")],
                         [[1], True, False])
        self.assertEqual(fw.op_inputs(reduce_op, "X"), ["elementwise_sub.out_0"])
        self.assertEqual(shapes["elementwise_sub.out_0"], [-1, 4])
        out = fw.op_outputs(reduce_op, "Out")[0]
        self.assertEqual(shapes[out], [-1, 1])
        square_terms = [op for op in block.ops if op.type == "elementwise_mul"]
        self.assertEqual(len(square_terms), 27)  # (sum e)^2 and each e^2
        params = [v.name for v in block.vars if v.persistable]
        self.assertIn("fm_w_25", params)
        self.assertIn("fm_dense.b", params)
        self.assertNotIn("deep_out.b", params)
        self.assertEqual((mf.prediction, list(mf.metrics)), ("sigmoid.out_0", ["auc", "log_loss"]))

    def test_script_distributed(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "deepfm.pbtxt")
            env = dict(os.environ, PYTHONPATH=testutil.PYTHON_DIR)
            run = subprocess.run([sys.executable, os.path.join(testutil.EXAMPLES_DIR, "deepfm.py"),
                                  "--out", out, "--distributed_tables=true", "--hidden=8"],
                                 env=env, capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stderr, "")  # reduce_sum is registered: no warning
            mf = tessera.load_model(out)
            tessera.check_model_file(mf)
            self.assertEqual(set(f.id_modulo for f in mf.feeds if f.source == FB.SLOT), {0})
            reduce_op = next(op for op in mf.forward.blocks[0].ops if op.type == "reduce_sum")
            self.assertEqual([fw.get_attr(reduce_op, a) for a in ("dim", "keep_dim",
                                                                  "reduce_all")],
                             [[1], True, False])


class DcnTest(unittest.TestCase):

    def test_model(self):
        mf = dcn.build(embedding_dim=4, num_cross=2, hidden=(16,)).to_proto(strict=True)
        self.assertEqual(tessera.unregistered_ops(mf), [])
        block = mf.forward.blocks[0]
        shapes = {v.name: list(v.shape) for v in block.vars}
        width = 26 * 4 + 13
        self.assertEqual(shapes["cross_0.w"], [width, 1])
        self.assertEqual(shapes["cross_1.b"], [width])
        self.assertEqual(shapes["combine.w"], [width + 16, 1])
        muls = [op for op in block.ops if op.type == "elementwise_mul"]
        self.assertEqual(len(muls), 2)
        self.assertEqual(fw.op_inputs(muls[0], "X"), ["concat.out_0"])
        self.assertEqual(shapes[fw.op_inputs(muls[0], "Y")[0]], [-1, 1])

    def test_script(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "dcn.pbtxt")
            env = dict(os.environ, PYTHONPATH=testutil.PYTHON_DIR)
            run = subprocess.run([sys.executable, os.path.join(testutil.EXAMPLES_DIR, "dcn.py"),
                                  "--out", out, "--dict_size", "1000"], env=env,
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stderr, "")
            mf = tessera.load_model(out)
            self.assertEqual(set(f.id_modulo for f in mf.feeds if f.source == FB.SLOT), {1000})


class MultiHotTest(unittest.TestCase):

    def test_model(self):
        mf = multi_hot.build().to_proto(strict=True)
        self.assertEqual(tessera.unregistered_ops(mf), [])
        feeds = [(f.var, f.source, f.slot, f.id_modulo) for f in mf.feeds]
        self.assertEqual(feeds[0], ("dense_input", FB.DENSE, 0, 0))
        self.assertEqual(feeds[1:27], [("slot_%d" % s, FB.SLOT, s, 1000) for s in range(26)])
        self.assertEqual(feeds[27:29], [("multi_slot_0", FB.MULTI_SLOT, 0, 1000),
                                        ("multi_slot_1", FB.MULTI_SLOT, 1, 1000)])
        self.assertEqual(feeds[29:], [("label", FB.LABEL, 0, 0)])
        block = mf.forward.blocks[0]
        shapes = {v.name: list(v.shape) for v in block.vars}
        dtypes = {v.name: v.dtype for v in block.vars}
        self.assertEqual((shapes["multi_slot_0"], dtypes["multi_slot_0"]), ([-1, 1],
                                                                             tessera.INT64))
        self.assertEqual(shapes["emb_25"], [1000, 4])
        self.assertEqual(shapes["multi_emb_1"], [1000, 4])
        pools = [op for op in block.ops if op.type == "sequence_pool"]
        self.assertEqual([fw.op_inputs(op, "X") for op in pools],
                         [["multi_emb_0.out_0"], ["multi_emb_1.out_0"]])
        self.assertEqual([fw.get_attr(op, "pooltype") for op in pools], ["SUM", "AVERAGE"])
        self.assertEqual([shapes[fw.op_outputs(op, "Out")[0]] for op in pools], [[-1, 4]] * 2)
        lookup = next(op for op in block.ops if fw.op_outputs(op, "Out") == ["multi_emb_0.out_0"])
        self.assertEqual((lookup.type, fw.op_inputs(lookup, "Ids")),
                         ("lookup_table", ["multi_slot_0"]))
        self.assertEqual(shapes["multi_emb_0.out_0"], [-1, 4])
        concat = next(op for op in block.ops if op.type == "concat")
        self.assertEqual(fw.op_inputs(concat, "X"),
                         ["emb_%d.out_0" % s for s in range(26)] +
                         ["sequence_pool.out_0", "sequence_pool.out_1", "dense_input"])
        self.assertEqual(shapes["deep_fc_0.w"], [26 * 4 + 2 * 4 + 13, 32])
        self.assertEqual(shapes["deep_out.w"], [32, 1])
        self.assertEqual((mf.loss, mf.prediction, list(mf.metrics)),
                         ("mean.out_0", "sigmoid.out_0", ["auc", "log_loss"]))
        self.assertEqual(mf.optimizer, model_pb2.OptimizerConfig(type="adagrad",
                                                                 learning_rate=0.05))

    def test_pool_types_and_distributed_tables(self):
        mf = multi_hot.build(multi_hot_slots=4, distributed_tables=True).to_proto()
        block = mf.forward.blocks[0]
        self.assertEqual([fw.get_attr(op, "pooltype") for op in block.ops
                          if op.type == "sequence_pool"], ["SUM", "AVERAGE", "MAX", "MAX"])
        multi = [f for f in mf.feeds if f.source == FB.MULTI_SLOT]
        self.assertEqual([(f.var, f.slot, f.id_modulo) for f in multi],
                         [("multi_slot_%d" % m, m, 0) for m in range(4)])
        tables = [v for v in block.vars if v.name.startswith(("emb_", "multi_emb_")) and
                  v.persistable]
        self.assertEqual(len(tables), 30)
        self.assertTrue(all(v.is_distributed and v.is_sparse for v in tables))
        none = multi_hot.build(multi_hot_slots=0).to_proto()
        self.assertFalse([f for f in none.feeds if f.source == FB.MULTI_SLOT])

    def test_script(self):
        script = os.path.join(testutil.EXAMPLES_DIR, "multi_hot.py")
        env = dict(os.environ, PYTHONPATH=testutil.PYTHON_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "multi_hot.pbtxt")
            run = subprocess.run([sys.executable, script, "--out", out], env=env,
                                 capture_output=True, text=True)
            self.assertEqual((run.returncode, run.stderr), (0, ""))
            mf = tessera.load_model(out)
            tessera.check_model_file(mf)
            self.assertEqual(mf, multi_hot.build().to_proto())
            run = subprocess.run([sys.executable, script, "--out", out, "--multi_hot_slots=3",
                                  "--distributed_tables", "--dict_size=500",
                                  "--learning_rate=0.2"],
                                 env=env, capture_output=True, text=True)
            self.assertEqual((run.returncode, run.stderr), (0, ""))
            mf = tessera.load_model(out)
            self.assertEqual([(f.var, f.slot, f.id_modulo) for f in mf.feeds
                              if f.source == FB.MULTI_SLOT],
                             [("multi_slot_%d" % m, m, 0) for m in range(3)])
            self.assertAlmostEqual(mf.optimizer.learning_rate, 0.2, places=6)
            self.assertEqual(next(list(v.shape) for v in mf.forward.blocks[0].vars
                                  if v.name == "multi_emb_2"), [500, 4])
            bad = subprocess.run([sys.executable, script, "--out", out, "--multi_hot_slots=-1"],
                                 env=env, capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("multi_hot_slots must be an int >= 0", bad.stderr)


class CppLoaderTest(unittest.TestCase):
    """The C++ loader accepts every example."""

    def transpile(self, mf, name):
        binary = cpp_binary("TESSERA_TRANSPILE_BIN", "cluster", "tessera_transpile")
        if binary is None:
            self.skipTest("tessera_transpile not built (set TESSERA_TRANSPILE_BIN)")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            return subprocess.run(
                [binary, "--model=" + write(mf, tmp, name + ".pbtxt"), "--trainers=2",
                 "--pservers=127.0.0.1:7001,127.0.0.1:7002", "--out_dir=" + out],
                capture_output=True, text=True, env=cpp_env(), timeout=300)

    def test_examples_load_and_transpile(self):
        models = {
            "wide_deep": wide_deep.build(),
            "wide_deep_distributed": wide_deep.build(distributed_tables=True),
            "mlp_regression": mlp_regression.build(),
            "dcn": dcn.build(num_cross=2, hidden=(32,)),
            "dcn_distributed": dcn.build(distributed_tables=True),
        }
        for name, model in models.items():
            run = self.transpile(model.to_proto(strict=True), name)
            self.assertEqual(run.returncode, 0, name + ": " + run.stderr)
            self.assertIn("wrote 6 programs", run.stdout, name)

    # What a tessera_transpile built before the C++ side had an op type or feed source says.
    PREDATES = {
        "reduce_sum": "unknown op type 'reduce_sum'",
        "sequence_pool": "unknown op type 'sequence_pool'",
        "MULTI_SLOT": 'Unknown enumeration value of "MULTI_SLOT"',
        "dropout": "unknown op type 'dropout'",
    }

    def transpile_newer(self, mf, name, needs):
        """transpile(), skipping when the binary predates one of `needs` (PREDATES keys)."""
        run = self.transpile(mf, name)
        if run.returncode != 0:
            for need in needs:
                if self.PREDATES[need] in run.stderr:
                    self.skipTest("tessera_transpile predates %s (rebuild it): %s" %
                                  (need, run.stderr.strip()))
        return run

    def test_deepfm_loads_with_reduce_sum(self):
        mf = deepfm.build(embedding_dim=4, hidden=(8,)).to_proto(strict=True)
        run = self.transpile_newer(mf, "deepfm", ["reduce_sum"])
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("wrote 6 programs", run.stdout)

    def test_deepfm_with_dropout_loads(self):
        # The loader's dry run of a batch runs dropout and its gradient.
        mf = deepfm.build(embedding_dim=4, hidden=(8, 8), dropout=0.2).to_proto(strict=True)
        self.assertIn("dropout", [op.type for op in mf.forward.blocks[0].ops])
        run = self.transpile_newer(mf, "deepfm_dropout", ["dropout"])
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("wrote 6 programs", run.stdout)

    def test_multi_hot_loads(self):
        for distributed in (False, True):
            mf = multi_hot.build(multi_hot_slots=3, distributed_tables=distributed).to_proto(
                strict=True)
            run = self.transpile_newer(mf, "multi_hot", ["MULTI_SLOT", "sequence_pool"])
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertIn("wrote 6 programs", run.stdout)


if __name__ == "__main__":
    unittest.main()
