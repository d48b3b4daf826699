// Context: one process's membership in a collective job — rendezvous, the backend, the world
// communicator and the rank/device accessors. The caller owns it (there is no global one);
// a trainer creates one at start, passes context.world() to the reducers (reducer.h), and
// destroys it (or calls Shutdown()) at the end.
//
//   collective::Context ctx;
//   InitParams params;
//   params.endpoint = "10.0.0.1:6170";                 // rank 0's address, the same for all
//   TS_RETURN_IF_ERROR(ctx.Init(InitMethod::kTcp, trainer_id, num_trainers, params));
//   ... after backward:
//   TS_RETURN_IF_ERROR(AllReduceMultiple(ctx.world(), grads, {.scale = 1.0 / ctx.WorldSize()}));
//
// Initialization methods:
//   kTcp         rank 0 serves a small key-value store (tcp_store.h) on params.endpoint, every
//                rank (rank 0 too) connects to it; addresses (Gloo) or the NCCL unique id are
//                exchanged there.
//   kFileSystem  the store is a directory (params.path) every rank can reach; it must be fresh
//                for each job.
//   kMpi         the job was launched by mpirun: rank and world size come from MPI
//                (MPI_Init is called unless the caller did), rank 0 serves a TCP store on a free
//                port and broadcasts its address with MPI_Bcast. MPI is used for nothing else.
//                If the context called MPI_Init it calls MPI_Finalize in Shutdown().
//
// Thread-compatible: Init() and Shutdown() must not race with other calls; the communicators
// it hands out are thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_CONTEXT_H_
#define TESSERA_COMMON_COLLECTIVE_CONTEXT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/collective/communicator.h"
#include "common/collective/gloo/gloo_communicator.h"
#include "common/collective/store.h"
#include "common/collective/types.h"

namespace tessera {
namespace collective {

class MpiSession;
class TcpStoreServer;

struct InitParams {
  BackendType backend = BackendType::kGloo;
  // kTcp: "host:port" where rank 0 serves the rendezvous store; the same on every rank.
  std::string endpoint;
  // kFileSystem: directory shared by every rank (created if missing; fresh for every job).
  std::string path;
  // kMpi: host name or address rank 0 serves its store on (reachable by every rank);
  // empty: this machine's host name.
  std::string mpi_store_host;
  // Bound on rendezvous and on every collective operation.
  absl::Duration timeout = absl::Seconds(60);
  // Key prefix in the store, so that several jobs (or several contexts of one job) can share a
  // store. Every rank of one context uses the same value.
  std::string job_id;
  // kTcp / kMpi: secret the rendezvous store requires from every rank ("" = none); see
  // tcp_store.h. Every rank of one context uses the same value.
  std::string job_token;

  // GPUs per machine: DeviceId() = local rank mod max_devices_per_node. Must be >= 1.
  int max_devices_per_node = 8;
  // NCCL: the GPU ordinal of this rank's communicator; -1: DeviceId() above. A trainer passes
  // the device it runs on (--devices), so that its all-reduce and its ops share a GPU.
  int device_id = -1;
  // This rank's index among the ranks on its machine; -1: from MPI (kMpi) or rank mod
  // max_devices_per_node (which assumes consecutive ranks share a machine).
  int local_rank = -1;

  // Gloo settings (its `timeout` is replaced by `timeout` above). An empty gloo.hostname is
  // derived: "127.0.0.1" when the kTcp endpoint is a loopback address, else this machine's
  // host name.
  GlooOptions gloo;
};

class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Joins the job as rank `rank` of `world_size` (for kMpi pass -1 for both, or the values MPI
  // will report). Blocks until every rank has joined, up to params.timeout. InvalidArgument for
  // bad values (naming them), FailedPrecondition if already initialized, DeadlineExceeded when
  // a rank does not show up, Unavailable when the store or transport cannot be reached,
  // Unimplemented for NCCL in a build without CUDA. On failure the context stays uninitialized.
  absl::Status Init(InitMethod method, int rank, int world_size, const InitParams& params);
  // The same with a store the caller provides (e.g. a HashStore shared by ranks that are
  // threads of one process).
  absl::Status InitWithStore(std::shared_ptr<Store> store, int rank, int world_size,
                             const InitParams& params);

  bool IsInitialized() const { return world_ != nullptr; }
  // kNone until initialized.
  BackendType Backend() const { return world_ ? backend_ : BackendType::kNone; }
  // 0 until initialized.
  int Rank() const { return world_ ? world_->rank() : 0; }
  // 1 until initialized.
  int WorldSize() const { return world_ ? world_->size() : 1; }
  // This rank's index on its machine (0 until initialized).
  int LocalRank() const { return world_ ? local_rank_ : 0; }
  // The GPU this rank should drive: LocalRank() mod max_devices_per_node (0 until initialized).
  int DeviceId() const {
    if (!world_) return 0;
    return device_id_ >= 0 ? device_id_ : local_rank_ % max_devices_per_node_;
  }
  // The communicator of all ranks; nullptr until initialized. Owned by the context.
  Communicator* world() const { return world_.get(); }
  // The rendezvous store (nullptr until initialized).
  Store* store() const { return store_.get(); }
  // Sub-group of world ranks; see Communicator::NewGroup. FailedPrecondition before Init.
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks);

  // Graceful end: waits for every rank at a barrier (bounded by the timeout; its error is
  // returned but shutdown proceeds), closes the communicator, stops rank 0's store server and
  // finalizes MPI if this context initialized it. The context is uninitialized afterwards.
  // Idempotent. The destructor closes without the barrier (peers still in an operation with
  // this rank then get Unavailable), so call Shutdown() at the normal end of a job.
  absl::Status Shutdown();

 private:
  absl::Status InitBackend(std::shared_ptr<Store> store, int rank, int world_size,
                           const InitParams& params, const std::string& default_hostname);

  BackendType backend_ = BackendType::kNone;
  int local_rank_ = 0;
  int device_id_ = -1;  // InitParams::device_id
  int max_devices_per_node_ = 1;
  std::unique_ptr<MpiSession> mpi_;
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<Communicator> world_;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_CONTEXT_H_
