#include "common/collective/mpi_session.h"

// Debian installs OpenMPI's headers outside the default include path; this alias is in it.
// Only the C API is used (the C++ bindings would include <mpi.h> from the other path).
#define OMPI_SKIP_MPICXX 1
#include <openmpi/mpi.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace collective {
namespace {

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return absl::StrCat("MPI error ", code);
  return std::string(text, len);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiSession>> MpiSession::Start() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError(
        "MPI was already finalized in this process; it cannot be initialized again");
  }
  std::unique_ptr<MpiSession> session(new MpiSession());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    const int rc = MPI_Init(nullptr, nullptr);
    if (rc != MPI_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("MPI_Init failed: ", MpiError(rc)));
    }
    session->owns_mpi_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &session->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &session->size_);
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, session->rank_, MPI_INFO_NULL,
                          &node) == MPI_SUCCESS) {
    MPI_Comm_rank(node, &session->local_rank_);
    MPI_Comm_free(&node);
  }
  return session;
}

MpiSession::~MpiSession() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

absl::StatusOr<std::string> MpiSession::Broadcast(const std::string& value, int root) {
  unsigned long long len = value.size();  // NOLINT(runtime/int): MPI_UNSIGNED_LONG_LONG
  int rc = MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("MPI_Bcast from rank ", root, ": ", MpiError(rc)));
  }
  std::vector<char> buf(value.begin(), value.end());
  buf.resize(len);
  if (len > 0) {
    rc = MPI_Bcast(buf.data(), static_cast<int>(len), MPI_CHAR, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("MPI_Bcast from rank ", root, ": ", MpiError(rc)));
    }
  }
  return std::string(buf.begin(), buf.end());
}

absl::Status MpiSession::Barrier() {
  const int rc = MPI_Barrier(MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return absl::UnavailableError(absl::StrCat("MPI_Barrier: ", MpiError(rc)));
  return absl::OkStatus();
}

}  // namespace collective
}  // namespace tessera
