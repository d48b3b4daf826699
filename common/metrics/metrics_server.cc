#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

// Writes all of `data` before `deadline`; false on error or timeout.
bool WriteAll(int fd, const std::string& data, absl::Time deadline) {
  size_t done = 0;
  while (done < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    int ms = RemainingMs(deadline);
    if (ms == 0) return false;
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
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

void MetricsServer::Loop() {
  while (!stopping_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    int r = ::poll(p, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (stopping_ || (p[1].revents & POLLIN) != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EAGAIN (someone else's connect went away), EMFILE, ...
    Serve(fd);
    ::close(fd);
  }
}

void MetricsServer::Serve(int fd) {
  absl::Time deadline = absl::Now() + options_.io_timeout;
  std::string request;
  char buf[1024];
  bool complete = false;
  while (!complete && request.size() <= options_.max_request_bytes) {
    pollfd p{fd, POLLIN, 0};
    int ms = RemainingMs(deadline);
    if (ms == 0) return;  // too slow: drop the connection
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // closed before a full request
    request.append(buf, static_cast<size_t>(n));
    complete =
        request.find("\r\n\r\n") != std::string::npos || request.find("\n\n") != std::string::npos;
  }
  if (!complete) {
    WriteAll(fd,
             Response(431, "Request Header Fields Too Large", "text/plain", "request too large\n"),
             deadline);
    return;
  }
  std::string line = request.substr(0, request.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/")) {
    WriteAll(fd, Response(400, "Bad Request", "text/plain", "malformed request line\n"), deadline);
    return;
  }
  if (parts[0] != "GET") {
    WriteAll(
        fd,
        Response(405, "Method Not Allowed", "text/plain", "only GET /metrics\n", "Allow: GET\r\n"),
        deadline);
    return;
  }
  std::string path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") {
    WriteAll(fd, Response(404, "Not Found", "text/plain", "only GET /metrics\n"), deadline);
    return;
  }
  if (WriteAll(
          fd,
          Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_->Exposition()),
          deadline)) {
    ++served_;
  }
}

}  // namespace tessera
