"""tessera: write Tessera model files in Python.

A model file (proto/model.proto, text format) holds a model's forward program, the startup
program that initializes its parameters, feed bindings, the loss, the prediction, metrics and the
optimizer configuration. Every C++ runner loads it with ``--model=PATH``, validates it and
appends the backward and optimizer ops itself. This package is pure Python (protobuf only) and
builds the same programs as the C++ layers (common/layers/)::

    import tessera
    from tessera import layers

    x = layers.data("x", shape=[-1, 13], feed="dense")
    y = layers.data("y", shape=[-1, 1], feed="label")
    h = layers.fc(x, 64, act="relu")
    pred = layers.fc(h, 1)
    loss = layers.mean(layers.square_error_cost(pred, y))
    tessera.optimizer.Adam(learning_rate=0.001).minimize(loss)
    tessera.save_model("model.pbtxt", metrics=["mse"])
"""

from tessera import proto  # noqa: F401  (first: explains a missing or old protobuf runtime)
from tessera import initializer
from tessera import layers
from tessera import optimizer
from tessera import regularizer
from tessera.framework import (DEFAULT_SEED, FLOAT32, FLOAT64, INT32, INT64, REGISTERED_OPS,
                               Model, Program, Variable, default_main_program, default_model,
                               default_startup_program, model_guard, reset_default_model,
                               stable_hash)
from tessera.io import (FORMAT_VERSION, METRICS, Feed, build_model_file, check_model_file,
                        load_model, model_to_text, save_model, unregistered_ops)
from tessera.param_attr import ParamAttr
from tessera.proto.model_pb2 import FeedBinding, ModelFile, OptimizerConfig
from tessera.proto.program_pb2 import BlockDesc, OpDesc, ProgramDesc, VarDesc

__version__ = "0.1.0"

__all__ = [
    "BlockDesc", "DEFAULT_SEED", "FLOAT32", "FLOAT64", "FORMAT_VERSION", "Feed", "FeedBinding",
    "INT32", "INT64", "METRICS", "Model", "ModelFile", "OpDesc", "OptimizerConfig", "ParamAttr",
    "Program", "ProgramDesc", "REGISTERED_OPS", "VarDesc", "Variable", "build_model_file",
    "check_model_file", "default_main_program", "default_model", "default_startup_program",
    "initializer", "layers", "load_model", "model_guard", "model_to_text", "optimizer",
    "regularizer", "reset_default_model", "save_model", "stable_hash", "unregistered_ops",
]
