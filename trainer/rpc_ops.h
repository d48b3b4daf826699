// The trainer's RPC ops, registered into the trainer's OpRegistry with the state they share.
// Each op makes one request per pserver (PServerClient's batched calls), all pservers in flight
// together:
//   send          X (list) with attr epmap (one endpoint per X): pushes every variable to its
//                 pserver and waits for all (with sync_mode=false and a communicator: queues them
//                 for the background sender and returns). Attr barrier_endpoints (sync): those
//                 pservers' requests carry the send barrier, answered when it is released.
//                 Attr early (sync; LocalTrainer's send_early_bytes puts such a send in the
//                 middle of backward): the gradients go out and the op returns at once; the
//                 step's send (the one with the barrier) first waits until they were received,
//                 so its barrier never overtakes them, and fails with their error.
//   recv          Out (list) with attr epmap: pulls every variable from its pserver. Attr
//                 fetch_barrier_endpoints (sync): those requests carry the fetch barrier. Attr
//                 takes_lookups (async): the requests carry the next batch's lookups (attr
//                 ride_on_step below).
//   prefetch      the rows of every distributed table's ids, one request per pserver.
//   Attr after_update (recv, prefetch; sync): each pserver answers once it applied the update
//                 of the trainer's current step, so the op can run beside that step's send
//                 (LocalTrainer's prefetch_ahead sets it on the step's receives and on the next
//                 batch's lookups).
//   Attr ride_on_step (prefetch): the lookups ride on the step's request to each pserver where
//                 RpcContext::lookup_riders expects them (sync: a send with its receive folded
//                 in takes them; async: a recv with attr takes_lookups, after the step's push;
//                 one request per pserver either way; trainer/lookup_riders.h).
//   send_barrier  attr endpoints: the send barrier alone (programs transpiled before the
//                 barriers rode on send and recv).
//   fetch_barrier attr endpoints: the fetch barrier alone (likewise).
// Errors name the endpoint and the variable; nothing waits longer than the client's deadline.
#ifndef TESSERA_TRAINER_RPC_OPS_H_
#define TESSERA_TRAINER_RPC_OPS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/framework/op_registry.h"
#include "common/rpc/client.h"
#include "trainer/evaluation.h"
#include "trainer/lookup_riders.h"
#include "trainer/pending_requests.h"

namespace tessera {

// One client per pserver endpoint, created on first use by `factory`. Thread-safe.
class ClientPool {
 public:
  using Factory = std::function<std::unique_ptr<PServerClient>(const std::string& endpoint)>;
  explicit ClientPool(Factory factory) : factory_(std::move(factory)) {}
  PServerClient* Get(const std::string& endpoint);

 private:
  Factory factory_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<PServerClient>> clients_ ABSL_GUARDED_BY(mu_);
};

// Shared by the RPC op kernels of one trainer. `step` is the trainer's current step; the
// training loop advances it after each step.
class AsyncCommunicator;

struct RpcContext {
  std::string job_id;
  int trainer_id = 0;
  std::atomic<int64_t> step{0};
  ClientPool* clients = nullptr;
  // Async mode: `send` ops with sync_mode=false queue their gradients here (nullptr: they send
  // and wait like sync sends).
  AsyncCommunicator* communicator = nullptr;
  // Async: `recv` first waits until this trainer's queued gradients are applied, so a trainer
  // never computes on parameters that miss its own last update (much better convergence with
  // momentum; the communicator then rarely merges). false: fully asynchronous (Fluid-like).
  bool read_own_writes = true;
  // Async gradients pushed with their step's receive folded in (not through the communicator)
  // whose requests succeeded.
  std::atomic<int64_t> folded_pushes{0};

  // Sync mode with streamed data: set before a step when this trainer has no batch after it
  // (sent with its send barrier); the pservers' answer lands in step_reply (the training loop
  // clears it before each step).
  std::atomic<bool> last_batch{false};
  StepReply step_reply;
  // Sync pipelined steps: where the next batch's lookups meet the step's send
  // (LocalTrainerOptions::lookup_riders).
  LookupRiders lookup_riders;
  // Sync: the step's early sends (attr early), which its barrier-carrying send waits for.
  PendingRequests early_sends{"early send"};
  // Pipelined steps: the next batch's lookups of a prefetch op with attr complete_later, whose
  // rows are stored into its outputs by the thread that receives the last reply; the step
  // waits for them here before it ends.
  PendingRequests deferred_lookups{"lookups"};

  RequestMeta Meta() const {
    return RequestMeta{job_id, trainer_id, step.load(), last_batch.load()};
  }
};

// Registers prefetch, send, recv, send_barrier, fetch_barrier. `context` must outlive the registry.
absl::Status RegisterRpcOps(OpRegistry* registry, RpcContext* context);

// Distributed evaluation through the pservers: sends this trainer's `partial` of evaluation
// round `round` to `pserver` (the job's first; pserver/eval_reducer.h sums them). With `fetch`
// (trainer 0) it then waits for every trainer's partial and returns their sum; otherwise it
// returns `partial`. Errors name the pserver.
absl::StatusOr<EvalPartial> ReduceEvaluation(RpcContext* rpc, const std::string& pserver,
                                             int64_t round, const EvalPartial& partial,
                                             bool fetch);

// Sends COMPLETE to every endpoint (end of training); returns the first error.
absl::Status NotifyComplete(RpcContext* context, const std::vector<std::string>& endpoints);

}  // namespace tessera

#endif  // TESSERA_TRAINER_RPC_OPS_H_
