// The trainer's collective-mode ops (no pservers), registered with the state they share:
//   c_comm_init      joins the job: rank `rank` of `world_size`, rendezvous at trainer 0's
//                    endpoint (Gloo over TCP; Fluid's gen_nccl_id step).
//   c_broadcast      X (list): every trainer gets trainer 0's values (initial parameters).
//   c_allreduce_mean X (list), in place: the mean over trainers, coalesced into one buffer.
//                    Sparse (SelectedRows) gradients are first made dense (Horovod's
//                    sparse_as_dense), so optimizers see dense gradients in collective mode.
//                    Compressed as CollectiveState::reduce says (fp16, top-k, threshold);
//                    top-k and threshold keep what was not sent for the next step (error
//                    feedback, CollectiveState::feedback).
//   c_allreduce_start X (one gradient): hands it (made dense) to the step's coalescing
//                    reducer, which reduces a bucket of about CollectiveState::bucket_bytes in
//                    the background once it is full (the overlap of TranspileCollective).
//   c_allreduce_wait X (list): flushes the last bucket and waits for every reduction of the
//                    step: the mean over trainers, as c_allreduce_mean gives. Uncompressed or
//                    fp16 only (top-k and threshold need c_allreduce_mean's error feedback).
#ifndef TESSERA_TRAINER_COLLECTIVE_OPS_H_
#define TESSERA_TRAINER_COLLECTIVE_OPS_H_

#include <memory>
#include <string>

#include "common/collective/context.h"
#include "common/collective/reducer.h"
#include "common/framework/op_registry.h"

namespace tessera {

struct CollectiveState {
  collective::Context context;
  collective::InitMethod method = collective::InitMethod::kTcp;
  collective::InitParams params;
  int rank = 0;
  int world_size = 1;
  // Options of the gradient all-reduce (compression); scale unset = the mean.
  collective::MultiReduceOptions reduce;
  // Residuals of top-k / threshold compression (used only for those kinds).
  collective::ErrorFeedback feedback;
  // Bytes the gradient all-reduces handed to the communicator (after compression).
  int64_t gradient_bytes = 0;
  // The overlapped all-reduce: the step's reducer (from its first c_allreduce_start to its
  // c_allreduce_wait) and its bucket size.
  std::unique_ptr<collective::CoalescingReducer> reducer;
  int64_t reducer_bytes_before = 0;
  size_t bucket_bytes = size_t{4} << 20;
};

// `state` must outlive the registry.
absl::Status RegisterCollectiveOps(OpRegistry* registry, CollectiveState* state);

}  // namespace tessera

#endif  // TESSERA_TRAINER_COLLECTIVE_OPS_H_
