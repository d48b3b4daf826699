"""Shared pieces of the Criteo-format example models (13 dense features, 26 categorical slots,
optionally multi-hot slots after them): the flags every script takes and the input layers of
DeepFM, DCN and the multi-hot model."""

import argparse

import tessera
from tessera import layers

NUM_DENSE = 13
NUM_SLOTS = 26


def parse_bool(s):
    """Parses true/false/1/0/yes/no for boolean flags given a value."""
    v = s.lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError("expected true or false, got %r" % s)


def add_flags(p, embedding_dim, learning_rate=0.001, dict_size=10000):
    """Adds the flags the Criteo examples share to an ArgumentParser."""
    p.add_argument("--out", required=True, help="model file to write (text format)")
    p.add_argument("--distributed_tables", nargs="?", const=True, default=False,
                   type=parse_bool, help="embedding tables live on the pservers")
    p.add_argument("--learning_rate", type=float, default=learning_rate)
    p.add_argument("--dict_size", type=int, default=dict_size,
                   help="rows of each slot's local tables; raw ids are fed modulo this size")
    p.add_argument("--embedding_dim", type=int, default=embedding_dim)
    p.add_argument("--random_seed", type=int, default=0, help="0: the builder's default seed")


def inputs(num_dense=NUM_DENSE, num_slots=NUM_SLOTS):
    """Declares dense_input (DENSE), label (LABEL) and slot_<s> (SLOT s) in the default model."""
    dense = layers.data("dense_input", shape=[-1, num_dense], feed="dense")
    label = layers.data("label", shape=[-1, 1], feed="label")
    slots = [layers.data("slot_%d" % s, shape=[-1, 1], dtype="int64", slot=s)
             for s in range(num_slots)]
    return dense, label, slots


def multi_hot_inputs(num_multi):
    """Declares multi_slot_<m> (MULTI_SLOT m, lod_level 1: every id of each example's list) for
    the num_multi multi-hot columns, which follow the categorical ones in a data file."""
    return [layers.data("multi_slot_%d" % m, shape=[-1, 1], dtype="int64", slot=m, lod_level=1)
            for m in range(num_multi)]


def embeddings(slots, prefix, dict_size, dim, distributed, initializer=None):
    """One sparse table per slot, ``<prefix>_<s>`` [dict_size, dim]; returns the lookups."""
    return [layers.embedding(ids, size=[dict_size, dim], is_sparse=True,
                             is_distributed=distributed, name="%s_%d" % (prefix, s),
                             param_attr=initializer)
            for s, ids in enumerate(slots)]


def finish(logit, label, learning_rate, optimizer=None):
    """Sigmoid cross-entropy loss, sigmoid prediction, `optimizer` (a tessera.optimizer class,
    default Adam) at learning_rate; metrics auc and log_loss."""
    loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, label))
    prediction = layers.sigmoid(logit)
    (optimizer or tessera.optimizer.Adam)(learning_rate).minimize(loss)
    loss.model.set_outputs(prediction=prediction, metrics=["auc", "log_loss"])
    return loss, prediction
