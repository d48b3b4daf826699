#include "common/collective/communicator.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace collective {
namespace {

void LocalCopy(const void* send, void* recv, size_t bytes) {
  if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
}

// Errors after which ranks may disagree on what was exchanged.
bool BreaksCommunicator(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDataLoss:
      return true;
    default:
      return false;
  }
}

// Wraps a point-to-point request so that its failure breaks the communicator.
class BreakingRequest : public Request {
 public:
  BreakingRequest(std::unique_ptr<Request> inner, std::function<void(const absl::Status&)> on_error)
      : inner_(std::move(inner)), on_error_(std::move(on_error)) {}
  absl::Status Wait() override {
    absl::Status s = inner_->Wait();
    if (!s.ok()) on_error_(s);
    return s;
  }

 private:
  std::unique_ptr<Request> inner_;
  std::function<void(const absl::Status&)> on_error_;
};

}  // namespace

std::string OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "unknown";
}

int64_t CommStats::bytes_sent() const {
  int64_t total = 0;
  for (const OpCounters& c : ops) total += c.bytes;
  return total;
}

std::string CommStats::DebugString() const {
  std::vector<std::string> parts;
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (ops[k].calls == 0) continue;
    parts.push_back(absl::StrCat(OpKindName(static_cast<OpKind>(k)), ": ", ops[k].calls, " calls, ",
                                 ops[k].bytes, " bytes"));
  }
  return parts.empty() ? "no operations" : absl::StrJoin(parts, "; ");
}

Communicator::Communicator(int rank, int size) : rank_(rank), size_(size) {}

Communicator::~Communicator() { executor_.Stop(); }

std::string Communicator::DebugName() const {
  return absl::StrCat(BackendName(backend()), " rank ", rank_, "/", size_, " [group '", group_name_,
                      "']");
}

absl::Status Communicator::SizeMismatch(const char* op, size_t got, size_t want) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": buffer holds ", got, " elements, expected ", want));
}

absl::Status Communicator::CheckBuffers(const char* op, const void* a, const void* b,
                                        size_t count) const {
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " on ", DebugName(), ": null buffer for ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckRank(const char* op, const char* what, int r) const {
  if (r < 0 || r >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(op, " on ", DebugName(), ": ", what, " ", r,
                                                   " is not a rank in [0, ", size_, ")"));
  }
  return absl::OkStatus();
}

void Communicator::Count(OpKind kind, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  OpCounters& c = stats_.ops[static_cast<int>(kind)];
  ++c.calls;
  c.bytes += bytes;
}

absl::Status Communicator::Broken() const {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(DebugName(),
                                                    " is unusable after an earlier error (",
                                                    broken_.message(), "); create a new context"));
}

void Communicator::MaybeBreak(const absl::Status& status) {
  if (!BreaksCommunicator(status)) return;
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = status;
}

absl::Status Communicator::health() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

CommStats Communicator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Communicator::ResetStats() {
  absl::MutexLock lock(&mu_);
  stats_ = CommStats();
}

absl::Status Communicator::RunOp(OpKind kind, int64_t bytes, std::function<absl::Status()> op) {
  Count(kind, bytes);
  return executor_.Run([this, op = std::move(op)]() -> absl::Status {
    absl::Status broken = Broken();
    if (!broken.ok()) return broken;
    absl::Status s = op();
    MaybeBreak(s);
    return s;
  });
}

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, ElementType type,
                                     ReduceOp op) {
  if (send == nullptr) send = recv;
  absl::Status check = CheckBuffers("all_reduce", send, recv, count);
  if (!check.ok()) return check;
  const size_t bytes = count * ElementSize(type);
  return RunOp(OpKind::kAllReduce, bytes, [=]() -> absl::Status {
    if (count == 0) return absl::OkStatus();
    if (size_ == 1) {
      LocalCopy(send, recv, bytes);
      return absl::OkStatus();
    }
    return DoAllReduce(send, recv, count, type, op);
  });
}

std::unique_ptr<Request> Communicator::AllReduceAsync(const void* send, void* recv, size_t count,
                                                      ElementType type, ReduceOp op) {
  if (send == nullptr) send = recv;
  absl::Status check = CheckBuffers("all_reduce", send, recv, count);
  if (!check.ok()) return CompletedRequest(check);
  return Submit([=]() { return AllReduce(send, recv, count, type, op); });
}

absl::Status Communicator::Broadcast(void* buf, size_t count, ElementType type, int root) {
  absl::Status check = CheckBuffers("broadcast", buf, buf, count);
  if (check.ok()) check = CheckRank("broadcast", "root", root);
  if (!check.ok()) return check;
  const size_t bytes = count * ElementSize(type);
  return RunOp(OpKind::kBroadcast, rank_ == root ? bytes : 0, [=]() -> absl::Status {
    if (count == 0 || size_ == 1) return absl::OkStatus();
    return DoBroadcast(buf, count, type, root);
  });
}

absl::Status Communicator::AllGather(const void* send, void* recv, size_t count, ElementType type) {
  absl::Status check = CheckBuffers("all_gather", send, recv, count);
  if (!check.ok()) return check;
  const size_t bytes = count * ElementSize(type);
  return RunOp(OpKind::kAllGather, bytes, [=]() -> absl::Status {
    if (count == 0) return absl::OkStatus();
    if (size_ == 1) {
      LocalCopy(send, recv, bytes);
      return absl::OkStatus();
    }
    return DoAllGather(send, recv, count, type);
  });
}

absl::Status Communicator::ReduceScatter(const void* send, void* recv, size_t recv_count,
                                         ElementType type, ReduceOp op) {
  absl::Status check = CheckBuffers("reduce_scatter", send, recv, recv_count);
  if (!check.ok()) return check;
  const size_t bytes = recv_count * ElementSize(type);
  return RunOp(OpKind::kReduceScatter, bytes * size_, [=]() -> absl::Status {
    if (recv_count == 0) return absl::OkStatus();
    if (size_ == 1) {
      LocalCopy(send, recv, bytes);
      return absl::OkStatus();
    }
    return DoReduceScatter(send, recv, recv_count, type, op);
  });
}

absl::Status Communicator::Barrier() {
  return RunOp(OpKind::kBarrier, 0, [this]() -> absl::Status {
    if (size_ == 1) return absl::OkStatus();
    return DoBarrier();
  });
}

std::unique_ptr<Request> Communicator::ISend(const void* buf, size_t count, ElementType type,
                                             int peer, uint32_t tag) {
  absl::Status check = CheckBuffers("send", buf, buf, count);
  if (check.ok()) check = CheckRank("send", "peer", peer);
  if (check.ok() && peer == rank_) {
    check = absl::InvalidArgumentError(
        absl::StrCat("send on ", DebugName(), ": cannot send to itself (peer ", peer, ")"));
  }
  if (check.ok()) check = Broken();
  if (!check.ok()) return CompletedRequest(check);
  const size_t bytes = count * ElementSize(type);
  Count(OpKind::kSend, bytes);
  if (bytes == 0) return CompletedRequest(absl::OkStatus());
  return std::make_unique<BreakingRequest>(DoISend(buf, bytes, peer, tag),
                                           [this](const absl::Status& s) { MaybeBreak(s); });
}

std::unique_ptr<Request> Communicator::IRecv(void* buf, size_t count, ElementType type, int peer,
                                             uint32_t tag) {
  absl::Status check = CheckBuffers("recv", buf, buf, count);
  if (check.ok()) check = CheckRank("recv", "peer", peer);
  if (check.ok() && peer == rank_) {
    check = absl::InvalidArgumentError(
        absl::StrCat("recv on ", DebugName(), ": cannot receive from itself (peer ", peer, ")"));
  }
  if (check.ok()) check = Broken();
  if (!check.ok()) return CompletedRequest(check);
  const size_t bytes = count * ElementSize(type);
  Count(OpKind::kRecv, 0);
  if (bytes == 0) return CompletedRequest(absl::OkStatus());
  return std::make_unique<BreakingRequest>(DoIRecv(buf, bytes, peer, tag),
                                           [this](const absl::Status& s) { MaybeBreak(s); });
}

absl::Status Communicator::Send(const void* buf, size_t count, ElementType type, int peer,
                                uint32_t tag) {
  return ISend(buf, count, type, peer, tag)->Wait();
}

absl::Status Communicator::Recv(void* buf, size_t count, ElementType type, int peer, uint32_t tag) {
  return IRecv(buf, count, type, peer, tag)->Wait();
}

std::unique_ptr<Request> Communicator::Submit(std::function<absl::Status()> job) {
  return executor_.Submit(std::move(job));
}

absl::Status Communicator::RunInOrder(std::function<absl::Status()> job) {
  return executor_.Run(std::move(job));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::NewGroup(
    const std::vector<int>& ranks) {
  if (ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("new_group on ", DebugName(), ": no ranks"));
  }
  std::set<int> seen;
  for (int r : ranks) {
    absl::Status check = CheckRank("new_group", "member", r);
    if (!check.ok()) return check;
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("new_group on ", DebugName(), ": rank ", r, " listed twice"));
    }
  }
  if (seen.count(rank_) == 0) return std::unique_ptr<Communicator>();
  absl::Status broken = Broken();
  if (!broken.ok()) return broken;
  int index = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(groups_created_.begin(), groups_created_.end(),
                           [&](const auto& g) { return g.first == ranks; });
    if (it == groups_created_.end()) {
      groups_created_.emplace_back(ranks, 1);
    } else {
      index = it->second++;
    }
  }
  const std::string members = absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
  const std::string key = absl::StrCat(group_name_, "/", members, "#", index);
  auto group = DoNewGroup(ranks, key);
  if (!group.ok()) return group.status();
  (*group)->set_group_name(
      absl::StrCat(group_name_, "/", members, index > 0 ? absl::StrCat("#", index) : ""));
  return group;
}

}  // namespace collective
}  // namespace tessera
