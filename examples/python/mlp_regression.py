#!/usr/bin/env python3
"""The perceptron regression model of examples/mlp_regression, written with tessera.

Writes the model file ``tessera::examples::MlpRegressionModelFile`` builds with its default
options: 10 dense features in [1, 2], standardized inside the model ((x - 1.5) * sqrt(12)), one
hidden layer of 100 ReLU units, one output, the mean square error as the loss, SGD with momentum
0.9 and learning rate 0.001, metric mse. Feeds: x DENSE, y LABEL.

  PYTHONPATH=python python3 examples/python/mlp_regression.py --out=mlp.pbtxt
"""

import argparse
import math
import sys

import tessera
from tessera import layers
from tessera.initializer import float32


def build(num_features=10, hidden=100, learning_rate=0.001, momentum=0.9,
          standardize_inputs=True, random_seed=0):
    """Builds the model (MlpRegressionOptions' meaning) into a new tessera.Model."""
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        x = layers.data("x", shape=[-1, num_features], feed="dense")
        y = layers.data("y", shape=[-1, 1], feed="label")
        h = x
        if standardize_inputs:
            # Uniform [1, 2]: mean 1.5, standard deviation 1 / sqrt(12); float32 as in C++.
            k = float32(math.sqrt(12.0))
            h = layers.scale(x, scale=k, bias=float32(-1.5 * k))
        h = layers.fc(h, hidden, act="relu", name="hidden")
        pred = layers.fc(h, 1, name="output")
        loss = layers.mean(layers.square_error_cost(pred, y))
        tessera.optimizer.Momentum(learning_rate, momentum=momentum).minimize(loss)
    model.set_outputs(metrics=["mse"])
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="model file to write (text format)")
    p.add_argument("--learning_rate", type=float, default=0.001)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--random_seed", type=int, default=0, help="0: the builder's default seed")
    args = p.parse_args(argv)
    try:
        build(learning_rate=args.learning_rate, momentum=args.momentum,
              random_seed=args.random_seed).save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("mlp_regression: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
