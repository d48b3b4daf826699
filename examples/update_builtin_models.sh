#!/usr/bin/env bash
# Rewrites cluster/builtin_models/*.pbtxt from the examples' C++ builders (see
# //examples:builtin_models_test). Run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //examples:tessera_program
for example in ctr mlp_regression fashion_mnist_mlp lenet; do
  bazel-bin/examples/tessera_program --example=$example \
    --model_out="$PWD/cluster/builtin_models/$example.pbtxt" >/dev/null
  echo "wrote cluster/builtin_models/$example.pbtxt"
done
