#!/bin/bash
# Starts a Tessera collective-mode job (no pservers; trainers all-reduce their gradients) with
# Open MPI's mpirun: one trainer per MPI rank. mpirun only places and starts the processes; each
# rank runs tessera_mpi_task.sh, which turns OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE into
# --trainer_id / --trainers. Trainer 0 serves the NCCL id (or Gloo rendezvous) at its endpoint.
#
#   deploy/mpi/tessera_mpirun.sh -np 2 -- --example=mlp_regression            (this machine)
#   deploy/mpi/tessera_mpirun.sh -np 4 --hostfile hosts -- --example=ctr      (one rank per host)
#
# Options: -np N (required); --hostfile FILE (one rank per host, in file order: --map-by
# ppr:1:node); --port P (first port, default 6170; on one machine rank r uses P + r);
# --endpoints H:P,... (each rank's endpoint, N of them, instead of --port / the hostfile's
# hosts); --bind-to WHAT (mpirun's process binding, default socket as in the PyTorch DDP
# tutorial's `mpiexec -n 2 ... --bind-to socket`; none, core, ...); --dry-run (print the
# mpirun command instead of running it). Arguments after -- go to every trainer. Extra mpirun
# options can be given in TESSERA_MPIRUN_ARGS (e.g. --allow-run-as-root).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
np="" hostfile="" port=6170 dry_run="" given_endpoints="" bind_to=socket
while [ $# -gt 0 ]; do
  case "$1" in
    -np|--np) np="$2"; shift 2 ;;
    --hostfile) hostfile="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --endpoints) given_endpoints="$2"; shift 2 ;;
    --bind-to) bind_to="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    *) echo "tessera_mpirun.sh: unknown option '$1' (daemon flags go after --)" >&2; exit 2 ;;
  esac
done
if ! [[ "$np" =~ ^[1-9][0-9]*$ ]]; then
  echo "tessera_mpirun.sh: -np N is required (N >= 1)" >&2
  exit 2
fi

# Endpoint of rank r: the r-th host of the hostfile, or this machine with port + r.
endpoints=""
placement=()
if [ -n "$hostfile" ]; then
  mapfile -t hosts < <(awk '!/^[[:space:]]*(#|$)/ {print $1}' "$hostfile")
  [ "${#hosts[@]}" -ge "$np" ] ||
    { echo "tessera_mpirun.sh: $hostfile lists ${#hosts[@]} hosts for -np $np" >&2; exit 2; }
  for ((r = 0; r < np; r++)); do endpoints+="${endpoints:+,}${hosts[$r]}:$port"; done
  placement=(--hostfile "$hostfile" --map-by ppr:1:node)
else
  for ((r = 0; r < np; r++)); do endpoints+="${endpoints:+,}127.0.0.1:$((port + r))"; done
fi
if [ -n "$given_endpoints" ]; then
  IFS=, read -r -a listed <<< "$given_endpoints"
  [ "${#listed[@]}" -eq "$np" ] ||
    { echo "tessera_mpirun.sh: --endpoints lists ${#listed[@]} endpoints for -np $np" >&2; exit 2; }
  endpoints="$given_endpoints"
fi

# shellcheck disable=SC2206
extra=(${TESSERA_MPIRUN_ARGS:-})
cmd=(mpirun -np "$np" "${placement[@]}" --bind-to "$bind_to" "${extra[@]}"
     -x TESSERA_MPI_ENDPOINTS="$endpoints" -x TESSERA_MPI_JOB_ID="mpi-$(hostname -s)-$$"
     -x TESSERA_MPI_BIN_DIR="${TESSERA_MPI_BIN_DIR:-}"
     "$here/tessera_mpi_task.sh" "$@")
if [ -n "$dry_run" ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
