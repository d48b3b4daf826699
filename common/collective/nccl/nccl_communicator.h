// NcclCommunicator: the GPU backend (built only with --config=cuda). Collectives are NCCL calls
// on a CUDA stream of the rank's device; each operation waits for its stream, polling so that
// the communicator's timeout bounds it (on timeout the NCCL communicator is aborted and this
// communicator is broken). Rendezvous: rank 0 creates the NCCL unique id and publishes it in the
// Store (the same TCP / file / MPI-bootstrapped store the Gloo backend uses); the others read it
// and every rank calls ncclCommInitRankConfig (non-blocking, so a missing rank times out).
//
// Buffers may be device memory (used directly) or host memory (staged through a device buffer:
// copied in, reduced, copied out), so the tensor helpers of reducer.h work with either.
// Point-to-point: ISend/IRecv are issued in order on a separate stream and complete
// independently; as with NCCL itself, two ranks that both send before receiving can block
// each other on large messages, so post the IRecv first on one side.
// Thread-safe (see communicator.h for ordering rules).
#ifndef TESSERA_COMMON_COLLECTIVE_NCCL_NCCL_COMMUNICATOR_H_
#define TESSERA_COMMON_COLLECTIVE_NCCL_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective/communicator.h"
#include "common/collective/store.h"

namespace tessera {
namespace collective {

struct NcclOptions {
  // CUDA device this rank drives (Context passes its DeviceId()).
  int device_id = 0;
  // Bound on the rendezvous and on every operation.
  absl::Duration timeout = absl::Seconds(60);
};

class NcclCommunicator : public Communicator {
 public:
  // Rendezvous of `size` ranks through `store` (see the file comment). InvalidArgument for bad
  // values, Unavailable when CUDA or NCCL fail (with their message), DeadlineExceeded when a
  // rank does not join within options.timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const NcclOptions& options);
  ~NcclCommunicator() override;

  BackendType backend() const override { return BackendType::kNccl; }
  int device_id() const { return options_.device_id; }

  struct Impl;  // CUDA and NCCL handles (nccl_communicator.cc)

 protected:
  absl::Status DoAllReduce(const void* send, void* recv, size_t count, ElementType type,
                           ReduceOp op) override;
  absl::Status DoBroadcast(void* buf, size_t count, ElementType type, int root) override;
  absl::Status DoAllGather(const void* send, void* recv, size_t count, ElementType type) override;
  absl::Status DoReduceScatter(const void* send, void* recv, size_t recv_count, ElementType type,
                               ReduceOp op) override;
  absl::Status DoBarrier() override;
  std::unique_ptr<Request> DoISend(const void* buf, size_t bytes, int peer, uint32_t tag) override;
  std::unique_ptr<Request> DoIRecv(void* buf, size_t bytes, int peer, uint32_t tag) override;
  absl::StatusOr<std::unique_ptr<Communicator>> DoNewGroup(const std::vector<int>& ranks,
                                                           const std::string& group_key) override;

 private:
  NcclCommunicator(int rank, int size, const NcclOptions& options, std::shared_ptr<Store> store,
                   std::unique_ptr<Impl> impl);
  // Rendezvous under `rendezvous`; groups made later rendezvous under `group_store`.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      std::shared_ptr<Store> rendezvous, std::shared_ptr<Store> group_store, int rank, int size,
      const NcclOptions& options);

  const NcclOptions options_;
  const std::shared_ptr<Store> store_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_NCCL_NCCL_COMMUNICATOR_H_
