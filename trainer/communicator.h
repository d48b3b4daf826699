// AsyncCommunicator: the trainer's gradient sender for async mode. The send op hands it each
// gradient (copied, so the next step may overwrite its own). A variable with no push in flight
// is pushed at once, from the caller's thread; gradients of a variable pushed while one is in
// flight queue, and when that push completes (on the RPC's callback thread) up to `max_merge`
// of them are merged (dense: summed; sparse: rows concatenated, the pserver merges duplicate
// ids) into the next push. So each variable has at most one push in flight and its pushes
// arrive in order, a slow network costs merged pushes rather than trainer stalls, and no
// thread of its own sits between the trainer and the network (a hand-off between threads costs
// a wake-up each way). A full queue blocks Push (backpressure). Flush() waits until everything
// pushed has been sent. Thread-safe.
#ifndef TESSERA_TRAINER_COMMUNICATOR_H_
#define TESSERA_TRAINER_COMMUNICATOR_H_

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "trainer/rpc_ops.h"

namespace tessera {

struct CommunicatorOptions {
  int max_merge = 4;  // gradients merged into one push (>= 1)
  // Per variable; Push blocks beyond it. Small keeps gradients fresh: a trainer computes on
  // parameters at most ~queue_capacity pushes old.
  int queue_capacity = 4;
};

struct CommunicatorStats {
  int64_t pushed = 0;  // gradients handed to Push
  int64_t sent = 0;    // SendVariable calls that succeeded (what the pservers receive)
};

class AsyncCommunicator {
 public:
  // `rpc` (and its clients) must outlive the communicator.
  AsyncCommunicator(RpcContext* rpc, CommunicatorOptions options);
  ~AsyncCommunicator();  // flushes (errors are dropped: call Flush() to see them)

  // Queues a copy of `grad` for `name` on `endpoint`, and sends it now if no push of `name` is
  // in flight. Fails only after a send failed (the error is sticky and names the endpoint).
  absl::Status Push(const std::string& name, const std::string& endpoint, const Variable& grad);
  // Waits until every queued gradient has been sent; returns the first send error.
  absl::Status Flush();
  CommunicatorStats stats() const;

 private:
  // Shared with the callbacks of pushes in flight, which may run (briefly) after the
  // communicator is gone.
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_COMMUNICATOR_H_
