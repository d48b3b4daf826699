#!/usr/bin/env python3
"""Deep & Cross Network (Wang et al. 2017) on Criteo-format data, written with tessera.

  x0 = concat(e_0, ..., e_25, dense_input)             (tables emb_<s> of dimension K)
  cross:  x_{l+1} = x0 * (x_l . w_l) + b_l + x_l       (w_l [D, 1] as cross_<l>.w, b_l [D])
  deep:   x0 -> fc relu 256 -> fc relu 128
  logit = fc(concat(x_L, deep), 1);  loss = mean(sigmoid_cross_entropy_with_logits(logit, label));
  prediction = sigmoid(logit); metrics auc, log_loss; Adam.

Only ops the C++ registry has: x_l . w_l is a bias-free fc ([-1, D] x [D, 1] -> [-1, 1]) and
x0 * s broadcasts the per-example scalar s [-1, 1] over x0's rows (elementwise_mul, axis 0).

  PYTHONPATH=python python3 examples/python/dcn.py --out=dcn.pbtxt [--distributed_tables]
"""

import argparse
import sys

import criteo
import tessera
from tessera import layers


def build(embedding_dim=8, dict_size=10000, num_cross=3, hidden=(256, 128),
          distributed_tables=False, learning_rate=0.001, random_seed=0,
          num_dense=criteo.NUM_DENSE, num_slots=criteo.NUM_SLOTS):
    """Builds DCN into a new tessera.Model."""
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        dense, label, slots = criteo.inputs(num_dense, num_slots)
        emb = criteo.embeddings(slots, "emb", dict_size, embedding_dim, distributed_tables)
        x0 = layers.concat(emb + [dense], axis=1)
        width = x0.shape[1]

        # Cross network.
        x = x0
        for l in range(num_cross):
            s = layers.fc(x, 1, name="cross_%d" % l, bias_attr=False)      # x_l . w_l
            b = layers.create_parameter([width], name="cross_%d.b" % l,
                                        default_initializer=tessera.initializer.Constant(0.0))
            x = layers.elementwise_add(
                layers.elementwise_add(layers.elementwise_mul(x0, s, axis=0), b, axis=1), x)

        # Deep network.
        h = x0
        for i, size in enumerate(hidden):
            h = layers.fc(h, size, act="relu", name="deep_fc_%d" % i)

        logit = layers.fc(layers.concat([x, h], axis=1), 1, name="combine")
        criteo.finish(logit, label, learning_rate)
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    criteo.add_flags(p, embedding_dim=8)
    p.add_argument("--num_cross", type=int, default=3, help="cross layers")
    p.add_argument("--hidden", default="256,128", help="deep fc sizes, comma-separated")
    args = p.parse_args(argv)
    try:
        hidden = [int(h) for h in args.hidden.split(",") if h]
        build(embedding_dim=args.embedding_dim, dict_size=args.dict_size,
              num_cross=args.num_cross, hidden=hidden,
              distributed_tables=args.distributed_tables, learning_rate=args.learning_rate,
              random_seed=args.random_seed).save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("dcn: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
