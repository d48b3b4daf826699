"""Helpers shared by the tessera tests: repository paths and a small model."""

import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_ROOT = os.path.dirname(PYTHON_DIR)
EXAMPLES_DIR = os.path.join(REPO_ROOT, "examples", "python")

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import tessera  # noqa: E402  (after the path setup)
from tessera import layers  # noqa: E402


def small_model(random_seed=0, distributed=False, rows=50):
    """A two-slot CTR-like model with every feed kind, minimized with Adam."""
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        dense = layers.data("dense", shape=[-1, 3], feed="dense")
        label = layers.data("label", shape=[-1, 1], feed="label")
        embs = []
        for s in range(2):
            ids = layers.data("s%d" % s, shape=[-1, 1], dtype="int64", slot=s)
            embs.append(layers.embedding(ids, size=[rows, 4], is_sparse=True,
                                         is_distributed=distributed, name="t%d" % s))
        h = layers.fc(layers.concat(embs + [dense], axis=1), 5, act="relu")
        logit = layers.fc(h, 1)
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, label))
        pred = layers.sigmoid(logit)
        layers.auc(pred, label)
        tessera.optimizer.Adam(0.01).minimize(loss)
    return model


def attr_names(op):
    """The attribute names of an OpDesc, in order."""
    return [a.name for a in op.attrs]


def find_example_module(name):
    """Imports examples/python/<name>.py."""
    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    import importlib
    return importlib.import_module(name)
