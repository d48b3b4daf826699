#!/bin/bash
# One MPI rank of a collective-mode job (started by tessera_mpirun.sh): runs tessera_trainer with
# its rank and the job size from Open MPI's environment (PMI_RANK / PMI_SIZE for MPICH).
set -euo pipefail
rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-}}"
size="${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-}}"
if [ -z "$rank" ] || [ -z "$size" ]; then
  echo "tessera_mpi_task.sh: no MPI rank in the environment: start it with tessera_mpirun.sh" >&2
  exit 2
fi
: "${TESSERA_MPI_ENDPOINTS:?not set: start this script with tessera_mpirun.sh}"
IFS=, read -r -a eps <<< "$TESSERA_MPI_ENDPOINTS"
[ "${#eps[@]}" -eq "$size" ] || {
  echo "tessera_mpi_task.sh: ${#eps[@]} endpoints for $size ranks" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${TESSERA_MPI_BIN_DIR:-}"
if [ -n "$bin" ]; then bin="$bin/tessera_trainer"
else bin="$here/../../bazel-bin/trainer/tessera_trainer"; fi
exec "$bin" --role=trainer --mode=collective --trainer_id="$rank" --trainers="$size" \
  --trainer_endpoints="$TESSERA_MPI_ENDPOINTS" --current_endpoint="${eps[$rank]}" \
  --job_id="${TESSERA_MPI_JOB_ID:-mpi}" "$@"
