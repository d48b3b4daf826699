// Rendezvous stores: in-memory, prefixed, TCP (server + clients) and file system.
#include "common/collective/store.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/collective/file_store.h"
#include "common/collective/tcp_store.h"
#include "common/collective/test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

// The behaviour every store shares: set/get, get waiting for a later set, timeouts.
void ExerciseStore(Store* writer, Store* reader) {
  ASSERT_TRUE(writer->Set("a", "alpha").ok());
  auto a = reader->Get("a", absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "alpha");
  ASSERT_TRUE(writer->Set("empty", "").ok());
  auto e = reader->Get("empty", absl::Seconds(5));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, "");
  const std::string binary("\0\x01\xff zero", 8);
  ASSERT_TRUE(writer->Set("bin", binary).ok());
  EXPECT_EQ(*reader->Get("bin", absl::Seconds(5)), binary);

  // Get blocks until another thread sets the key.
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(writer->Set("late", "here").ok());
  });
  auto late = reader->Get("late", absl::Seconds(10));
  later.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "here");
  EXPECT_TRUE(reader->Wait({"a", "late"}, absl::Seconds(5)).ok());

  const absl::Time start = absl::Now();
  auto missing = reader->Get("missing", absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_TRUE(absl::IsDeadlineExceeded(reader->Wait({"a", "missing"}, absl::Milliseconds(200))));
}

TEST(HashStoreTest, Basics) {
  HashStore store;
  ExerciseStore(&store, &store);
}

TEST(PrefixStoreTest, KeysLiveUnderThePrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore p("job7", base);
  ExerciseStore(&p, &p);
  EXPECT_EQ(*base->Get("job7/a", absl::Seconds(1)), "alpha");
  PrefixStore other("job8", base);
  EXPECT_FALSE(other.Get("a", absl::Milliseconds(50)).ok());
}

TEST(TcpStoreTest, ServerAndClients) {
  auto server = TcpStoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  auto writer = TcpStore::Connect((*server)->endpoint(), absl::Seconds(5));
  auto reader = TcpStore::Connect((*server)->endpoint(), absl::Seconds(5));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(reader.ok()) << reader.status();
  ExerciseStore(writer->get(), reader->get());
  // A large value.
  std::string big(3 << 20, 'x');
  ASSERT_TRUE((*writer)->Set("big", big).ok());
  EXPECT_EQ((*reader)->Get("big", absl::Seconds(5))->size(), big.size());
}

TEST(TcpStoreTest, ClientWaitsForALateServer) {
  auto endpoint = FreeLoopbackEndpoint();
  ASSERT_TRUE(endpoint.ok());
  std::unique_ptr<TcpStoreServer> server;
  absl::Notification started;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto s = TcpStoreServer::Start(*endpoint);
    ASSERT_TRUE(s.ok()) << s.status();
    server = std::move(*s);
    started.Notify();
  });
  auto client = TcpStore::Connect(*endpoint, absl::Seconds(10));
  starter.join();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  EXPECT_EQ(*(*client)->Get("k", absl::Seconds(1)), "v");
}

TEST(TcpStoreTest, ErrorsNameTheEndpoint) {
  auto endpoint = FreeLoopbackEndpoint();
  ASSERT_TRUE(endpoint.ok());
  auto client = TcpStore::Connect(*endpoint, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_NE(client.status().message().find(*endpoint), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStore::Connect("nohostport", absl::Seconds(1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start("1.2.3.4:99999").status()));
  // The port of a running server is taken.
  auto first = TcpStoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  auto second = TcpStoreServer::Start((*first)->endpoint());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
}

TEST(TcpStoreTest, ShutdownWakesWaitingClientsAndLaterCallsFail) {
  auto server = TcpStoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  auto client = TcpStore::Connect((*server)->endpoint(), absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (*server)->Shutdown();
  });
  const absl::Time start = absl::Now();
  auto value = (*client)->Get("never", absl::Seconds(30));
  stopper.join();
  EXPECT_TRUE(absl::IsUnavailable(value.status())) << value.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable((*client)->Set("k", "v")));
}

TEST(TcpStoreTest, ParseEndpoint) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(ParseEndpoint("10.0.0.1:6170", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 6170);
  ASSERT_TRUE(ParseEndpoint("[::1]:80", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_FALSE(ParseEndpoint("host", &host, &port).ok());
  EXPECT_FALSE(ParseEndpoint("host:", &host, &port).ok());
  EXPECT_FALSE(ParseEndpoint("host:-1", &host, &port).ok());
  EXPECT_FALSE(ParseEndpoint("host:x", &host, &port).ok());
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "_", ::getpid());
}

TEST(FileStoreTest, Basics) {
  const std::string dir = TempDir("file_store/nested");
  auto writer = FileStore::Open(dir);
  auto reader = FileStore::Open(dir);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(reader.ok()) << reader.status();
  ExerciseStore(writer->get(), reader->get());
  // A directory left by an earlier job is refused rather than handing out stale values.
  absl::Status again = (*writer)->Set("a", "beta");
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_NE(again.message().find(dir), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(FileStore::Open("").status()));
  EXPECT_TRUE(absl::IsUnavailable(FileStore::Open("/proc/self/no/such/dir").status()));
}

}  // namespace
}  // namespace collective
}  // namespace tessera
