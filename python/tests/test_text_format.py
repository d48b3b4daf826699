"""The C++-compatible text printer: float formatting as SimpleFtoa/SimpleDtoa, escaping as
CEscape, and output that parses back to the same message."""

import unittest

import testutil
import tessera
from google.protobuf import text_format
from tessera import text_format_cc as tf
from tessera.initializer import float32
from tessera.proto import model_pb2, program_pb2


class FloatFormatTest(unittest.TestCase):

    def test_simple_ftoa(self):
        # Values as C++ TextFormat printed them in the built-in model files.
        cases = [(0.0, "0"), (float32(0.001), "0.001"), (float32(12 ** 0.5), "3.46410155"),
                 (float32(-0.233549684), "-0.233549684"), (float32(0.9), "0.9"),
                 (float32(1e-8), "1e-08"), (float32(20260101.0), "2.02601e+07"), (-0.0, "-0"),
                 (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan")]
        for value, want in cases:
            self.assertEqual(tf.format_float(value), want, value)

    def test_simple_dtoa(self):
        self.assertEqual(tf.format_double(0.1), "0.1")
        self.assertEqual(tf.format_double(1.0 / 3), "0.33333333333333331")
        self.assertEqual(tf.format_double(1e300), "1e+300")
        self.assertEqual(tf.format_double(0.1 + 0.2), "0.30000000000000004")

    def test_strtof_rounds_decimal_directly(self):
        # 0.1 is below float32(0.1) by less than half an ulp: it reads back as float32(0.1).
        self.assertEqual(tf._strtof("0.1"), float32(0.1))
        self.assertEqual(tf._strtof("3.4641"), float32(3.4641))
        self.assertNotEqual(tf._strtof("3.4641"), float32(12 ** 0.5))


class PrinterTest(unittest.TestCase):

    def test_layout_and_round_trip(self):
        p = program_pb2.ProgramDesc(random_seed=5)
        b = p.blocks.add(parent_idx=-1)
        v = b.vars.add(name='we"ird\n\u00e9', dtype=2, persistable=True)
        v.shape.extend([-1, 3])
        op = b.ops.add(type="scale")
        op.attrs.add(name="scale", f=float32(0.1))
        op.attrs.add(name="flags", strings=program_pb2.OpDesc.Attr.Strings(v=["a", "b"]))
        text = tf.message_to_string(p)
        self.assertEqual(text, "\n".join([
            "blocks {", "  parent_idx: -1", "  vars {",
            '    name: "we\\"ird\\n\\303\\251"', "    shape: -1", "    shape: 3",
            "    dtype: INT64", "    persistable: true", "  }", "  ops {", '    type: "scale"',
            "    attrs {", '      name: "scale"', "      f: 0.1", "    }", "    attrs {",
            '      name: "flags"', "      strings {", '        v: "a"', '        v: "b"',
            "      }", "    }", "  }", "}", "random_seed: 5", ""]))
        back = program_pb2.ProgramDesc()
        text_format.Parse(text, back)
        self.assertEqual(back, p)

    def test_optional_fields_print_when_set(self):
        c = model_pb2.OptimizerConfig(type="adam", learning_rate=0.001)
        self.assertEqual(tf.message_to_string(c), 'type: "adam"\nlearning_rate: 0.001\n')
        c.beta1 = 0.0  # set to the zero value: still present
        self.assertIn("beta1: 0\n", tf.message_to_string(c))

    def test_model_files_round_trip(self):
        mf = testutil.small_model().to_proto()
        back = model_pb2.ModelFile()
        text_format.Parse(tessera.model_to_text(mf), back)
        self.assertEqual(back, mf)


if __name__ == "__main__":
    unittest.main()
