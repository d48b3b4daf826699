// MpiSession: the little of MPI that collective mode uses — rank, size and node-local rank of a
// process started by mpirun, and a string broadcast to hand out the rendezvous address. Calls
// MPI_Init (errors returned, not fatal) unless MPI is already initialized, and MPI_Finalize on
// destruction only if it called MPI_Init. MPI can be initialized once per process, so at most one
// session that initializes it may exist in a process's lifetime. Not thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_MPI_SESSION_H_
#define TESSERA_COMMON_COLLECTIVE_MPI_SESSION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tessera {
namespace collective {

class MpiSession {
 public:
  // Unavailable (with MPI's message) when MPI cannot be initialized, FailedPrecondition when it
  // was already finalized.
  static absl::StatusOr<std::unique_ptr<MpiSession>> Start();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes sharing this machine (MPI_COMM_TYPE_SHARED).
  int local_rank() const { return local_rank_; }

  // `value` of `root` on every rank (collective over MPI_COMM_WORLD).
  absl::StatusOr<std::string> Broadcast(const std::string& value, int root);
  // MPI_Barrier over MPI_COMM_WORLD.
  absl::Status Barrier();

 private:
  MpiSession() = default;

  bool owns_mpi_ = false;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_MPI_SESSION_H_
