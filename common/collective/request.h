// Request: a handle on a collective or point-to-point operation running in the background
// (Communicator::AllReduceAsync, ISend, IRecv, Submit). Wait() blocks until the operation has
// finished and returns its status; until then the caller must neither read nor write the
// buffers the operation uses. Every operation ends (OK, failed or timed out by its
// communicator's timeout), so Wait() returns. Thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_REQUEST_H_
#define TESSERA_COMMON_COLLECTIVE_REQUEST_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera {
namespace collective {

class Request {
 public:
  virtual ~Request() = default;
  // Blocks until the operation has finished; its status. Later calls return the same status.
  virtual absl::Status Wait() = 0;
};

// A request that has already finished with `status`.
std::unique_ptr<Request> CompletedRequest(absl::Status status);

// Completion state shared by a request and the thread that finishes the operation: Complete()
// once, Wait() any number of times from any thread.
class RequestState {
 public:
  void Complete(absl::Status status);
  absl::Status Wait();
  bool done();

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A request finished through a shared RequestState; `then` (optional) runs once in the first
// Wait() after the state completed OK, on the waiting thread, and its status becomes the
// request's (used for post-processing such as unpacking a received buffer).
std::unique_ptr<Request> StateRequest(std::shared_ptr<RequestState> state,
                                      std::function<absl::Status()> then = nullptr);

// Waits for every request (even after a failure) and returns the first error, or OK.
absl::Status WaitAll(std::vector<std::unique_ptr<Request>>& requests);

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_REQUEST_H_
