#include "common/rpc/rpc.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

std::vector<DoneCallback> JoinThen(int n, std::function<void()> then, DoneCallback done) {
  if (n == 0) {
    then();
    return {};
  }
  struct State {
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu);
    absl::Status first ABSL_GUARDED_BY(mu);
    std::function<void()> then;
    DoneCallback done;
  };
  auto state = std::make_shared<State>();
  state->pending = n;
  state->then = std::move(then);
  state->done = std::move(done);
  std::vector<DoneCallback> callbacks;
  for (int i = 0; i < n; ++i) {
    callbacks.push_back([state](absl::Status s) {
      absl::Status first;
      {
        absl::MutexLock lock(&state->mu);
        if (!s.ok() && state->first.ok()) state->first = std::move(s);
        if (--state->pending > 0) return;
        first = state->first;
      }
      if (first.ok()) {
        state->then();
      } else {
        state->done(std::move(first));
      }
    });
  }
  return callbacks;
}

}  // namespace tessera
