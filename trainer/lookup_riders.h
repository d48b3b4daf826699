// LookupRiders: the next batch's table lookups riding on a sync step's send.
//
// With LocalTrainer's pipelined prefetch_ahead, the next batch is fed and its lookups go out
// while the step computes; both the lookups and the step's send are answered by each pserver
// once it applied the step. Here they meet, so that the step's one request per pserver
// (PServerClient::SendGetBatchAsync: gradients, send barrier, receive, fetch barrier) also
// carries those lookups: one request per pserver and step in all, not two.
//
// Per step: LocalTrainer calls Expect() before the look-ahead starts. The look-ahead's prefetch
// op (attr ride_on_send) either leaves its requests here (Leave) or says they will not come
// (Withdraw), before it waits for anything. The step's send takes them (Take), which waits for
// one of the two (the look-ahead only feeds the batch and splits its ids before). After the
// send, Release() sends whatever was left and not taken by itself, as PrefetchBatchAsync with
// after_update. Thread-safe.
#ifndef TESSERA_TRAINER_LOOKUP_RIDERS_H_
#define TESSERA_TRAINER_LOOKUP_RIDERS_H_

#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/rpc/client.h"

namespace tessera {

class LookupRiders {
 public:
  // One pserver's lookups: PServerClient::PrefetchBatchAsync(meta, items, after_update = true,
  // done) of `client`.
  struct Ride {
    PServerClient* client = nullptr;
    RequestMeta meta;
    std::vector<PrefetchItem> items;
    DoneCallback done;
  };

  // The next step's send waits for the look-ahead's lookups (Leave or Withdraw).
  void Expect();
  // Hands over `rides` when lookups are expected (true: the send, or Release, will run each
  // ride's `done`); false (rides untouched) otherwise: the caller sends them itself.
  bool Leave(std::vector<Ride> rides);
  // The expected lookups will not come (no-op unless expected).
  void Withdraw();
  // The send: waits while lookups are expected, then takes what was left (perhaps nothing).
  std::vector<Ride> Take();
  // After the send: lookups left and not taken go out by themselves; nothing is expected.
  void Release();

 private:
  enum class State { kIdle, kExpected, kLeft };
  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  std::vector<Ride> rides_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_LOOKUP_RIDERS_H_
