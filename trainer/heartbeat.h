// Heartbeat: tells every pserver, every `interval`, that this trainer is alive (a HEARTBEAT
// barrier), on a thread of its own, so that a pserver can tell a trainer that is slow (it keeps
// beating) from one that died, froze or lost its network (it stops): see
// ParameterServerOptions::heartbeat_timeout. At most one heartbeat is in flight per pserver; a
// failed one is not retried (the next comes after `interval`), and the trainer's own calls
// report a failed job.
#ifndef TESSERA_TRAINER_HEARTBEAT_H_
#define TESSERA_TRAINER_HEARTBEAT_H_

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/client.h"

namespace tessera {

class Heartbeat {
 public:
  // Starts beating at once. The clients must outlive this object.
  Heartbeat(std::vector<PServerClient*> pservers, RequestMeta meta, absl::Duration interval);
  // Stops, then waits for the heartbeats in flight (each bounded by its client's deadline).
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Heartbeats the pservers answered, all together (for tests).
  int64_t answered() const;

 private:
  void Run();

  const std::vector<PServerClient*> pservers_;
  const RequestMeta meta_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> in_flight_ ABSL_GUARDED_BY(mu_);
  int64_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_HEARTBEAT_H_
