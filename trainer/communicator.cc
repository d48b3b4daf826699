#include "trainer/communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

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
    Variable in_flight;  // this variable's part of the push in flight, read until its callback
  };
  // One pserver: its variables' queues, and whether a push to it is in flight.
  struct Endpoint {
    std::vector<std::pair<const std::string*, Queue*>> queues;  // in first-push order
    bool sending = false;
  };
  // What Send() needs, taken under the lock.
  struct Next {
    std::string endpoint;
    std::vector<SendItem> items;
  };

  RpcContext* rpc;
  CommunicatorOptions options;
  mutable absl::Mutex mu;
  std::map<std::string, Queue> queues ABSL_GUARDED_BY(mu);        // nodes never move
  std::map<std::string, Endpoint> endpoints ABSL_GUARDED_BY(mu);  // likewise
  int in_flight ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
  CommunicatorStats stats ABSL_GUARDED_BY(mu);

  // The next push to `endpoint`, if none is in flight and gradients wait (and nothing failed):
  // every variable of the endpoint with queued gradients, each with up to max_merge of them
  // merged.
  bool TakeNext(const std::string& endpoint, Next* next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Endpoint& e = endpoints[endpoint];
    if (e.sending || !error.ok()) return false;
    next->endpoint = endpoint;
    next->items.clear();
    for (auto& [name, q] : e.queues) {
      if (q->items.empty()) continue;
      Merge(&q->items, options.max_merge, &q->in_flight);
      next->items.push_back({*name, &q->in_flight});
    }
    if (next->items.empty()) return false;
    e.sending = true;
    ++in_flight;
    return true;
  }

  // Starts `next`. Called without the lock: a client may run the callback inline (which then
  // starts what queued meanwhile: at most queue_capacity nested sends).
  void Send(Next next) ABSL_LOCKS_EXCLUDED(mu) {
    std::shared_ptr<State> self = shared_from_this();
    const int64_t count = static_cast<int64_t>(next.items.size());
    rpc->clients->Get(next.endpoint)
        ->SendBatchAsync(rpc->Meta(), std::move(next.items), /*send_barrier=*/false, nullptr,
                         [self, endpoint = next.endpoint, count](absl::Status s) {
                           self->Sent(endpoint, count, s);
                         });
  }

  void Sent(const std::string& endpoint, int64_t count, absl::Status s) ABSL_LOCKS_EXCLUDED(mu) {
    Next next;
    {
      absl::MutexLock lock(&mu);
      Endpoint& e = endpoints[endpoint];
      e.sending = false;
      for (auto& [name, q] : e.queues) q->in_flight = Variable();
      --in_flight;
      if (s.ok()) {
        stats.sent += count;
      } else if (error.ok()) {
        error = s;
      }
      if (!TakeNext(endpoint, &next)) return;
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
  return PushAll({{name, endpoint, &grad}});
}

absl::Status AsyncCommunicator::PushAll(const std::vector<Gradient>& grads) {
  std::vector<Variable> copies(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (const SelectedRows* sr = grads[i].value->GetIf<SelectedRows>()) {
      SelectedRows* c = copies[i].GetMutable<SelectedRows>();
      c->rows = sr->rows;
      c->height = sr->height;
      c->value.CopyFrom(sr->value);
    } else {
      copies[i].GetMutable<Tensor>()->CopyFrom(grads[i].value->Get<Tensor>());
    }
  }
  State& st = *state_;
  std::vector<State::Next> sends;
  {
    absl::MutexLock lock(&st.mu);
    std::vector<std::string> touched;
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::string& name = grads[i].name;
      auto has_room = [&st, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
        auto it = st.queues.find(name);
        return !st.error.ok() || it == st.queues.end() ||
               static_cast<int>(it->second.items.size()) < st.options.queue_capacity;
      };
      st.mu.Await(absl::Condition(&has_room));
      if (!st.error.ok()) return st.error;
      auto [it, created] = st.queues.try_emplace(name);
      State::Queue& q = it->second;
      if (created) {
        q.endpoint = grads[i].endpoint;
        st.endpoints[q.endpoint].queues.push_back({&it->first, &q});
      } else if (q.endpoint != grads[i].endpoint) {
        return absl::InvalidArgumentError(absl::StrCat("gradient ", name, " pushed to ",
                                                       grads[i].endpoint, " and to ", q.endpoint));
      }
      q.items.push_back(std::move(copies[i]));
      ++st.stats.pushed;
      if (std::find(touched.begin(), touched.end(), q.endpoint) == touched.end()) {
        touched.push_back(q.endpoint);
      }
    }
    for (const std::string& endpoint : touched) {
      State::Next next;
      if (st.TakeNext(endpoint, &next)) sends.push_back(std::move(next));
    }
  }
  for (State::Next& next : sends) st.Send(std::move(next));
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
