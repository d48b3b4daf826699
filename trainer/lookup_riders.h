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
// one of the two. Two rules keep that wait short and finite: only the block's one lookup op
// rides (LocalTrainer sets the attr only when the block has a single one), and nothing before
// Leave or Withdraw waits on a pserver (the look-ahead only feeds the batch and splits its ids
// by pserver). After the send, Release() answers whatever was left and not taken: with the
// step's error if it failed (it never reached the pservers, so they could not answer), else
// by sending it alone, as PrefetchBatchAsync with after_update. Thread-safe.
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
