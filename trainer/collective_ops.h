// The trainer's collective-mode ops (no pservers), registered with the state they share:
//   c_comm_init      joins the job: rank `rank` of `world_size`, rendezvous at trainer 0's
//                    endpoint (Gloo over TCP; Fluid's gen_nccl_id step).
//   c_broadcast      X (list): every trainer gets trainer 0's values (initial parameters).
//   c_allreduce_mean X (list), in place: the mean over trainers, coalesced into one buffer.
//                    Sparse (SelectedRows) gradients are first made dense (Horovod's
//                    sparse_as_dense), so optimizers see dense gradients in collective mode.
#ifndef TESSERA_TRAINER_COLLECTIVE_OPS_H_
#define TESSERA_TRAINER_COLLECTIVE_OPS_H_

#include <string>

#include "common/collective/context.h"
#include "common/op_registry.h"

namespace tessera {

struct CollectiveState {
  collective::Context context;
  collective::InitMethod method = collective::InitMethod::kTcp;
  collective::InitParams params;
  int rank = 0;
  int world_size = 1;
};

// `state` must outlive the registry.
absl::Status RegisterCollectiveOps(OpRegistry* registry, CollectiveState* state);

}  // namespace tessera

#endif  // TESSERA_TRAINER_COLLECTIVE_OPS_H_
