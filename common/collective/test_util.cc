#include "common/collective/test_util.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {

InitParams ThreadRankParams() {
  InitParams p;
  p.backend = BackendType::kGloo;
  p.gloo.hostname = "127.0.0.1";
  p.timeout = absl::Seconds(30);
  return p;
}

void RunRanks(int world, const std::function<void(Context& ctx)>& fn, const InitParams& params) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Context ctx;
      absl::Status s = ctx.InitWithStore(store, r, world, params);
      ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s;
      fn(ctx);
      absl::Status down = ctx.Shutdown();
      EXPECT_TRUE(down.ok()) << "rank " << r << ": " << down;
    });
  }
  for (auto& t : threads) t.join();
}

absl::StatusOr<std::string> FreeLoopbackEndpoint() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return absl::UnavailableError("cannot bind a loopback port");
  }
  ::close(fd);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

}  // namespace collective
}  // namespace tessera
