#include "trainer/communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {

// Moves up to `max_merge` gradients from the front of `items` into `out`.
void Merge(std::deque<Variable>* items, int max_merge, Variable* out) {
  *out = std::move(items->front());
  items->pop_front();
  for (int n = 1; n < max_merge && !items->empty(); ++n) {
    Variable next = std::move(items->front());
    items->pop_front();
    if (SelectedRows* acc = out->GetIf<SelectedRows>()) {
      const SelectedRows& add = next.Get<SelectedRows>();
      Tensor merged;
      Shape shape = acc->value.shape();
      shape[0] += add.value.dim(0);
      merged.Resize(acc->value.dtype(), shape);
      std::memcpy(merged.raw_data(), acc->value.raw_data(), acc->value.nbytes());
      std::memcpy(static_cast<char*>(merged.raw_data()) + acc->value.nbytes(), add.value.raw_data(),
                  add.value.nbytes());
      acc->value = merged;
      acc->rows.insert(acc->rows.end(), add.rows.begin(), add.rows.end());
    } else {
      Tensor* sum = out->GetMutable<Tensor>();
      const Tensor& add = next.Get<Tensor>();
      if (sum->dtype() == FLOAT64) {
        sum->flat<double>() += add.flat<double>();
      } else {
        sum->flat<float>() += add.flat<float>();
      }
    }
  }
}

}  // namespace

struct AsyncCommunicator::State : std::enable_shared_from_this<State> {
  struct Queue {
    std::string endpoint;
    std::deque<Variable> items;
    bool sending = false;
    Variable in_flight;  // the push in flight, read by the client until its callback
  };
  // What Send() needs, taken under the lock.
  struct Next {
    const std::string* name = nullptr;
    Queue* queue = nullptr;
    std::string endpoint;
  };

  RpcContext* rpc;
  CommunicatorOptions options;
  mutable absl::Mutex mu;
  std::map<std::string, Queue> queues ABSL_GUARDED_BY(mu);  // nodes never move
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
  CommunicatorStats stats ABSL_GUARDED_BY(mu);

  // The next push of queue `it`, if none is in flight and gradients wait (and nothing failed).
  bool TakeNext(std::map<std::string, Queue>::iterator it, Next* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Queue& q = it->second;
    if (q.sending || q.items.empty() || !error.ok()) return false;
    Merge(&q.items, options.max_merge, &q.in_flight);
    q.sending = true;
    ++in_flight;
    *next = Next{&it->first, &q, q.endpoint};
    return true;
  }

  // Starts `next`. Called without the lock: a client may run the callback inline (which then
  // starts what queued meanwhile: at most queue_capacity nested sends).
  void Send(Next next) ABSL_LOCKS_EXCLUDED(mu) {
    std::shared_ptr<State> self = shared_from_this();
    rpc->clients->Get(next.endpoint)
        ->SendVariableAsync(rpc->Meta(), *next.name, &next.queue->in_flight,
                            [self, name = next.name](absl::Status s) { self->Sent(name, s); });
  }

  void Sent(const std::string* name, absl::Status s) ABSL_LOCKS_EXCLUDED(mu) {
    Next next;
    {
      absl::MutexLock lock(&mu);
      auto it = queues.find(*name);
      it->second.sending = false;
      it->second.in_flight = Variable();
      --in_flight;
      if (s.ok()) {
        ++stats.sent;
      } else if (error.ok()) {
        error = s;
      }
      if (!TakeNext(it, &next)) return;
    }
    Send(std::move(next));
  }
};

AsyncCommunicator::AsyncCommunicator(RpcContext* rpc, CommunicatorOptions options)
    : state_(std::make_shared<State>()) {
  state_->rpc = rpc;
  state_->options = options;
  state_->options.max_merge = std::max(1, options.max_merge);
  state_->options.queue_capacity = std::max(1, options.queue_capacity);
}

AsyncCommunicator::~AsyncCommunicator() { Flush().IgnoreError(); }

absl::Status AsyncCommunicator::Push(const std::string& name, const std::string& endpoint,
                                     const Variable& grad) {
  Variable copy;
  if (const SelectedRows* sr = grad.GetIf<SelectedRows>()) {
    SelectedRows* c = copy.GetMutable<SelectedRows>();
    c->rows = sr->rows;
    c->height = sr->height;
    c->value.CopyFrom(sr->value);
  } else {
    copy.GetMutable<Tensor>()->CopyFrom(grad.Get<Tensor>());
  }
  State& st = *state_;
  State::Next next;
  {
    absl::MutexLock lock(&st.mu);
    auto has_room = [&st, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
      auto it = st.queues.find(name);
      return !st.error.ok() || it == st.queues.end() ||
             static_cast<int>(it->second.items.size()) < st.options.queue_capacity;
    };
    st.mu.Await(absl::Condition(&has_room));
    if (!st.error.ok()) return st.error;
    auto it = st.queues.try_emplace(name).first;
    it->second.endpoint = endpoint;
    it->second.items.push_back(std::move(copy));
    ++st.stats.pushed;
    if (!st.TakeNext(it, &next)) return absl::OkStatus();
  }
  st.Send(std::move(next));
  return absl::OkStatus();
}

absl::Status AsyncCommunicator::Flush() {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  auto drained = [&st]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (st.in_flight > 0) return false;
    if (!st.error.ok()) return true;
    for (const auto& kv : st.queues) {
      if (!kv.second.items.empty()) return false;
    }
    return true;
  };
  st.mu.Await(absl::Condition(&drained));
  return st.error;
}

CommunicatorStats AsyncCommunicator::stats() const {
  absl::MutexLock lock(&state_->mu);
  return state_->stats;
}

}  // namespace tessera
