// Communicator: collective and point-to-point operations among a fixed group of ranks.
//
// The interface every backend implements (gloo/ for CPU memory over TCP, nccl/ for GPU memory,
// CUDA builds only). A communicator is created by a Context (context.h) for all ranks, or by
// NewGroup() for a subset. Buffers are raw pointers with an element count and ElementType;
// the Gloo backend takes host memory, the NCCL backend device memory (and stages host buffers).
//
// Ordering: collectives are matched across ranks by the order in which they are issued, so
// every rank of the group must issue the same collectives in the same order. Operations of one
// communicator never overlap: each starts after every operation issued before it on that
// communicator (blocking or async), which makes "AllReduceAsync(a); AllReduceAsync(b);
// Broadcast(c)" well-defined. Point-to-point ISend/IRecv are matched by (peer, tag) in issue
// order and may overlap with collectives.
//
// Errors: InvalidArgument for bad arguments (nothing is sent); DeadlineExceeded when the
// operation does not finish within the communicator's timeout; Unavailable when a peer's
// connection fails. After a DeadlineExceeded/Unavailable/Internal error the communicator is
// broken (the ranks may disagree on what was exchanged): later operations return
// FailedPrecondition with the first error.
//
// Thread-safe: any thread may issue operations; issuing from several threads at once leaves
// their relative order (which must match across ranks) to the caller.
#ifndef TESSERA_COMMON_COLLECTIVE_COMMUNICATOR_H_
#define TESSERA_COMMON_COLLECTIVE_COMMUNICATOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/collective/request.h"
#include "common/collective/serial_executor.h"
#include "common/collective/types.h"

namespace tessera {
namespace collective {

// Operation kinds counted in CommStats.
enum class OpKind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSend, kRecv };
inline constexpr int kNumOpKinds = 7;
std::string OpKindName(OpKind kind);

// Counters of one operation kind on one rank.
struct OpCounters {
  int64_t calls = 0;
  // Payload bytes this rank handed to the operations for sending: the input buffer of
  // all-reduce, all-gather and reduce-scatter, the buffer of a broadcast at its root (0 at
  // other ranks), the buffer of a send; 0 for barrier and recv. (The ring algorithms put
  // about 2(N-1)/N times the all-reduce payload on the wire, (N-1) times the all-gather one.)
  // Compressed reductions (fp16, sparsification; see reducer.h) count what they actually hand
  // over, which is how tests check that compression sends fewer bytes.
  int64_t bytes = 0;
};

struct CommStats {
  std::array<OpCounters, kNumOpKinds> ops;

  const OpCounters& of(OpKind kind) const { return ops[static_cast<int>(kind)]; }
  // Sum of `bytes` over every kind.
  int64_t bytes_sent() const;
  // "all_reduce: 3 calls, 1200 bytes; ..." (kinds with calls only).
  std::string DebugString() const;
};

// The element type of T, for the typed helpers.
template <typename T>
struct ElementTypeFor;
template <>
struct ElementTypeFor<float> {
  static constexpr ElementType value = ElementType::kFloat32;
};
template <>
struct ElementTypeFor<double> {
  static constexpr ElementType value = ElementType::kFloat64;
};
template <>
struct ElementTypeFor<int32_t> {
  static constexpr ElementType value = ElementType::kInt32;
};
template <>
struct ElementTypeFor<int64_t> {
  static constexpr ElementType value = ElementType::kInt64;
};
template <>
struct ElementTypeFor<uint8_t> {
  static constexpr ElementType value = ElementType::kUint8;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This process's rank in the group, in [0, size()).
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual BackendType backend() const = 0;
  // "gloo rank 1/4 [group 'world']", for messages.
  std::string DebugName() const;

  // Element-wise reduction of `count` elements across ranks; every rank ends with the result
  // in `recv`. `send == recv` (or a null `send`) reduces in place. Blocks.
  absl::Status AllReduce(const void* send, void* recv, size_t count, ElementType type, ReduceOp op);
  // The same in the background; `send` and `recv` must stay valid and untouched until the
  // request finishes.
  std::unique_ptr<Request> AllReduceAsync(const void* send, void* recv, size_t count,
                                          ElementType type, ReduceOp op);
  // Copies `count` elements of `root`'s `buf` into `buf` on every rank.
  absl::Status Broadcast(void* buf, size_t count, ElementType type, int root);
  // Concatenates every rank's `count` elements of `send`, in rank order, into `recv`
  // (size() * count elements) on every rank.
  absl::Status AllGather(const void* send, void* recv, size_t count, ElementType type);
  // Reduces the size() * recv_count elements of `send` across ranks and leaves block `rank()`
  // (elements [rank() * recv_count, (rank() + 1) * recv_count)) of the result in `recv`.
  absl::Status ReduceScatter(const void* send, void* recv, size_t recv_count, ElementType type,
                             ReduceOp op);
  // Returns once every rank has entered the barrier.
  absl::Status Barrier();

  // Point-to-point: sends `count` elements to `peer`, received by the IRecv of `peer` with
  // the same tag and size. Non-blocking; `buf` must stay valid until the request finishes.
  std::unique_ptr<Request> ISend(const void* buf, size_t count, ElementType type, int peer,
                                 uint32_t tag = 0);
  std::unique_ptr<Request> IRecv(void* buf, size_t count, ElementType type, int peer,
                                 uint32_t tag = 0);
  // Blocking forms.
  absl::Status Send(const void* buf, size_t count, ElementType type, int peer, uint32_t tag = 0);
  absl::Status Recv(void* buf, size_t count, ElementType type, int peer, uint32_t tag = 0);

  // Runs `job` in the operation order of this communicator, after everything issued before it;
  // collectives `job` issues on this communicator run inside it. Used for composite
  // operations (compress, exchange, decompress) that must run in the background as one.
  std::unique_ptr<Request> Submit(std::function<absl::Status()> job);
  // The blocking form: runs `job` in order on this or the worker thread.
  absl::Status RunInOrder(std::function<absl::Status()> job);

  // A communicator for the ranks `ranks` (ranks of this communicator, distinct, any order:
  // the new group's rank i is ranks[i]). Only the members call it, in the same order for
  // groups with the same member list; a non-member gets nullptr without communicating.
  // Blocks until every member has joined (bounded by the timeout).
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks);

  // Typed helpers.
  template <typename T>
  absl::Status AllReduce(absl::Span<T> data, ReduceOp op) {
    return AllReduce(data.data(), data.data(), data.size(), ElementTypeFor<T>::value, op);
  }
  template <typename T>
  absl::Status Broadcast(absl::Span<T> data, int root) {
    return Broadcast(data.data(), data.size(), ElementTypeFor<T>::value, root);
  }
  template <typename T>
  absl::Status AllGather(absl::Span<const T> send, absl::Span<T> recv) {
    if (recv.size() != send.size() * static_cast<size_t>(size())) {
      return SizeMismatch("all_gather", recv.size(), send.size() * size());
    }
    return AllGather(send.data(), recv.data(), send.size(), ElementTypeFor<T>::value);
  }

  // Counters of this communicator since creation (or the last ResetStats()).
  CommStats stats() const;
  void ResetStats();
  // OK, or the error that broke the communicator.
  absl::Status health() const;

 protected:
  Communicator(int rank, int size);

  // Backend hooks. They run one at a time in issue order (on the caller's or the worker
  // thread) with validated arguments and count > 0 (a group of size 1 is handled
  // here without calling them; the group hook is always called).
  virtual absl::Status DoAllReduce(const void* send, void* recv, size_t count, ElementType type,
                                   ReduceOp op) = 0;
  virtual absl::Status DoBroadcast(void* buf, size_t count, ElementType type, int root) = 0;
  virtual absl::Status DoAllGather(const void* send, void* recv, size_t count,
                                   ElementType type) = 0;
  virtual absl::Status DoReduceScatter(const void* send, void* recv, size_t recv_count,
                                       ElementType type, ReduceOp op) = 0;
  virtual absl::Status DoBarrier() = 0;
  // Not serialized with the collectives; `bytes` > 0, peer != rank().
  virtual std::unique_ptr<Request> DoISend(const void* buf, size_t bytes, int peer,
                                           uint32_t tag) = 0;
  virtual std::unique_ptr<Request> DoIRecv(void* buf, size_t bytes, int peer, uint32_t tag) = 0;
  // `ranks` validated, this rank a member, ranks.size() >= 1. `group_key` is the same on every
  // member and distinct for every group created from this communicator (a rendezvous prefix).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> DoNewGroup(
      const std::vector<int>& ranks, const std::string& group_key) = 0;

  // Must be the first statement of a backend's destructor: stops the executor (cancelling
  // queued operations and waiting for the running one) while the backend still exists.
  void ShutdownExecutor() { executor_.Stop(); }
  // A short name of this group for DebugName ("world", "[0,2]").
  void set_group_name(std::string name) { group_name_ = std::move(name); }

  static absl::Status SizeMismatch(const char* op, size_t got, size_t want);

 private:
  // Runs a backend hook in order, turning a failure into the broken state.
  absl::Status RunOp(OpKind kind, int64_t bytes, std::function<absl::Status()> op);
  absl::Status CheckBuffers(const char* op, const void* a, const void* b, size_t count) const;
  absl::Status CheckRank(const char* op, const char* what, int r) const;
  void Count(OpKind kind, int64_t bytes);
  absl::Status Broken() const;
  void MaybeBreak(const absl::Status& status);

  const int rank_;
  const int size_;
  std::string group_name_ = "world";
  SerialExecutor executor_;

  mutable absl::Mutex mu_;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // How many groups with a given member list this rank has created (for group_key).
  std::vector<std::pair<std::vector<int>, int>> groups_created_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_COMMUNICATOR_H_
