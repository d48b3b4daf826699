// AsyncCommunicator: the trainer's background sender for async mode. The send op hands it each
// gradient (copied, so the next step may overwrite its own); a sender thread merges up to
// `max_merge` queued gradients of the same variable (dense: summed; sparse: rows concatenated,
// the pserver merges duplicate ids) and pushes them, so a slow network costs merged pushes
// rather than trainer stalls. A full queue blocks Push (backpressure). Flush() waits until
// everything queued has been sent. Thread-safe.
#ifndef TESSERA_TRAINER_COMMUNICATOR_H_
#define TESSERA_TRAINER_COMMUNICATOR_H_

#include <deque>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "trainer/rpc_ops.h"

namespace tessera {

struct CommunicatorOptions {
  int max_merge = 4;        // gradients merged into one push (>= 1)
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
  AsyncCommunicator(RpcContext* rpc, CommunicatorOptions options);
  ~AsyncCommunicator();  // flushes, then stops the sender

  // Queues a copy of `grad` for `name` on `endpoint`. Fails only after a send failed (the
  // error is sticky and names the endpoint).
  absl::Status Push(const std::string& name, const std::string& endpoint, const Variable& grad);
  // Waits until every queued gradient has been sent; returns the first send error.
  absl::Status Flush();
  CommunicatorStats stats() const;

 private:
  struct Queue {
    std::string endpoint;
    std::deque<Variable> items;
  };
  void SenderLoop();
  static absl::Status Merge(std::deque<Variable>* items, int max_merge, Variable* out);

  RpcContext* rpc_;
  CommunicatorOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  CommunicatorStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread sender_;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_COMMUNICATOR_H_
