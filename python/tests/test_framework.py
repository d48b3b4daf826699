"""StableHash, seeds, Xavier bounds, names and attributes agree with the C++ ProgramBuilder.

Expected values come from the C++ side: hashes printed by a g++ build of StableHash
(common/layers/program_builder.cc), seeds and bounds read from the startup programs that
`tessera_program --example=ctr|mlp_regression` wrote.
"""

import unittest

import testutil  # noqa: F401  (sets sys.path)
import tessera
from tessera import framework as fw
from tessera import initializer as init
from tessera import layers


class StableHashTest(unittest.TestCase):

    def test_empty_string_is_the_offset_basis(self):
        self.assertEqual(tessera.stable_hash(""), 1469598103934665603)

    def test_one_byte_by_hand(self):
        # (offset ^ 'a') * prime mod 2^64, done by hand:
        # 1469598103934665603 ^ 97 = 1469598103934665698; times 1099511628211 mod 2^64.
        by_hand = (1469598103934665698 * 1099511628211) % (1 << 64)
        self.assertEqual(1469598103934665603 ^ 97, 1469598103934665698)
        self.assertEqual(by_hand, 4953267810257967366)
        self.assertEqual(tessera.stable_hash("a"), 4953267810257967366)

    def test_values_of_the_cpp_function(self):
        cpp = {  # printed by the C++ StableHash
            "emb_0": 14828962238518064738,
            "deep_fc_0.w": 3513196684969707869,
            "hidden.w": 10647158876633499840,
            "caf\u00e9": 9477181400979595255,  # UTF-8 bytes, as std::string holds them
        }
        for name, want in cpp.items():
            self.assertEqual(tessera.stable_hash(name), want, name)
        self.assertEqual(tessera.stable_hash(b"x\xff"), 11241230963853963034)  # unsigned char

    def test_not_the_standard_fnv1a(self):
        standard = 14695981039346656037
        h = standard
        for c in b"emb_0":
            h = ((h ^ c) * 1099511628211) % (1 << 64)
        self.assertNotEqual(tessera.stable_hash("emb_0"), h)


class SeedTest(unittest.TestCase):

    def test_default_seed_replaces_zero(self):
        m = tessera.Model()
        self.assertEqual(m.random_seed, 20260101)
        self.assertEqual(m.main_program.desc.random_seed, 20260101)
        self.assertEqual(m.startup_program.desc.random_seed, 20260101)
        self.assertEqual(tessera.Model(random_seed=7).startup_program.random_seed, 7)

    def test_initializer_seeds_equal_the_cpp_ones(self):
        m = tessera.Model()
        m.create_parameter("emb_0", [100000, 8], init.Uniform(-0.05, 0.05))
        m.create_parameter("deep_fc_0.w", [221, 64])
        seeds = [fw.get_attr(op, "seed") for op in m.startup_program.ops]
        # tessera_program --example=ctr, startup ops of emb_0 and deep_fc_0.w.
        self.assertEqual(seeds, [5605590201683006311, 3513196684949990488])

    def test_seed_formula_with_a_program_seed(self):
        for seed in (7, -5, (1 << 63) - 1):
            m = tessera.Model(random_seed=seed)
            m.create_parameter("w", [2, 2], init.Normal(0.0, 0.1))
            want = (tessera.stable_hash("w") ^ (seed % (1 << 64))) & 0x7FFFFFFFFFFFFFFF
            self.assertEqual(fw.get_attr(m.startup_program.ops[0], "seed"), want, seed)
            self.assertGreaterEqual(want, 0)

    def test_seed_does_not_depend_on_order(self):
        a, b = tessera.Model(), tessera.Model()
        a.create_parameter("p", [3, 3])
        a.create_parameter("q", [3, 3])
        b.create_parameter("q", [3, 3])
        b.create_parameter("p", [3, 3])
        self.assertEqual(fw.get_attr(a.startup_program.ops[0], "seed"),
                         fw.get_attr(b.startup_program.ops[1], "seed"))

    def test_random_seed_is_fixed_once_parameters_exist(self):
        m = tessera.Model()
        m.random_seed = 9
        self.assertEqual(m.startup_program.random_seed, 9)
        m.create_parameter("w", [2, 2])
        with self.assertRaisesRegex(ValueError, "before the first parameter"):
            m.random_seed = 10


class InitializerOpTest(unittest.TestCase):

    def test_xavier_bounds_equal_the_cpp_ones(self):
        # From tessera_program's startup programs (float32, computed in double first).
        self.assertEqual(init.xavier_bound([221, 64]), init.float32(0.145095244))
        self.assertEqual(init.xavier_bound([10, 100]), init.float32(0.233549684))
        # fan_out = numel / fan_in; rank 1: fan_out 1; rank 0: both 1.
        self.assertEqual(init.xavier_bound([4, 3, 2]), init.float32((6.0 / (4 + 6)) ** 0.5))
        self.assertEqual(init.xavier_bound([5]), init.float32((6.0 / 6) ** 0.5))
        self.assertEqual(init.xavier_bound([]), init.float32(3.0 ** 0.5))

    def test_uniform_xavier_op(self):
        m = tessera.Model()
        m.create_parameter("hidden.w", [10, 100])
        op = m.startup_program.ops[0]
        self.assertEqual(op.type, "uniform_random")
        self.assertEqual(testutil.attr_names(op), ["min", "max", "shape", "dtype", "seed"])
        self.assertEqual(fw.get_attr(op, "max"), init.float32(0.233549684))
        self.assertEqual(fw.get_attr(op, "min"), -init.float32(0.233549684))
        self.assertEqual(fw.get_attr(op, "shape"), [10, 100])
        self.assertEqual(fw.get_attr(op, "dtype"), fw.FLOAT32)
        self.assertEqual(fw.get_attr(op, "seed"), 1423786839794658757)  # C++ mlp_regression
        self.assertEqual(op.attrs[1].WhichOneof("value"), "f")
        self.assertEqual(op.attrs[3].WhichOneof("value"), "i")
        self.assertEqual(list(op.outputs[0].arguments), ["hidden.w"])
        self.assertEqual(len(op.inputs), 0)

    def test_constant_and_gaussian_ops(self):
        m = tessera.Model()
        m.create_parameter("b", [4], init.Constant(0.5))
        m.create_parameter("g", [2, 3], init.Normal(1.0, 0.1), dtype="float64")
        c, g = m.startup_program.ops
        self.assertEqual((c.type, testutil.attr_names(c)), ("fill_constant",
                                                            ["value", "shape", "dtype"]))
        self.assertEqual(fw.get_attr(c, "value"), 0.5)
        self.assertEqual((g.type, testutil.attr_names(g)),
                         ("gaussian_random", ["mean", "std", "shape", "dtype", "seed"]))
        self.assertEqual(fw.get_attr(g, "std"), init.float32(0.1))
        self.assertEqual(fw.get_attr(g, "dtype"), fw.FLOAT64)

    def test_parameter_flags_in_both_programs(self):
        m = tessera.Model()
        p = m.create_parameter("w", [2, 3])
        self.assertTrue(p.persistable and p.trainable and p.is_parameter)
        sv = m.startup_program.find_var("w")
        self.assertTrue(sv.persistable)
        self.assertFalse(sv.trainable)
        self.assertEqual(list(sv.shape), [2, 3])

    def test_persistable_attr_order(self):
        m = tessera.Model()
        v = m.create_persistable("lr", [1], 0.25)
        self.assertTrue(v.persistable)
        self.assertFalse(v.trainable)
        op = m.startup_program.ops[0]
        self.assertEqual(testutil.attr_names(op), ["shape", "value", "dtype"])

    def test_bad_parameters(self):
        m = tessera.Model()
        with self.assertRaisesRegex(ValueError, "dims are >= 1"):
            m.create_parameter("w", [-1, 3])
        with self.assertRaisesRegex(ValueError, "low"):
            init.Uniform(1.0, -1.0)
        m.create_parameter("w", [2])
        with self.assertRaisesRegex(ValueError, "already exists"):
            m.create_parameter("w", [2])
        self.assertEqual(len(m.startup_program.ops), 1)


class BuilderTest(unittest.TestCase):

    def test_unique_names_count_per_prefix(self):
        m = tessera.Model()
        self.assertEqual([m.unique_name("fc"), m.unique_name("fc"), m.unique_name("relu.out")],
                         ["fc_0", "fc_1", "relu.out_0"])
        self.assertEqual(m.peek_unique_name("fc"), "fc_2")
        self.assertEqual(m.unique_name("fc"), "fc_2")

    def test_append_op_sets_op_role_first(self):
        m = tessera.Model()
        x = m.create_var("x", [-1, 2])
        y = m.create_var("y", [-1, 2])
        op = m.append_op("scale", {"X": x}, {"Out": [y]},
                         [("scale", 2), ("bias", 1.5, "f"), ("flag", True), ("v", [1, 2])])
        self.assertEqual(testutil.attr_names(op), ["op_role", "scale", "bias", "flag", "v"])
        self.assertEqual([a.WhichOneof("value") for a in op.attrs], ["i", "i", "f", "b", "ints"])
        self.assertEqual(fw.get_attr(op, "op_role"), 0)
        fw.set_attr(op, "scale", 3.0, "f")  # replaced in place
        self.assertEqual(testutil.attr_names(op), ["op_role", "scale", "bias", "flag", "v"])
        self.assertEqual(op.attrs[1].WhichOneof("value"), "f")
        with self.assertRaisesRegex(ValueError, "not declared"):
            m.append_op("relu", {"X": "nope"}, {"Out": y})

    def test_float_attrs_are_float32(self):
        m = tessera.Model()
        x = layers.data("x", [-1, 2], model=m)
        out = layers.scale(x, 0.1)
        self.assertEqual(fw.get_attr(m.main_program.ops[0], "scale"), init.float32(0.1))
        self.assertNotEqual(init.float32(0.1), 0.1)
        self.assertEqual(out.name, "scale.out_0")

    def test_names_are_checked(self):
        m = tessera.Model()
        for bad in ("", "a\nb", "x@GRAD", "@EMPTY@"):
            with self.assertRaises(ValueError):
                m.create_var(bad, [1])

    def test_dtypes(self):
        self.assertEqual(fw.convert_dtype("float32"), fw.FLOAT32)
        self.assertEqual(fw.convert_dtype("int64"), fw.INT64)
        self.assertEqual(fw.convert_dtype(fw.FLOAT64), fw.FLOAT64)
        with self.assertRaises(ValueError):
            fw.convert_dtype("bfloat16")

    def test_model_guard_restores_the_default(self):
        outer = tessera.default_model()
        m = tessera.Model()
        with tessera.model_guard(m):
            self.assertIs(tessera.default_model(), m)
            self.assertIs(tessera.default_main_program(), m.main_program)
        self.assertIs(tessera.default_model(), outer)


if __name__ == "__main__":
    unittest.main()
