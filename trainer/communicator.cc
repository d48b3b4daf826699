#include "trainer/communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {

AsyncCommunicator::AsyncCommunicator(RpcContext* rpc, CommunicatorOptions options)
    : rpc_(rpc), options_(options) {
  options_.max_merge = std::max(1, options_.max_merge);
  options_.queue_capacity = std::max(1, options_.queue_capacity);
  sender_ = std::thread([this] { SenderLoop(); });
}

AsyncCommunicator::~AsyncCommunicator() {
  Flush().IgnoreError();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sender_.join();
}

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
  absl::MutexLock lock(&mu_);
  auto has_room = [this, &name]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = queues_.find(name);
    return !error_.ok() || it == queues_.end() ||
           static_cast<int>(it->second.items.size()) < options_.queue_capacity;
  };
  mu_.Await(absl::Condition(&has_room));
  if (!error_.ok()) return error_;
  Queue& q = queues_[name];
  q.endpoint = endpoint;
  q.items.push_back(std::move(copy));
  ++stats_.pushed;
  return absl::OkStatus();
}

absl::Status AsyncCommunicator::Merge(std::deque<Variable>* items, int max_merge, Variable* out) {
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
      std::memcpy(static_cast<char*>(merged.raw_data()) + acc->value.nbytes(),
                  add.value.raw_data(), add.value.nbytes());
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
  return absl::OkStatus();
}

void AsyncCommunicator::SenderLoop() {
  while (true) {
    std::vector<std::pair<std::string, std::string>> targets;  // name, endpoint
    std::vector<Variable> batch;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        for (const auto& kv : queues_) {
          if (!kv.second.items.empty()) return true;
        }
        return false;
      };
      mu_.Await(absl::Condition(&work));
      bool any = false;
      for (auto& [name, q] : queues_) {
        if (q.items.empty()) continue;
        any = true;
        Variable merged;
        Merge(&q.items, options_.max_merge, &merged).IgnoreError();
        targets.emplace_back(name, q.endpoint);
        batch.push_back(std::move(merged));
      }
      if (!any && stopping_) return;
      in_flight_ += static_cast<int>(batch.size());
    }
    StatusGroup group(static_cast<int>(batch.size()));
    RequestMeta meta = rpc_->Meta();
    for (size_t i = 0; i < batch.size(); ++i) {
      rpc_->clients->Get(targets[i].second)
          ->SendVariableAsync(meta, targets[i].first, &batch[i], group.Callback());
    }
    absl::Status s = group.Wait();
    absl::MutexLock lock(&mu_);
    in_flight_ -= static_cast<int>(batch.size());
    if (s.ok()) {
      stats_.sent += static_cast<int64_t>(batch.size());
    } else if (error_.ok()) {
      error_ = s;
    }
  }
}

absl::Status AsyncCommunicator::Flush() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!error_.ok()) return true;
    if (in_flight_ > 0) return false;
    for (const auto& kv : queues_) {
      if (!kv.second.items.empty()) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&drained));
  return error_;
}

CommunicatorStats AsyncCommunicator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tessera
