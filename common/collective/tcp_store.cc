#include "common/collective/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/secure_compare.h"

namespace tessera {
namespace collective {
namespace {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kAuth = 3;
constexpr uint8_t kAccepted = 0;
constexpr uint8_t kRefused = 1;          // AUTH with a wrong token
constexpr uint8_t kUnauthenticated = 2;  // another request before AUTH
constexpr uint32_t kMaxKeyBytes = 1 << 16;
constexpr uint32_t kMaxValueBytes = 1 << 26;
// Extra time a client waits for a GET answer beyond the GET's own timeout.
constexpr absl::Duration kReplySlack = absl::Seconds(10);

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds left until `deadline` for poll(); -1 (forever) for InfiniteFuture.
int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` is readable/writable; false on timeout. Sets *err on failure.
bool PollFd(int fd, short events, absl::Time deadline, int* err) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, PollMillis(deadline));
    if (n > 0) return true;
    if (n == 0) {
      *err = ETIMEDOUT;
      return false;
    }
    if (errno != EINTR) {
      *err = errno;
      return false;
    }
  }
}

// 0 on success, else an errno value (ETIMEDOUT past the deadline, EPIPE for a closed peer).
int WriteAll(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    int err = 0;
    if (!PollFd(fd, POLLOUT, deadline, &err)) return err;
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int ReadAll(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    int err = 0;
    if (!PollFd(fd, POLLIN, deadline, &err)) return err;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) return EPIPE;
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Sends AUTH on a fresh connection. Unauthenticated (never echoing the token) when refused.
absl::Status Authenticate(int fd, const std::string& endpoint, const std::string& token) {
  if (token.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError("tcp store: the job token is longer than 65536 bytes");
  }
  std::string req;
  req.push_back(static_cast<char>(kAuth));
  PutU32(&req, static_cast<uint32_t>(token.size()));
  req += token;
  const absl::Time deadline = absl::Now() + kReplySlack;
  uint8_t answer = kRefused;
  int err = WriteAll(fd, req.data(), req.size(), deadline);
  if (err == 0) err = ReadAll(fd, &answer, 1, deadline);
  if (err == ETIMEDOUT) {
    return absl::DeadlineExceededError(absl::StrCat("rendezvous store ", endpoint,
                                                    " did not answer the job token check within ",
                                                    absl::FormatDuration(kReplySlack)));
  }
  if (err != 0 || answer != kAccepted) {
    return absl::UnauthenticatedError(
        absl::StrCat("rendezvous store ", endpoint,
                     " refused this rank's job token (every rank needs the "
                     "same --job_token or --job_token_file)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseEndpoint(const std::string& endpoint, std::string* host, int* port) {
  const size_t colon = endpoint.rfind(':');
  int p = -1;
  if (colon == std::string::npos || colon + 1 == endpoint.size() ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad endpoint '", endpoint, "' (expected host:port)"));
  }
  std::string h = endpoint.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = h;
  *port = p;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Server

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const std::string& endpoint, const std::string& job_token) {
  std::string host;
  int port = 0;
  absl::Status parsed = ParseEndpoint(endpoint, &host, &port);
  if (!parsed.ok()) return parsed;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const int gai =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("tcp store: cannot resolve '", endpoint, "': ", ::gai_strerror(gai)));
  }
  int fd = -1;
  int last_err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) break;
    last_err = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("tcp store: cannot listen on '", endpoint, "': ", ErrnoText(last_err)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual_port = bound.ss_family == AF_INET6
                              ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(fd, absl::StrCat(shown_host, ":", actual_port), actual_port));
  server->job_token_ = job_token;
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(int listen_fd, std::string endpoint, int port)
    : listen_fd_(listen_fd), endpoint_(std::move(endpoint)), port_(port) {}

TcpStoreServer::~TcpStoreServer() { Shutdown(); }

void TcpStoreServer::AcceptLoop() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    SetNoDelay(fd);
    fds_.push_back(fd);
    threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  const absl::Time forever = absl::InfiniteFuture();
  bool authenticated = job_token_.empty();
  while (true) {
    uint8_t cmd = 0;
    uint32_t key_len = 0;
    if (ReadAll(fd, &cmd, 1, forever) != 0 || ReadAll(fd, &key_len, 4, forever) != 0 ||
        key_len > kMaxKeyBytes) {
      break;
    }
    std::string key(key_len, '\0');
    if (ReadAll(fd, key.data(), key_len, forever) != 0) break;
    std::string reply;
    if (cmd == kAuth) {
      // `key` holds the presented token.
      const bool ok = job_token_.empty() || ConstantTimeEquals(job_token_, key);
      const uint8_t answer = ok ? kAccepted : kRefused;
      if (!ok) refused_.fetch_add(1);  // before the answer: a client may then read the count
      if (WriteAll(fd, &answer, 1, forever) != 0 || !ok) break;
      authenticated = true;
      continue;
    }
    if (!authenticated) {
      // Consume the rest of a well-formed SET/GET (unstored), so that the answer reaches the
      // client instead of a connection reset, then answer "unauthenticated" and close.
      bool whole = false;
      if (cmd == kSet) {
        uint32_t value_len = 0;
        whole = ReadAll(fd, &value_len, 4, forever) == 0 && value_len <= kMaxValueBytes;
        char sink[4096];
        for (uint32_t left = value_len; whole && left > 0;) {
          const uint32_t n = std::min<uint32_t>(left, sizeof(sink));
          whole = ReadAll(fd, sink, n, forever) == 0;
          left -= n;
        }
      } else if (cmd == kGet) {
        uint64_t timeout_ms = 0;
        whole = ReadAll(fd, &timeout_ms, 8, forever) == 0;
      }
      refused_.fetch_add(1);
      const uint8_t answer = kUnauthenticated;
      if (whole) WriteAll(fd, &answer, 1, forever);
      break;
    }
    if (cmd == kSet) {
      uint32_t value_len = 0;
      if (ReadAll(fd, &value_len, 4, forever) != 0 || value_len > kMaxValueBytes) break;
      std::string value(value_len, '\0');
      if (ReadAll(fd, value.data(), value_len, forever) != 0) break;
      {
        absl::MutexLock lock(&mu_);
        values_[key] = std::move(value);
      }
      reply.push_back(0);
    } else if (cmd == kGet) {
      uint64_t timeout_ms = 0;
      if (ReadAll(fd, &timeout_ms, 8, forever) != 0) break;
      std::string value;
      bool found = false;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || values_.count(key) > 0;
        };
        mu_.AwaitWithTimeout(absl::Condition(&ready),
                             absl::Milliseconds(static_cast<int64_t>(
                                 std::min<uint64_t>(timeout_ms, uint64_t{1} << 40))));
        if (stopping_) break;
        auto it = values_.find(key);
        if (it != values_.end()) {
          found = true;
          value = it->second;
        }
      }
      reply.push_back(found ? 0 : 1);
      PutU32(&reply, static_cast<uint32_t>(value.size()));
      reply += value;
    } else {
      break;  // garbage: drop the connection
    }
    if (WriteAll(fd, reply.data(), reply.size(), forever) != 0) break;
  }
  // The descriptor is closed by Shutdown() (it may still be shut down there).
}

void TcpStoreServer::Shutdown() {
  std::vector<std::thread> threads;
  std::vector<int> fds;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    threads.swap(threads_);
    fds.swap(fds_);
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  // accept() may not wake on shutdown() of a listening socket everywhere; a connection does.
  {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      const int poke = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (poke >= 0) {
        ::connect(poke, reinterpret_cast<sockaddr*>(&addr), len);
        ::close(poke);
      }
    }
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  for (int fd : fds) ::shutdown(fd, SHUT_RDWR);
  for (std::thread& t : threads) t.join();
  for (int fd : fds) ::close(fd);
  ::close(listen_fd_);
}

// ---------------------------------------------------------------------------------------------
// Client

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& endpoint,
                                                            absl::Duration timeout,
                                                            const std::string& job_token) {
  std::string host;
  int port = 0;
  absl::Status parsed = ParseEndpoint(endpoint, &host, &port);
  if (!parsed.ok()) return parsed;
  if (port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store endpoint '", endpoint, "' needs a port"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last_error = "no attempt";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = ::gai_strerror(gai);
    } else {
      for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
          last_error = ErrnoText(errno);
          continue;
        }
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          SetNoDelay(fd);
          if (!job_token.empty()) {
            absl::Status auth = Authenticate(fd, endpoint, job_token);
            if (!auth.ok()) {
              ::close(fd);
              return auth;
            }
          }
          return std::unique_ptr<TcpStore>(new TcpStore(fd, endpoint));
        }
        last_error = ErrnoText(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    if (absl::Now() + backoff > deadline) break;
    absl::SleepFor(backoff);  // the server may not be up yet: retry with backoff
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to the rendezvous store at ", endpoint, " within ",
                   absl::FormatDuration(timeout), " (", last_error,
                   "); is rank 0 running and is the endpoint right?"));
}

TcpStore::~TcpStore() {
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status TcpStore::Unauthenticated() {
  ::close(fd_);
  fd_ = -1;
  return absl::UnauthenticatedError(
      absl::StrCat("rendezvous store ", endpoint_,
                   " requires a job token and this rank has none (give "
                   "every rank the same --job_token or --job_token_file)"));
}

absl::Status TcpStore::Broken(const std::string& what) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return absl::UnavailableError(
      absl::StrCat("rendezvous store ", endpoint_, ": ", what, " (is rank 0 still running?)"));
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  if (key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store: key '", key.substr(0, 64), "' or its value is too large"));
  }
  std::string req;
  req.push_back(static_cast<char>(kSet));
  PutU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  PutU32(&req, static_cast<uint32_t>(value.size()));
  req += value;
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return Broken("connection lost earlier");
  const absl::Time deadline = absl::Now() + kReplySlack;
  if (int err = WriteAll(fd_, req.data(), req.size(), deadline); err != 0) {
    return Broken(absl::StrCat("set '", key, "': ", ErrnoText(err)));
  }
  uint8_t status = 0;
  if (int err = ReadAll(fd_, &status, 1, deadline); err != 0) {
    return Broken(absl::StrCat("set '", key, "': ", ErrnoText(err)));
  }
  if (status == kUnauthenticated) return Unauthenticated();
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Get(const std::string& key, absl::Duration timeout) {
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store: key '", key.substr(0, 64), "' is too large"));
  }
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  std::string req;
  req.push_back(static_cast<char>(kGet));
  PutU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  PutU64(&req, static_cast<uint64_t>(absl::ToInt64Milliseconds(timeout)));
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) return Broken("connection lost earlier");
  const absl::Time deadline = absl::Now() + timeout + kReplySlack;
  if (int err = WriteAll(fd_, req.data(), req.size(), deadline); err != 0) {
    return Broken(absl::StrCat("get '", key, "': ", ErrnoText(err)));
  }
  uint8_t status = 0;
  uint32_t len = 0;
  if (int err = ReadAll(fd_, &status, 1, deadline); err != 0) {
    return Broken(absl::StrCat("get '", key, "': ", ErrnoText(err)));
  }
  if (status == kUnauthenticated) return Unauthenticated();
  if (int err = ReadAll(fd_, &len, 4, deadline); err != 0 || len > kMaxValueBytes) {
    return Broken(absl::StrCat("get '", key, "': ", err != 0 ? ErrnoText(err) : "bad reply"));
  }
  std::string value(len, '\0');
  if (int err = ReadAll(fd_, value.data(), len, deadline); err != 0) {
    return Broken(absl::StrCat("get '", key, "': ", ErrnoText(err)));
  }
  if (status != 0) {
    return absl::DeadlineExceededError(absl::StrCat("key '", key, "' not set in ", DebugName(),
                                                    " within ", absl::FormatDuration(timeout),
                                                    " (did every rank start?)"));
  }
  return value;
}

}  // namespace collective
}  // namespace tessera
