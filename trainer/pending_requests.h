// PendingRequests: requests in flight that a later point of a step waits for.
#ifndef TESSERA_TRAINER_PENDING_REQUESTS_H_
#define TESSERA_TRAINER_PENDING_REQUESTS_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/client.h"

namespace tessera {

// Requests in flight that something later must wait for (a step's early sends, its deferred
// lookups). Thread-safe; a callback from Add may run after the object is gone.
class PendingRequests {
 public:
  // `what` leads the message of an error Wait returns.
  explicit PendingRequests(std::string what) : what_(std::move(what)) {}
  // One more in flight; the returned callback takes its result.
  DoneCallback Add();
  // Waits until none is in flight; returns the first error since the last Wait (and forgets it).
  absl::Status Wait();

 private:
  struct State {
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 0;
    absl::Status error ABSL_GUARDED_BY(mu);
  };
  const std::string what_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_PENDING_REQUESTS_H_
