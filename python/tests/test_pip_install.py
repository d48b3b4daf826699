"""`pip install ./python` works offline (--no-deps --no-build-isolation): the installed package
imports from the install location and writes a model file."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import testutil


def have_pip():
    return subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


@unittest.skipUnless(have_pip(), "pip is not installed for %s" % sys.executable)
class PipInstallTest(unittest.TestCase):

    def test_install_into_a_target_dir(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Install from a copy: pip builds in-tree and would leave build/ and *.egg-info in
            # the checkout.
            src = os.path.join(tmp, "src")
            shutil.copytree(testutil.PYTHON_DIR, src, ignore=shutil.ignore_patterns(
                "__pycache__", "build", "*.egg-info", "tests"))
            site = os.path.join(tmp, "site")
            env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
            env.pop("PYTHONPATH", None)
            run = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                                  "--no-build-isolation", "--no-index", "--target", site, src],
                                 capture_output=True, text=True, env=env)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertTrue(os.path.isfile(os.path.join(site, "tessera", "proto",
                                                        "model_pb2.py")))
            self.assertFalse(os.path.exists(os.path.join(site, "tests")))

            out = os.path.join(tmp, "m.pbtxt")
            program = textwrap.dedent("""
                import sys
                import tessera
                from tessera import layers
                assert tessera.__file__.startswith(sys.argv[1]), tessera.__file__
                x = layers.data("x", shape=[-1, 4], feed="dense")
                y = layers.data("y", shape=[-1, 1], feed="label")
                loss = layers.mean(layers.square_error_cost(layers.fc(x, 1), y))
                tessera.optimizer.SGD(learning_rate=0.1).minimize(loss)
                tessera.save_model(sys.argv[2], metrics=["mse"])
                print(tessera.__version__)
                """)
            env["PYTHONPATH"] = site
            run = subprocess.run([sys.executable, "-c", program, site, out], cwd=tmp,
                                 capture_output=True, text=True, env=env)
            self.assertEqual(run.returncode, 0, run.stderr)
            sys.path.insert(0, testutil.PYTHON_DIR)
            import tessera
            self.assertEqual(run.stdout.strip(), tessera.__version__)
            mf = tessera.load_model(out)
            self.assertEqual((mf.format_version, mf.loss, list(mf.metrics)),
                             (1, "mean.out_0", ["mse"]))
            tessera.check_model_file(mf)


if __name__ == "__main__":
    unittest.main()
