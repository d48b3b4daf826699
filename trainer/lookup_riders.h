// LookupRiders: the next batch's table lookups riding on a step's request to each pserver.
//
// With LocalTrainer's pipelined prefetch_ahead, the next batch is fed and its lookups prepared
// while the step computes. Here they meet the step's request to each pserver, so that it also
// carries those lookups: one request per pserver and step in all, not two.
//   Sync: the step's send (PServerClient::SendGetBatchAsync: gradients, send barrier, receive,
//   fetch barrier) takes them; both are answered once the pserver applied the step.
//   Async: the step's receive takes them (PServerClient::GetPrefetchBatchAsync), after the
//   step's push was handed to the communicator; both are answered at once.
//
// Per step: LocalTrainer calls Expect() before the look-ahead starts. The look-ahead's prefetch
// op (attr ride_on_step) either leaves its requests here (Leave) or says they will not come
// (Withdraw), before it waits for anything. The step's send (sync) or receive (async) takes them
// (Take), which waits for one of the two. Two rules keep that wait short and finite: only the
// block's one lookup op rides (LocalTrainer sets the attr only when the block has a single
// one), and nothing before Leave or Withdraw waits on a pserver (the look-ahead only feeds the
// batch and splits its ids by pserver). After the step's requests, Release() answers whatever
// was left and not taken: with the step's error if it failed (it never reached the pservers, so
// they could not answer), else by sending it alone, as PrefetchBatchAsync (after_update in sync
// mode). Thread-safe.
#ifndef TESSERA_TRAINER_LOOKUP_RIDERS_H_
#define TESSERA_TRAINER_LOOKUP_RIDERS_H_

#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/rpc/client.h"

namespace tessera {

class LookupRiders {
 public:
  // One pserver's lookups: PServerClient::PrefetchBatchAsync(meta, items, after_update, done) of
  // `client`.
  struct Ride {
    PServerClient* client = nullptr;
    RequestMeta meta;
    std::vector<PrefetchItem> items;
    DoneCallback done;
    bool after_update = true;  // sync: answered once the pserver applied meta.step
    // Sends it by itself (that PrefetchBatchAsync), not riding on anything.
    void SendAlone();
  };

  // The next step's send waits for the look-ahead's lookups (Leave or Withdraw). Lookups still
  // left (Release not called) are answered with an error.
  void Expect();
  // Takes over `rides` when lookups are expected (true: the send, or Release, will run each
  // ride's `done`); false otherwise, `rides` discarded: the caller sends its requests itself.
  bool Leave(std::vector<Ride> rides);
  // The expected lookups will not come (no-op unless expected).
  void Withdraw();
  // The send: waits while lookups are expected, then takes what was left (perhaps nothing).
  std::vector<Ride> Take();
  // After the send: lookups left and not taken get `step`'s error, or (step OK) go out by
  // themselves; nothing is expected any more.
  void Release(const absl::Status& step);

 private:
  enum class State { kIdle, kExpected, kLeft };
  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  std::vector<Ride> rides_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_LOOKUP_RIDERS_H_
