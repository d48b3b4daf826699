#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tessera {

namespace {

int RemainingMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body, const std::string& extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", body);
}

}  // namespace

MetricsServer::MetricsServer(const MetricsRegistry* registry, MetricsServerOptions options)
    : registry_(registry), options_(std::move(options)) {}

MetricsServer::~MetricsServer() {
  Shutdown();
  Wait();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

absl::Status MetricsServer::Start() {
  if (listen_fd_ >= 0) return absl::FailedPreconditionError("metrics server already started");
  std::string where = absl::StrCat(options_.host, ":", options_.port);
  if (options_.port < 0 || options_.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", options_.port, " is not in 0..65535"));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.port));
  if (::inet_pton(AF_INET, options_.host.c_str(), &addr.sin_addr) != 1) {
    // A host name (e.g. the pserver's endpoint host): bind its first IPv4 address only.
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (options_.host.empty() || ::getaddrinfo(options_.host.c_str(), nullptr, &hints, &res) != 0 ||
        res == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("metrics server host '", options_.host,
                                                     "' is not an IPv4 address or host name"));
    }
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("metrics server cannot listen on ", where, ": ", err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (::pipe2(wake_fds_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  listen_fd_ = fd;
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void MetricsServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (wake_fds_[1] >= 0) (void)!::write(wake_fds_[1], "x", 1);
}

void MetricsServer::Wait() {
  if (thread_.joinable()) thread_.join();
}

struct MetricsServer::Connection {
  int fd = -1;
  absl::Time deadline;
  std::string request;
  std::string response;  // set once the request is complete
  size_t written = 0;
  bool ok = false;  // the response is a 200
};

void MetricsServer::Loop() {
  std::vector<Connection> open;
  std::vector<pollfd> fds;
  auto close_at = [&](size_t i) {
    ::close(open[i].fd);
    open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (!stopping_) {
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}});
    absl::Time next = absl::InfiniteFuture();
    for (const Connection& c : open) {
      fds.push_back({c.fd, static_cast<short>(c.response.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    int ms = next == absl::InfiniteFuture() ? -1 : RemainingMs(next);
    int r = ::poll(fds.data(), fds.size(), ms);
    if (r < 0 && errno != EINTR) break;
    if (stopping_ || (fds[1].revents & POLLIN) != 0) break;
    const absl::Time now = absl::Now();
    // Existing connections first (indices shift as they close: walk backwards).
    for (size_t i = open.size(); i-- > 0;) {
      Connection& c = open[i];
      const short revents = r > 0 ? fds[i + 2].revents : 0;
      if (revents != 0 && c.response.empty()) OnReadable(&c);
      if (c.fd < 0) {  // closed by the client, or unreadable
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (!c.response.empty() && (revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
        ssize_t n = ::send(c.fd, c.response.data() + c.written, c.response.size() - c.written,
                           MSG_NOSIGNAL);
        if (n > 0) c.written += static_cast<size_t>(n);
        if (n < 0 && errno != EINTR && errno != EAGAIN) c.written = c.response.size() + 1;
        if (c.written == c.response.size() && c.ok) ++served_;
        if (c.written >= c.response.size()) {
          close_at(i);
          continue;
        }
      }
      if (now >= c.deadline) close_at(i);  // too slow to ask or to take the answer
    }
    if (r > 0 && (fds[0].revents & POLLIN) != 0) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (static_cast<int>(open.size()) >= std::max(1, options_.max_connections)) close_at(0);
        open.push_back(Connection{fd, absl::Now() + options_.io_timeout});
      }
      // else EAGAIN (someone else's connect went away), EMFILE, ...: try again next round.
    }
  }
  for (Connection& c : open) ::close(c.fd);
}

void MetricsServer::OnReadable(Connection* c) {
  char buf[1024];
  ssize_t n = ::recv(c->fd, buf, sizeof(buf), 0);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // closed before a full request
    ::close(c->fd);
    c->fd = -1;
    return;
  }
  c->request.append(buf, static_cast<size_t>(n));
  const bool complete = c->request.find("\r\n\r\n") != std::string::npos ||
                        c->request.find("\n\n") != std::string::npos;
  if (!complete && c->request.size() <= options_.max_request_bytes) return;
  c->ok = complete;
  c->response = complete ? Answer(c->request)
                         : Response(431, "Request Header Fields Too Large", "text/plain",
                                    "request too large\n");
  c->ok = c->ok && c->response.rfind("HTTP/1.1 200", 0) == 0;
}

std::string MetricsServer::Answer(const std::string& request) {
  std::string line = request.substr(0, request.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
    return Response(400, "Bad Request", "text/plain", "malformed request line\n");
  }
  if (parts[0] != "GET") {
    return Response(405, "Method Not Allowed", "text/plain", "only GET /metrics\n",
                    "Allow: GET\r\n");
  }
  std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") return Response(404, "Not Found", "text/plain", "only GET /metrics\n");
  return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_->Exposition());
}

}  // namespace tessera
