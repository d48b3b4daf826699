#!/usr/bin/env python3
"""The wide & deep CTR model of examples/ctr, written with the tessera Python package.

Writes the model file that ``tessera::examples::CtrModelFile`` builds with the options of
``--example=ctr`` (examples/registry.cc: dict_size 10000 per slot, sparse tables, distributed
when --distributed_tables) -- the same variables, ops, initializers and seeds:

  deep:  concat(emb_0(slot_0), ..., emb_25(slot_25), dense_input) -> fc relu 64 -> fc relu 32
         -> fc 1                                              (embeddings of dimension 8)
  wide:  sum_s wide_s(slot_s)  +  linear(dense_input)         (dimension-1 embeddings per slot)
  logit = deep + wide;  loss = mean(sigmoid_cross_entropy_with_logits(logit, label));
  prediction = sigmoid(logit); metrics auc, log_loss; Adam, learning rate 0.001.

Feeds: dense_input DENSE, slot_<s> SLOT s (id_modulo = dict size for local tables, 0 for
distributed ones), label LABEL.

  PYTHONPATH=python python3 examples/python/wide_deep.py --out=ctr.pbtxt [--distributed_tables]
"""

import argparse
import sys

import tessera
from criteo import parse_bool
from tessera import layers


def build(num_dense=13, num_slots=26, embedding_dim=8, dict_size=10000, hidden=(64, 32),
          distributed_tables=False, is_sparse=True, optimizer="adam", learning_rate=0.001,
          l2_decay=0.0, random_seed=0, wide=True):
    """Builds the wide & deep model (CtrOptions' meaning) into a new tessera.Model.

    wide=False leaves the wide part out (no wide_<s> tables, no linear term): the deep model
    alone, e.g. to see what a slot's second table costs (tests/bench/RESULTS.md)."""
    model = tessera.Model(random_seed=random_seed)
    sparse = is_sparse or distributed_tables
    with tessera.model_guard(model):
        dense = None
        if num_dense > 0:
            dense = layers.data("dense_input", shape=[-1, num_dense], feed="dense")
        label = layers.data("label", shape=[-1, 1], feed="label")

        deep_inputs, wide_terms = [], []
        for s in range(num_slots):
            ids = layers.data("slot_%d" % s, shape=[-1, 1], dtype="int64", slot=s)
            deep_inputs.append(layers.embedding(
                ids, size=[dict_size, embedding_dim], is_sparse=sparse,
                is_distributed=distributed_tables, name="emb_%d" % s))
            if wide:
                wide_terms.append(layers.embedding(
                    ids, size=[dict_size, 1], is_sparse=sparse,
                    is_distributed=distributed_tables, name="wide_%d" % s,
                    param_attr=tessera.initializer.Constant(0.0)))

        # Deep part.
        if dense is not None:
            deep_inputs.append(dense)
        h = layers.concat(deep_inputs, axis=1)
        for i, size in enumerate(hidden):
            h = layers.fc(h, size, act="relu", name="deep_fc_%d" % i)
        logit = layers.fc(h, 1, name="deep_out")

        # Wide part: the per-slot weights summed, plus a linear term on the dense features.
        if wide_terms:
            logit = layers.elementwise_add(logit, layers.sums(wide_terms, name="wide_sum"))
        if dense is not None and wide:
            # deep_out carries the bias.
            logit = layers.elementwise_add(logit, layers.fc(dense, 1, name="wide_dense",
                                                            bias_attr=False))

        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, label))
        prediction = layers.sigmoid(logit)
        opt = {
            "sgd": lambda: tessera.optimizer.SGD(learning_rate, l2_decay=l2_decay),
            "momentum": lambda: tessera.optimizer.Momentum(learning_rate, 0.9, l2_decay=l2_decay),
            "adam": lambda: tessera.optimizer.Adam(learning_rate, l2_decay=l2_decay),
            "adagrad": lambda: tessera.optimizer.Adagrad(learning_rate, l2_decay=l2_decay),
        }
        if optimizer not in opt:
            raise ValueError("unknown optimizer %r (use sgd, momentum, adam or adagrad)" %
                             optimizer)
        opt[optimizer]().minimize(loss)
    model.set_outputs(prediction=prediction, metrics=["auc", "log_loss"])
    return model


def main(argv=None):
    """Parses the flags and writes the model file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="model file to write (text format)")
    p.add_argument("--distributed_tables", nargs="?", const=True, default=False,
                   type=parse_bool, help="embedding tables live on the pservers")
    p.add_argument("--learning_rate", type=float, default=0.001)
    p.add_argument("--dict_size", type=int, default=10000,
                   help="rows of each slot's tables (examples/registry.cc: 10000)")
    p.add_argument("--embedding_dim", type=int, default=8)
    p.add_argument("--optimizer", default="adam", choices=["sgd", "momentum", "adam", "adagrad"])
    p.add_argument("--l2_decay", type=float, default=0.0)
    p.add_argument("--random_seed", type=int, default=0, help="0: the builder's default seed")
    p.add_argument("--wide", nargs="?", const=True, default=True, type=parse_bool,
                   help="the wide part (per-slot dimension-1 tables and a linear term on the "
                        "dense features); --wide=false builds the deep model alone "
                        "(default: true)")
    args = p.parse_args(argv)
    try:
        model = build(dict_size=args.dict_size, embedding_dim=args.embedding_dim,
                      distributed_tables=args.distributed_tables, optimizer=args.optimizer,
                      learning_rate=args.learning_rate, l2_decay=args.l2_decay,
                      random_seed=args.random_seed, wide=args.wide)
        model.save(args.out)
    except (ValueError, TypeError, OSError) as e:
        print("wide_deep: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
