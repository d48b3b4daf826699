#!/usr/bin/env python3
"""A CTR model on Criteo-format data with multi-hot slots, written with the tessera package.

  inputs:  dense_input [-1, 13] (DENSE), slot_0 .. slot_25 [-1, 1] (SLOT 0..25, one id each),
           multi_slot_0 .. multi_slot_<M-1> (MULTI_SLOT 0..M-1, lod_level 1: a list of ids per
           example, possibly empty), label [-1, 1] (LABEL)
  slots:        emb_<s>(slot_s)                              [-1, 4] each (one row per example)
  multi-hot:    sequence_pool(multi_emb_<m>(multi_slot_m))   [-1, 4] each; the embedding has one
                row per id, pooled per example: multi-hot slot 0 "sum", 1 "average", the
                others "max" (an empty list pools to zeros)
  h = fc relu 32 (concat(slot embeddings, pooled multi-hot embeddings, dense_input))
  logit = fc 1 (h);  loss = mean(sigmoid_cross_entropy_with_logits(logit, label));
  prediction = sigmoid(logit); metrics auc, log_loss; Adagrad.

The multi-hot columns follow the 26 categorical ones in a data file (M1, M2, ...: ','-separated
ids; see common/data/criteo.h).

  PYTHONPATH=python python3 examples/python/multi_hot.py --out=multi_hot.pbtxt \\
      [--multi_hot_slots=2] [--distributed_tables]
"""

import argparse
import sys

import criteo
import tessera
from tessera import layers

# How each multi-hot slot is pooled: slot 0 sums, slot 1 averages, the others take the max.
POOL_TYPES = ("sum", "average")
DEFAULT_POOL = "max"


def pool_type(m):
    """The sequence_pool type of multi-hot slot m."""
    return POOL_TYPES[m] if m < len(POOL_TYPES) else DEFAULT_POOL


def build(multi_hot_slots=2, embedding_dim=4, dict_size=1000, hidden=32,
          distributed_tables=False, learning_rate=0.05, random_seed=0,
          num_dense=criteo.NUM_DENSE, num_slots=criteo.NUM_SLOTS):
    """Builds the multi-hot CTR model into a new tessera.Model."""
    if isinstance(multi_hot_slots, bool) or not isinstance(multi_hot_slots, int) or \
            multi_hot_slots < 0:
        raise ValueError("multi_hot_slots must be an int >= 0, got %r" % (multi_hot_slots,))
    model = tessera.Model(random_seed=random_seed)
    with tessera.model_guard(model):
        dense, label, slots = criteo.inputs(num_dense, num_slots)
        multi = criteo.multi_hot_inputs(multi_hot_slots)
        emb = criteo.embeddings(slots, "emb", dict_size, embedding_dim, distributed_tables)
        # One row per id (lod_level 1), pooled into one row per example.
        per_id = criteo.embeddings(multi, "multi_emb", dict_size, embedding_dim,
                                   distributed_tables)
        pooled = [layers.sequence_pool(e, pool_type(m)) for m, e in enumerate(per_id)]

        h = layers.concat(emb + pooled + [dense], axis=1)
        h = layers.fc(h, hidden, act="relu", name="deep_fc_0")
        logit = layers.fc(h, 1, name="deep_out")
        criteo.finish(logit, label, learning_rate, tessera.optimizer.Adagrad)
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    criteo.add_flags(p, embedding_dim=4, learning_rate=0.05, dict_size=1000)
    p.add_argument("--multi_hot_slots", type=int, default=2,
                   help="multi-hot columns after the categorical ones (0: none)")
    p.add_argument("--hidden", type=int, default=32, help="size of the hidden fc layer")
    args = p.parse_args(argv)
    try:
        build(multi_hot_slots=args.multi_hot_slots, embedding_dim=args.embedding_dim,
              dict_size=args.dict_size, hidden=args.hidden,
              distributed_tables=args.distributed_tables, learning_rate=args.learning_rate,
              random_seed=args.random_seed).save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("multi_hot: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
