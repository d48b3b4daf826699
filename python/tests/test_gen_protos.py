"""python/gen_protos.sh: the committed *_pb2.py modules are up to date, --check notices stale
ones, and the generated imports are package-relative."""

import os
import shutil
import subprocess
import tempfile
import unittest

import testutil

SCRIPT = os.path.join(testutil.PYTHON_DIR, "gen_protos.sh")
PROTO_PKG = os.path.join(testutil.PYTHON_DIR, "tessera", "proto")
MODULES = ("tensor_pb2.py", "program_pb2.py", "model_pb2.py")


def read_modules(directory):
    """{module name: text} of the generated modules in `directory`."""
    texts = {}
    for name in MODULES:
        with open(os.path.join(directory, name)) as f:
            texts[name] = f.read()
    return texts


def have_protoc():
    return os.environ.get("PROTOC") or os.path.exists("/usr/bin/protoc") or \
        shutil.which("protoc")


class GenProtosTest(unittest.TestCase):

    def test_modules_are_committed_with_relative_imports(self):
        for name in MODULES:
            with open(os.path.join(PROTO_PKG, name)) as f:
                text = f.read()
            self.assertNotRegex(text, r"(?m)^(from proto[ .]|import proto)")
        with open(os.path.join(PROTO_PKG, "model_pb2.py")) as f:
            self.assertIn("from . import program_pb2 as proto_dot_program__pb2", f.read())

    @unittest.skipUnless(have_protoc(), "no protoc")
    def test_check_passes_on_the_checkout(self):
        run = subprocess.run(["bash", SCRIPT, "--check"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr + run.stdout)
        self.assertIn("up to date", run.stdout)

    @unittest.skipUnless(have_protoc(), "no protoc")
    def test_check_notices_stale_modules_and_regenerates(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A copy of the pieces the script reads: proto/ and python/.
            shutil.copytree(os.path.join(testutil.REPO_ROOT, "proto"), os.path.join(tmp, "proto"),
                            ignore=shutil.ignore_patterns("BUILD*"))
            os.makedirs(os.path.join(tmp, "python", "tessera"))
            shutil.copy(SCRIPT, os.path.join(tmp, "python"))
            shutil.copytree(PROTO_PKG, os.path.join(tmp, "python", "tessera", "proto"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            script = os.path.join(tmp, "python", "gen_protos.sh")

            def check():
                return subprocess.run(["bash", script, "--check"], capture_output=True,
                                      text=True)

            self.assertEqual(check().returncode, 0)
            # A proto edit makes the modules stale.
            with open(os.path.join(tmp, "proto", "model.proto"), "a") as f:
                f.write("\nmessage Extra { int32 x = 1; }\n")
            run = check()
            self.assertEqual(run.returncode, 1)
            self.assertIn("model_pb2.py is stale", run.stderr)
            # Regenerating fixes it (and only model_pb2.py changes).
            generated = os.path.join(tmp, "python", "tessera", "proto")
            before = read_modules(generated)
            self.assertEqual(subprocess.run(["bash", script], capture_output=True).returncode, 0)
            self.assertEqual(check().returncode, 0)
            after = read_modules(generated)
            self.assertEqual([n for n in MODULES if before[n] != after[n]], ["model_pb2.py"])
            # A missing module and a leftover module are stale too.
            os.remove(os.path.join(tmp, "python", "tessera", "proto", "tensor_pb2.py"))
            with open(os.path.join(tmp, "python", "tessera", "proto", "old_pb2.py"), "w") as f:
                f.write("# left over\n")
            run = check()
            self.assertEqual(run.returncode, 1)
            self.assertIn("tensor_pb2.py is missing", run.stderr)
            self.assertIn("old_pb2.py has no proto", run.stderr)

    def test_usage(self):
        run = subprocess.run(["bash", SCRIPT, "--bogus"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 2)
        self.assertIn("usage", run.stderr)


if __name__ == "__main__":
    unittest.main()
