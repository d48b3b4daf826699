// GlooCommunicator: the CPU backend. Collectives over Gloo's TCP transport on host memory.
//
// All-reduce uses Gloo's ring (default), bcube or halving-doubling algorithm; all-gather,
// broadcast and barrier Gloo's own algorithms; reduce-scatter a ring over Gloo's unbound
// buffers; send/recv Gloo's unbound buffers directly. Ranks rendezvous through a Store: each
// publishes its transport address there and connects to every other rank (full mesh).
// Works for ranks that are processes and for ranks that are threads of one process.
// Gloo writes to sockets in a way that raises SIGPIPE when a peer has died; Create() therefore
// sets SIGPIPE to SIG_IGN if it still has its default action (so a lost peer is an
// Unavailable error, not a killed process).
// Thread-safe (see communicator.h for ordering rules).
#ifndef TESSERA_COMMON_COLLECTIVE_GLOO_GLOO_COMMUNICATOR_H_
#define TESSERA_COMMON_COLLECTIVE_GLOO_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective/communicator.h"
#include "common/collective/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace tessera {
namespace collective {

struct GlooOptions {
  // Address (IP or host name of this machine) the transport listens on and advertises to the
  // other ranks. Empty: this machine's host name. Use "127.0.0.1" when all ranks run on one
  // machine.
  std::string hostname;
  // Network interface to use instead of `hostname` (e.g. "eth0"); empty: unused.
  std::string interface;
  // Bound on the rendezvous and on every operation.
  absl::Duration timeout = absl::Seconds(60);

  enum class AllReduceAlgorithm {
    kRing,             // Gloo's segmented, pipelined ring (bandwidth-optimal; the default)
    kBcube,            // Gloo's bcube (fewer steps for many ranks)
    kHalvingDoubling,  // recursive halving-doubling (float32/float64; others use the ring)
  };
  AllReduceAlgorithm all_reduce_algorithm = AllReduceAlgorithm::kRing;
  // Largest message of the ring all-reduce (Gloo pipelines two in flight; each message costs a
  // receive-ready round trip). 0: Gloo's own default, 1 MiB. 4 MiB all-reduces 16-64 MB about
  // 25% faster than 1 MiB between two processes (tests/bench/RESULTS.md).
  size_t ring_segment_bytes = size_t{4} << 20;
};

class GlooCommunicator : public Communicator {
 public:
  // Rendezvous of `size` ranks through `store` (every rank passes a store with the same keys,
  // e.g. a PrefixStore per group; the store must be fresh for this rendezvous). Blocks until all
  // ranks have connected, up to options.timeout: DeadlineExceeded naming the store when a rank
  // is missing, Unavailable when the transport cannot bind `hostname`.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options);
  ~GlooCommunicator() override;

  BackendType backend() const override { return BackendType::kGloo; }
  const GlooOptions& options() const { return options_; }

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
  GlooCommunicator(int rank, int size, const GlooOptions& options, std::shared_ptr<Store> store,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context);
  // Rendezvous through `rendezvous`; groups made later rendezvous under `group_store`.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      std::shared_ptr<Store> rendezvous, std::shared_ptr<Store> group_store, int rank, int size,
      const GlooOptions& options, std::shared_ptr<gloo::transport::Device> device);
  uint32_t NextTag() { return next_tag_++; }
  absl::Status HalvingDoubling(void* buf, size_t count, ElementType type, ReduceOp op);
  // Divides a summed buffer by size() (kAvg).
  void Average(void* buf, size_t count, ElementType type) const;

  const GlooOptions options_;
  // The store groups are created through (the world store: group keys are prefixes in it).
  const std::shared_ptr<Store> store_;
  const std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  // Tag of the next collective; only touched by operations, which never overlap.
  uint32_t next_tag_ = 0;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_GLOO_GLOO_COMMUNICATOR_H_
