#!/usr/bin/env python3
"""DeepFM (Guo et al. 2017) on Criteo-format data, written with the tessera Python package.

  first order:   sum_s w_s(slot_s) + linear(dense_input)          (dimension-1 tables fm_w_<s>)
  second order:  0.5 * sum_k ((sum_s e_s)_k^2 - sum_s (e_s)_k^2)   (tables emb_<s>, dim K)
  deep:          concat(e_0, ..., e_25, dense_input) -> fc relu 400 -> 400 -> 400 -> fc 1
                 (--dropout=p: dropout after each relu layer in training, scaled at inference)
  logit = first + second + deep;  loss = mean(sigmoid_cross_entropy_with_logits(logit, label));
  prediction = sigmoid(logit); metrics auc, log_loss; Adam.

The FM and the deep part share the embeddings e_s. The second-order sum over the embedding dim
is the op reduce_sum (Fluid's attributes: dim [1], keep_dim true, reduce_all false), [-1, K] ->
[-1, 1].

  PYTHONPATH=python python3 examples/python/deepfm.py --out=deepfm.pbtxt [--distributed_tables]
"""

import argparse
import sys

import criteo
import tessera
from tessera import layers


def build(embedding_dim=10, dict_size=10000, hidden=(400, 400, 400), distributed_tables=False,
          learning_rate=0.001, random_seed=0, num_dense=criteo.NUM_DENSE,
          num_slots=criteo.NUM_SLOTS, dropout=0.0):
    """Builds DeepFM into a new tessera.Model."""
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        dense, label, slots = criteo.inputs(num_dense, num_slots)
        emb = criteo.embeddings(slots, "emb", dict_size, embedding_dim, distributed_tables)
        first = criteo.embeddings(slots, "fm_w", dict_size, 1, distributed_tables,
                                  tessera.initializer.Constant(0.0))

        # First order: per-slot weights plus a linear term of the dense features (with the
        # model's one bias).
        y_first = layers.elementwise_add(layers.sums(first, name="fm_first_sum"),
                                         layers.fc(dense, 1, name="fm_dense"))

        # Second order: 0.5 * ((sum e)^2 - sum e^2), summed over the embedding dim.
        sum_e = layers.sums(emb, name="fm_sum")
        square_of_sum = layers.elementwise_mul(sum_e, sum_e)
        sum_of_squares = layers.sums([layers.elementwise_mul(e, e) for e in emb],
                                     name="fm_sum_sq")
        pairwise = layers.elementwise_sub(square_of_sum, sum_of_squares)
        y_second = layers.scale(layers.reduce_sum(pairwise, dim=1, keep_dim=True), scale=0.5)

        # Deep part.
        h = layers.concat(emb + [dense], axis=1)
        for i, size in enumerate(hidden):
            h = layers.fc(h, size, act="relu", name="deep_fc_%d" % i)
            if dropout > 0:
                h = layers.dropout(h, dropout_prob=dropout, name="deep_dropout_%d" % i)
        y_deep = layers.fc(h, 1, name="deep_out", bias_attr=False)

        logit = layers.elementwise_add(layers.elementwise_add(y_first, y_second), y_deep)
        criteo.finish(logit, label, learning_rate)
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    criteo.add_flags(p, embedding_dim=10)
    p.add_argument("--hidden", default="400,400,400", help="deep fc sizes, comma-separated")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability after each deep layer (default 0: none)")
    args = p.parse_args(argv)
    try:
        hidden = [int(h) for h in args.hidden.split(",") if h]
        build(embedding_dim=args.embedding_dim, dict_size=args.dict_size, hidden=hidden,
              distributed_tables=args.distributed_tables, learning_rate=args.learning_rate,
              random_seed=args.random_seed, dropout=args.dropout).save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("deepfm: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
