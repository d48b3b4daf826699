#!/bin/bash
# Runs check_manifests.py (see there) with a Python that has PyYAML (Debian: python3-yaml).
set -euo pipefail
root="${TEST_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}/tessera"
py=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import yaml' 2>/dev/null; then
    py="$candidate"
    break
  fi
done
if [ -z "$py" ]; then
  echo "manifests_test: no python3 with PyYAML (apt-get install python3-yaml; deploy/setup does)" >&2
  exit 1
fi
exec "$py" "$root/deploy/check_manifests.py" --print_settings="$root/deploy/print_settings" \
  --deploy_dir="$root/deploy"
