#include "common/collective/gloo/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/collective/half.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace tessera {
namespace collective {
namespace {

// Slot prefixes for the operations written here (Gloo's own collectives use 0x01-0x08).
constexpr uint8_t kSendRecvSlotPrefix = 0x10;
constexpr uint8_t kReduceScatterSlotPrefix = 0x11;

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// A Gloo exception as a Status: timeouts become DeadlineExceeded, transport failures
// Unavailable, anything else (a violated Gloo precondition) Internal.
absl::Status FromException(const std::string& what_op, const std::exception& e) {
  const std::string msg = e.what();
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    if (absl::StrContains(msg, "imed out") || absl::StrContains(msg, "imeout")) {
      return absl::DeadlineExceededError(absl::StrCat(what_op, " timed out: ", msg));
    }
    return absl::UnavailableError(absl::StrCat(what_op, " failed (peer lost?): ", msg));
  }
  return absl::InternalError(absl::StrCat(what_op, " failed: ", msg));
}

// Runs `fn`, turning Gloo's exceptions into a Status.
template <typename Fn>
absl::Status Guard(const std::string& what_op, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return FromException(what_op, e);
  }
  return absl::OkStatus();
}

// Our Store seen as a Gloo store (Gloo's rendezvous reports failures by exceptions).
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<collective::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->Get(key, timeout_);
    if (!value.ok()) throw gloo::IoException(std::string(value.status().message()));
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, Millis(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    absl::Status s = store_->Wait(keys, absl::Milliseconds(timeout.count()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }

 private:
  std::shared_ptr<collective::Store> store_;
  absl::Duration timeout_;
};

// ---- element-wise kernels (c may alias a) ----

template <typename T>
void SumFn(void* c, const void* a, const void* b, size_t n) {
  T* z = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
}
template <typename T>
void MaxFn(void* c, const void* a, const void* b, size_t n) {
  T* z = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) z[i] = x[i] > y[i] ? x[i] : y[i];
}
template <typename T>
void MinFn(void* c, const void* a, const void* b, size_t n) {
  T* z = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) z[i] = x[i] < y[i] ? x[i] : y[i];
}
void HalfSumFn(void* c, const void* a, const void* b, size_t n) {
  HalfSum(static_cast<uint16_t*>(c), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n);
}
void HalfMaxFn(void* c, const void* a, const void* b, size_t n) {
  HalfMax(static_cast<uint16_t*>(c), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n);
}
void HalfMinFn(void* c, const void* a, const void* b, size_t n) {
  HalfMin(static_cast<uint16_t*>(c), static_cast<const uint16_t*>(a),
          static_cast<const uint16_t*>(b), n);
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn TypedReduceFn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return &SumFn<T>;
    case ReduceOp::kMax:
      return &MaxFn<T>;
    case ReduceOp::kMin:
      return &MinFn<T>;
  }
  return &SumFn<T>;
}

ReduceFn GetReduceFn(ElementType type, ReduceOp op) {
  switch (type) {
    case ElementType::kFloat16:
      return op == ReduceOp::kMax ? &HalfMaxFn : op == ReduceOp::kMin ? &HalfMinFn : &HalfSumFn;
    case ElementType::kFloat32:
      return TypedReduceFn<float>(op);
    case ElementType::kFloat64:
      return TypedReduceFn<double>(op);
    case ElementType::kInt32:
      return TypedReduceFn<int32_t>(op);
    case ElementType::kInt64:
      return TypedReduceFn<int64_t>(op);
    case ElementType::kUint8:
      return TypedReduceFn<uint8_t>(op);
  }
  return nullptr;
}

template <typename T>
void DivideBy(void* buf, size_t n, int d) {
  T* x = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / d);
}
template <typename T>
void MultiplyBy(void* buf, size_t n, T s) {
  T* x = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

// Sets a Gloo option's buffers through its typed setters: only sizeof(T) matters to Gloo.
template <typename Fn>
void WithSizedType(ElementType type, Fn&& fn) {
  switch (ElementSize(type)) {
    case 1:
      fn(static_cast<uint8_t*>(nullptr));
      break;
    case 2:
      fn(static_cast<uint16_t*>(nullptr));
      break;
    case 4:
      fn(static_cast<uint32_t*>(nullptr));
      break;
    default:
      fn(static_cast<uint64_t*>(nullptr));
      break;
  }
}

// A pending unbound-buffer send or receive; Wait() (or the destructor) waits for it.
class GlooP2PRequest : public Request {
 public:
  GlooP2PRequest(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool is_send,
                 std::chrono::milliseconds timeout, std::string what)
      : buffer_(std::move(buffer)), is_send_(is_send), timeout_(timeout), what_(std::move(what)) {}
  ~GlooP2PRequest() override { Wait(); }

  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      done_ = true;
      status_ = Guard(what_, [&] {
        const bool completed = is_send_ ? buffer_->waitSend(timeout_) : buffer_->waitRecv(timeout_);
        if (!completed) throw gloo::IoException("aborted");
      });
    }
    return status_;
  }

 private:
  absl::Mutex mu_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  const bool is_send_;
  const std::chrono::milliseconds timeout_;
  const std::string what_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Gloo's TCP transport writes with writev(), without MSG_NOSIGNAL: a write to a peer that has
// gone away raises SIGPIPE, which kills the process before Gloo can report EPIPE. Ignore it,
// unless the program installed its own handler (Python, and so PyTorch, ignores it too).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, int rank, int size, const GlooOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("gloo: no rendezvous store");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is not in [0, world_size ", size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("gloo: timeout must be positive, got ",
                                                   absl::FormatDuration(options.timeout)));
  }
  IgnoreSigpipeUnlessHandled();
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status made = Guard("gloo: creating the tcp transport", [&] {
    gloo::transport::tcp::attr attr;
    if (!options.interface.empty()) {
      attr.iface = options.interface;
    } else {
      attr.hostname = options.hostname;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!made.ok()) {
    return absl::UnavailableError(absl::StrCat(
        made.message(), " (hostname '", options.hostname, "', interface '", options.interface,
        "': set GlooOptions::hostname to an address of this machine)"));
  }
  return Connect(std::make_shared<PrefixStore>("world", store), store, rank, size, options,
                 std::move(device));
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<Store> rendezvous, std::shared_ptr<Store> group_store, int rank, int size,
    const GlooOptions& options, std::shared_ptr<gloo::transport::Device> device) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(Millis(options.timeout));
  GlooStoreAdapter adapter(rendezvous, options.timeout);
  absl::Status connected =
      Guard("gloo rendezvous", [&] { context->connectFullMesh(adapter, device); });
  if (!connected.ok()) {
    return absl::Status(connected.code(),
                        absl::StrCat("rank ", rank, " of ", size, " could not connect through ",
                                     rendezvous->DebugName(), ": ", connected.message()));
  }
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
      rank, size, options, std::move(group_store), std::move(device), std::move(context)));
}

GlooCommunicator::GlooCommunicator(int rank, int size, const GlooOptions& options,
                                   std::shared_ptr<Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context)
    : Communicator(rank, size),
      options_(options),
      store_(std::move(store)),
      device_(std::move(device)),
      context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() {
  ShutdownExecutor();
  context_.reset();
}

void GlooCommunicator::Average(void* buf, size_t count, ElementType type) const {
  const int n = size();
  switch (type) {
    case ElementType::kFloat16:
      HalfScale(static_cast<uint16_t*>(buf), 1.0f / n, count);
      break;
    case ElementType::kFloat32:
      MultiplyBy<float>(buf, count, 1.0f / n);
      break;
    case ElementType::kFloat64:
      MultiplyBy<double>(buf, count, 1.0 / n);
      break;
    case ElementType::kInt32:
      DivideBy<int32_t>(buf, count, n);
      break;
    case ElementType::kInt64:
      DivideBy<int64_t>(buf, count, n);
      break;
    case ElementType::kUint8:
      DivideBy<uint8_t>(buf, count, n);
      break;
  }
}

absl::Status GlooCommunicator::HalvingDoubling(void* buf, size_t count, ElementType type,
                                               ReduceOp op) {
  return Guard(absl::StrCat("all_reduce (halving-doubling) on ", DebugName()), [&] {
    auto run = [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      const gloo::ReductionFunction<T>* fn = gloo::ReductionFunction<T>::sum;
      if (op == ReduceOp::kMax) fn = gloo::ReductionFunction<T>::max;
      if (op == ReduceOp::kMin) fn = gloo::ReductionFunction<T>::min;
      gloo::AllreduceHalvingDoubling<T> algorithm(context_, {static_cast<T*>(buf)},
                                                  static_cast<int>(count), fn);
      algorithm.run();
    };
    if (type == ElementType::kFloat32) {
      run(static_cast<float*>(nullptr));
    } else {
      run(static_cast<double*>(nullptr));
    }
  });
}

absl::Status GlooCommunicator::DoAllReduce(const void* send, void* recv, size_t count,
                                           ElementType type, ReduceOp op) {
  absl::Status status;
  const bool hd =
      options_.all_reduce_algorithm == GlooOptions::AllReduceAlgorithm::kHalvingDoubling &&
      (type == ElementType::kFloat32 || type == ElementType::kFloat64) &&
      count <= static_cast<size_t>(INT32_MAX);
  if (hd) {
    if (send != recv) std::memcpy(recv, send, count * ElementSize(type));
    status = HalvingDoubling(recv, count, type, op);
  } else {
    status = Guard(absl::StrCat("all_reduce on ", DebugName()), [&] {
      gloo::AllreduceOptions opts(context_);
      WithSizedType(type, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        if (send != recv) opts.setInput(static_cast<T*>(const_cast<void*>(send)), count);
        opts.setOutput(static_cast<T*>(recv), count);
      });
      opts.setReduceFunction(GetReduceFn(type, op));
      opts.setTag(NextTag());
      opts.setTimeout(Millis(options_.timeout));
      if (options_.all_reduce_algorithm == GlooOptions::AllReduceAlgorithm::kBcube) {
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
      } else {
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      }
      if (options_.ring_segment_bytes > 0) opts.setMaxSegmentSize(options_.ring_segment_bytes);
      gloo::allreduce(opts);
    });
  }
  if (status.ok() && op == ReduceOp::kAvg) Average(recv, count, type);
  return status;
}

absl::Status GlooCommunicator::DoBroadcast(void* buf, size_t count, ElementType type, int root) {
  return Guard(absl::StrCat("broadcast from rank ", root, " on ", DebugName()), [&] {
    gloo::BroadcastOptions opts(context_);
    WithSizedType(type, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      opts.setOutput(static_cast<T*>(buf), count);
    });
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::DoAllGather(const void* send, void* recv, size_t count,
                                           ElementType type) {
  const size_t bytes = count * ElementSize(type);
  const bool in_place = static_cast<const char*>(send) ==
                        static_cast<const char*>(recv) + bytes * static_cast<size_t>(rank());
  return Guard(absl::StrCat("all_gather on ", DebugName()), [&] {
    gloo::AllgatherOptions opts(context_);
    WithSizedType(type, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      if (!in_place) opts.setInput(static_cast<T*>(const_cast<void*>(send)), count);
      opts.setOutput(static_cast<T*>(recv), count * static_cast<size_t>(size()));
    });
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::allgather(opts);
  });
}

// Ring reduce-scatter: in step s (0 <= s < n-1) rank r sends block (r-s-1) mod n of its working
// copy to rank r+1, receives block (r-s-2) mod n from rank r-1 and reduces it into its copy;
// after n-1 steps block r holds the reduction over all ranks. Each rank sends (n-1)/n of the
// input: bandwidth-optimal.
absl::Status GlooCommunicator::DoReduceScatter(const void* send, void* recv, size_t recv_count,
                                               ElementType type, ReduceOp op) {
  const int n = size();
  const int r = rank();
  const size_t block = recv_count * ElementSize(type);
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, NextTag());
  const ReduceFn reduce = GetReduceFn(type, op);
  std::vector<char> work(static_cast<const char*>(send),
                         static_cast<const char*>(send) + block * static_cast<size_t>(n));
  std::vector<char> incoming(block);
  absl::Status status = Guard(absl::StrCat("reduce_scatter on ", DebugName()), [&] {
    auto work_buf = context_->createUnboundBuffer(work.data(), work.size());
    auto in_buf = context_->createUnboundBuffer(incoming.data(), incoming.size());
    const auto timeout = Millis(options_.timeout);
    const int next = (r + 1) % n;
    const int prev = (r + n - 1) % n;
    for (int s = 0; s < n - 1; ++s) {
      const size_t send_block = static_cast<size_t>(((r - s - 1) % n + n) % n);
      const size_t recv_block = static_cast<size_t>(((r - s - 2) % n + n) % n);
      in_buf->recv(prev, slot, 0, block);
      work_buf->send(next, slot, send_block * block, block);
      if (!in_buf->waitRecv(timeout)) throw gloo::IoException("receive aborted");
      reduce(work.data() + recv_block * block, work.data() + recv_block * block, incoming.data(),
             recv_count);
      if (!work_buf->waitSend(timeout)) throw gloo::IoException("send aborted");
    }
  });
  if (!status.ok()) return status;
  std::memcpy(recv, work.data() + static_cast<size_t>(r) * block, block);
  if (op == ReduceOp::kAvg) Average(recv, recv_count, type);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::DoBarrier() {
  return Guard(absl::StrCat("barrier on ", DebugName()), [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(Millis(options_.timeout));
    gloo::barrier(opts);
  });
}

std::unique_ptr<Request> GlooCommunicator::DoISend(const void* buf, size_t bytes, int peer,
                                                   uint32_t tag) {
  const std::string what = absl::StrCat("send to rank ", peer, " (tag ", tag, ") on ", DebugName());
  std::unique_ptr<gloo::transport::UnboundBuffer> ub;
  absl::Status s = Guard(what, [&] {
    ub = context_->createUnboundBuffer(const_cast<void*>(buf), bytes);
    ub->send(peer, gloo::Slot::build(kSendRecvSlotPrefix, tag));
  });
  if (!s.ok()) return CompletedRequest(s);
  return std::make_unique<GlooP2PRequest>(std::move(ub), /*is_send=*/true, Millis(options_.timeout),
                                          what);
}

std::unique_ptr<Request> GlooCommunicator::DoIRecv(void* buf, size_t bytes, int peer,
                                                   uint32_t tag) {
  const std::string what =
      absl::StrCat("recv from rank ", peer, " (tag ", tag, ") on ", DebugName());
  std::unique_ptr<gloo::transport::UnboundBuffer> ub;
  absl::Status s = Guard(what, [&] {
    ub = context_->createUnboundBuffer(buf, bytes);
    ub->recv(peer, gloo::Slot::build(kSendRecvSlotPrefix, tag));
  });
  if (!s.ok()) return CompletedRequest(s);
  return std::make_unique<GlooP2PRequest>(std::move(ub), /*is_send=*/false,
                                          Millis(options_.timeout), what);
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::DoNewGroup(
    const std::vector<int>& ranks, const std::string& group_key) {
  const int new_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
  auto group = Connect(std::make_shared<PrefixStore>(group_key, store_), store_, new_rank,
                       static_cast<int>(ranks.size()), options_, device_);
  if (!group.ok()) return group.status();
  return std::unique_ptr<Communicator>(std::move(*group));
}

}  // namespace collective
}  // namespace tessera
