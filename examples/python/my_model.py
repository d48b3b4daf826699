# my_model.py: the model of README's "Train your own model" (tests/own_model_test.sh runs it).
# A click model over Criteo columns: 13 dense features and 26 categorical slots, each slot
# embedded in a table that lives on the pservers (any int64 id), then a small MLP.
import sys

import tessera
from tessera import layers

with tessera.model_guard(tessera.Model()):
    dense = layers.data("dense", shape=[-1, 13], feed="dense")
    label = layers.data("click", shape=[-1, 1], feed="label")
    embedded = []
    for s in range(26):
        ids = layers.data("c%d" % s, shape=[-1, 1], dtype="int64", slot=s)
        embedded.append(layers.embedding(ids, size=[100000, 4], is_sparse=True,
                                         is_distributed=True, name="table_%d" % s))
    h = layers.fc(layers.concat(embedded + [dense], axis=1), 32, act="relu")
    logit = layers.fc(h, 1)
    loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, label))
    prediction = layers.sigmoid(logit)
    tessera.optimizer.Adagrad(learning_rate=0.05).minimize(loss)
    tessera.save_model(sys.argv[1], loss=loss, prediction=prediction, metrics=["auc", "log_loss"])
