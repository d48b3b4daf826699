// AsyncCommunicator: the trainer's gradient sender for async mode. The send op hands it a step's
// gradients (copied, so the next step may overwrite its own). A pserver with no push in flight
// gets one at once, from the caller's thread: one SendBatch request with every gradient queued
// for it. Gradients queued for a pserver while a push to it is in flight wait, and when that
// push completes (on the RPC's callback thread) the next push takes every waiting variable,
// with up to `max_merge` gradients of each merged (dense: summed; sparse: rows concatenated, the
// pserver merges duplicate ids). So each pserver has at most one push in flight, each variable's
// gradients arrive in order, a slow network costs merged pushes rather than trainer stalls, and
// no thread of its own sits between the trainer and the network (a hand-off between threads
// costs a wake-up each way). A full queue (per variable) blocks the push (backpressure).
// Flush() waits until everything pushed has been sent. Thread-safe.
#ifndef TESSERA_TRAINER_COMMUNICATOR_H_
#define TESSERA_TRAINER_COMMUNICATOR_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

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
  int64_t sent = 0;    // gradients in pushes that succeeded (what the pservers receive)
};

class AsyncCommunicator {
 public:
  // `rpc` (and its clients) must outlive the communicator.
  AsyncCommunicator(RpcContext* rpc, CommunicatorOptions options);
  ~AsyncCommunicator();  // flushes (errors are dropped: call Flush() to see them)

  struct Gradient {
    std::string name;
    std::string endpoint;  // always the same for one name
    const Variable* value;
  };
  // Queues a copy of every gradient, and starts a push to each pserver that has none in flight.
  // Fails only after a send failed (the error is sticky and names the endpoint), or when a
  // variable names another endpoint than before.
  absl::Status PushAll(const std::vector<Gradient>& grads);
  // PushAll of one gradient.
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
