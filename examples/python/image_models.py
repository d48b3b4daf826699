#!/usr/bin/env python3
"""The Fashion-MNIST image classifiers of examples/fashion_mnist, written with tessera.

Writes the model file ``tessera::examples::FashionMnistMlpModelFile`` (--model=mlp: 784 -> 256
ReLU -> 10, the PyTorch DDP tutorial's MLP) or ``LenetModelFile`` (--model=lenet: SINGA's LeNet,
conv 5x5x20 ReLU, max pool 2, conv 5x5x50 ReLU, max pool 2, flatten, fc 500 ReLU, fc 10) builds
with its default options. Feeds: pixels DENSE [-1, 784] in [0, 1], label LABEL int64 class ids;
loss: mean softmax cross-entropy; prediction: the softmax; metric accuracy; SGD with momentum.
Train it on the real data with --data_format=idx --train_data=/usr/share/datasets/fashion-mnist/train
(Debian's dataset-fashion-mnist).

  PYTHONPATH=python python3 examples/python/image_models.py --model=lenet --out=lenet.pbtxt
"""

import argparse
import sys

import tessera
from tessera import layers

DEFAULT_LR = {"mlp": 0.02, "lenet": 0.02}


def build(model_name="mlp", learning_rate=None, momentum=0.9, hidden=256, random_seed=0):
    """Builds the model (ImageModelOptions' meaning) into a new tessera.Model."""
    if model_name not in DEFAULT_LR:
        raise ValueError("unknown model %r (use mlp or lenet)" % (model_name,))
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        pixels = layers.data("pixels", shape=[-1, 784], feed="dense")
        label = layers.data("label", shape=[-1, 1], dtype="int64", feed="label")
        if model_name == "mlp":
            h = layers.fc(pixels, hidden, act="relu", name="hidden")
            logits = layers.fc(h, 10, name="output")
        else:
            x = layers.reshape(pixels, [-1, 1, 28, 28])
            x = layers.pool2d(layers.conv2d(x, 20, 5, act="relu", name="conv1"), 2, "max")
            x = layers.pool2d(layers.conv2d(x, 50, 5, act="relu", name="conv2"), 2, "max")
            x = layers.flatten(x)
            x = layers.fc(x, 500, act="relu", name="fc1")
            logits = layers.fc(x, 10, name="fc2")
        loss, softmax = layers.softmax_with_cross_entropy(logits, label, return_softmax=True)
        loss = layers.mean(loss)
        lr = DEFAULT_LR[model_name] if not learning_rate else learning_rate
        tessera.optimizer.Momentum(lr, momentum=momentum).minimize(loss)
    model.set_outputs(prediction=softmax, metrics=["accuracy"])
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="model file to write (text format)")
    p.add_argument("--model", default="mlp", choices=["mlp", "lenet"])
    p.add_argument("--learning_rate", type=float, default=0.0, help="0: the model's default")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--random_seed", type=int, default=0, help="0: the builder's default seed")
    args = p.parse_args(argv)
    try:
        build(args.model, learning_rate=args.learning_rate, momentum=args.momentum,
              random_seed=args.random_seed).save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("image_models: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
