// Security of a real cluster: mutual TLS on the pserver's gRPC port, the job token on every
// request (and on the collective rendezvous store), and daemons that listen only on their
// configured address. Certificates are made at test time with /usr/bin/openssl in
// $TEST_TMPDIR; daemons run on free loopback ports and are killed by pid at the end.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/collective/tcp_store.h"
#include "common/io/checkpoint_io.h"
#include "common/io/file_system.h"
#include "common/config/cluster_config.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/grpc_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "cluster/cluster_programs.h"

namespace tessera {
namespace {

constexpr char kToken[] = "s3cret-job-token-4f1c";

std::string ReadAllOf(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Runs a shell command line; its output goes to `log`. Returns the exit status.
int Shell(const std::string& cmd, const std::string& log) {
  int rc = std::system(absl::StrCat(cmd, " >>'", log, "' 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A CA, a node certificate signed by it (server and client use, SAN IP:127.0.0.1 and
// DNS:localhost), and a second, unrelated CA with its own node certificate.
struct Pki {
  std::string dir;
  std::string ca, cert, key;                    // the job's
  std::string other_ca, other_cert, other_key;  // another CA's
};

// EC P-256 keys: fast to generate. Fails the test (with openssl's output) if openssl fails.
void MakeCa(const std::string& dir, const std::string& name, const std::string& log) {
  ASSERT_EQ(Shell(absl::StrCat("/usr/bin/openssl req -x509 -newkey ec -pkeyopt "
                               "ec_paramgen_curve:prime256v1 -nodes -days 2 -subj '/CN=",
                               name, "' -keyout '", dir, "/", name, ".key' -out '", dir, "/", name,
                               ".crt'"),
                  log),
            0)
      << ReadAllOf(log);
}

void MakeNodeCert(const std::string& dir, const std::string& ca, const std::string& name,
                  const std::string& log) {
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  WriteFile(ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth,clientAuth\n");
  ASSERT_EQ(Shell(absl::StrCat("/usr/bin/openssl req -newkey ec -pkeyopt "
                               "ec_paramgen_curve:prime256v1 -nodes -subj '/CN=",
                               name, "' -keyout '", dir, "/", name, ".key' -out '", dir, "/", name,
                               ".csr'"),
                  log),
            0)
      << ReadAllOf(log);
  ASSERT_EQ(Shell(absl::StrCat("/usr/bin/openssl x509 -req -days 2 -in '", dir, "/", name,
                               ".csr' -CA '", dir, "/", ca, ".crt' -CAkey '", dir, "/", ca,
                               ".key' -CAcreateserial -extfile '", ext, "' -out '", dir, "/", name,
                               ".crt'"),
                  log),
            0)
      << ReadAllOf(log);
}

const Pki& TestPki() {
  static Pki* pki = [] {
    auto* p = new Pki;
    p->dir = MakeTempDir("pki");
    const std::string log = p->dir + "/openssl.log";
    MakeCa(p->dir, "ca", log);
    MakeNodeCert(p->dir, "ca", "node", log);
    MakeCa(p->dir, "other_ca", log);
    MakeNodeCert(p->dir, "other_ca", "other_node", log);
    p->ca = p->dir + "/ca.crt";
    p->cert = p->dir + "/node.crt";
    p->key = p->dir + "/node.key";
    p->other_ca = p->dir + "/other_ca.crt";
    p->other_cert = p->dir + "/other_node.crt";
    p->other_key = p->dir + "/other_node.key";
    WriteFile(p->dir + "/token", std::string(kToken) + "\n");
    return p;
  }();
  return *pki;
}

std::vector<std::string> TlsFlags(const Pki& pki) {
  return {"--tls_cert=" + pki.cert, "--tls_key=" + pki.key, "--tls_ca=" + pki.ca,
          "--job_token_file=" + pki.dir + "/token"};
}

int PortOf(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

// The flags that define the model and cluster shape: the daemons and the test's own
// transpilation (to learn the parameter names) must agree on them.
std::vector<std::string> JobFlags(const std::string& endpoint) {
  return {"--pservers=" + endpoint, "--trainers=1",           "--example=mlp_regression",
          "--num_examples=512",     "--num_test_examples=64", "--batch_size=64",
          "--job_id=sec",           "--barrier_timeout_s=60", "--rpc_deadline_s=30",
          "--log_every_steps=0"};
}

RpcSecurity Security(const std::string& cert, const std::string& key, const std::string& ca,
                     const std::string& token) {
  RpcSecurity s;
  if (!cert.empty()) s.cert_pem = ReadAllOf(cert);
  if (!key.empty()) s.key_pem = ReadAllOf(key);
  if (!ca.empty()) s.ca_pem = ReadAllOf(ca);
  s.job_token = token;
  return s;
}

std::unique_ptr<GrpcPServerClient> Client(const std::string& endpoint, RpcSecurity security,
                                          bool wait_for_ready = false) {
  GrpcClientOptions o;
  o.security = std::move(security);
  o.wait_for_ready = wait_for_ready;
  o.deadline = wait_for_ready ? absl::Seconds(30) : absl::Seconds(5);
  o.max_attempts = 2;
  return std::make_unique<GrpcPServerClient>(endpoint, o);
}

RequestMeta Meta() { return RequestMeta{"sec", 0, 0}; }

// The job's dense parameters and gradients on the pserver (names as on the wire).
struct Params {
  std::vector<std::string> params;
  std::vector<std::string> grads;
};

// The transpilation a daemon started with `flags` (--flag=value each) does.
absl::StatusOr<DistributeTranspiler> TranspileFlags(const std::vector<std::string>& flags) {
  ClusterConfig config;
  for (const auto& f : flags) {
    auto eq = f.find('=');
    absl::Status s = SetFromString(f.substr(2, eq - 2), f.substr(eq + 1), &config);
    if (!s.ok()) return s;
  }
  auto registry = NewStandardOpRegistry();
  return TranspileFor(config, *registry, 0);
}

Params ParamsOf(const std::vector<std::string>& flags) {
  auto t = TranspileFlags(flags);
  EXPECT_TRUE(t.ok()) << t.status();
  Params out;
  if (!t.ok()) return out;
  std::set<std::string> sent;
  for (const auto& op : t->trainer_program().blocks(0).ops()) {
    if (op.type() != "send") continue;
    for (const auto& x : OpInputs(op, "X")) sent.insert(x);
  }
  for (const auto& b : t->param_blocks()) {
    EXPECT_EQ(sent.count(b.name + "@GRAD"), 1u) << "no gradient sent for " << b.name;
    out.params.push_back(b.name);
    out.grads.push_back(b.name + "@GRAD");
  }
  return out;
}

// A started pserver daemon.
struct Pserver {
  std::string endpoint;
  int metrics_port = 0;
  pid_t pid = 0;
  std::string log;
};

Pserver StartPserver(ProcessGroup* group, const std::string& dir,
                     const std::vector<std::string>& extra) {
  Pserver p;
  auto eps = FreeEndpoints(2);
  EXPECT_TRUE(eps.ok()) << eps.status();
  if (!eps.ok()) return p;
  p.endpoint = (*eps)[0];
  p.metrics_port = PortOf((*eps)[1]);
  p.log = dir + "/pserver.log";
  std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                   "--current_endpoint=" + p.endpoint,
                                   absl::StrCat("--metrics_port=", p.metrics_port)};
  for (const auto& f : JobFlags(p.endpoint)) args.push_back(f);
  args.insert(args.end(), extra.begin(), extra.end());
  auto pid = group->Start(args, p.log);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (pid.ok()) p.pid = *pid;
  return p;
}

std::string Bytes(const Variable& v) {
  const Tensor& t = v.Get<Tensor>();
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// ------------------------------------------------------------------------------------------
// (a) A real pserver and trainer train to completion with mutual TLS and the job token.

TEST(SecurityTest, TrainsToCompletionWithTlsAndToken) {
  const Pki& pki = TestPki();
  const std::string dir = MakeTempDir("sec_train");
  ProcessGroup group;
  Pserver ps = StartPserver(&group, dir, TlsFlags(pki));
  ASSERT_GT(ps.pid, 0);
  std::vector<std::string> tr = {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0",
                                 "--dump_params=" + dir + "/params"};
  for (const auto& f : JobFlags(ps.endpoint)) tr.push_back(f);
  for (const auto& f : TlsFlags(pki)) tr.push_back(f);
  auto trainer = group.Start(tr, dir + "/trainer.log");
  ASSERT_TRUE(trainer.ok());
  auto st = group.Wait(*trainer, absl::Seconds(90));
  ASSERT_TRUE(st.ok()) << st.status() << "\n" << ReadAllOf(dir + "/trainer.log");
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << ReadAllOf(dir + "/trainer.log") << ReadAllOf(ps.log);
  auto pst = group.Wait(ps.pid, absl::Seconds(30));
  ASSERT_TRUE(pst.ok()) << pst.status() << "\n" << ReadAllOf(ps.log);
  EXPECT_TRUE(WIFEXITED(*pst) && WEXITSTATUS(*pst) == 0) << ReadAllOf(ps.log);
  const std::string ps_log = ReadAllOf(ps.log);
  EXPECT_NE(ps_log.find("mutual TLS, job token required"), std::string::npos) << ps_log;
  EXPECT_NE(ps_log.find("steps=8 "), std::string::npos) << ps_log;  // 512 / 64
  EXPECT_NE(ps_log.find("unauthenticated=0"), std::string::npos) << ps_log;
  EXPECT_EQ(ps_log.find(kToken), std::string::npos);
  EXPECT_EQ(ReadAllOf(dir + "/trainer.log").find(kToken), std::string::npos);
  EXPECT_FALSE(ReadAllOf(dir + "/params").empty());
}

// ------------------------------------------------------------------------------------------
// (b) Clients without a certificate, with one from another CA, or in plaintext are refused.

TEST(SecurityTest, RefusesClientsWithoutAValidCertificate) {
  const Pki& pki = TestPki();
  const std::string dir = MakeTempDir("sec_certs");
  ProcessGroup group;
  Pserver ps = StartPserver(&group, dir, TlsFlags(pki));
  ASSERT_GT(ps.pid, 0);
  Params p = ParamsOf(JobFlags(ps.endpoint));
  ASSERT_FALSE(p.params.empty());
  const std::string& param = p.params[0];

  // The job's own certificate works (waits, bounded, for the pserver to start).
  Variable good_value;
  absl::Status good = Client(ps.endpoint, Security(pki.cert, pki.key, pki.ca, kToken), true)
                          ->GetVariable(Meta(), param, &good_value);
  ASSERT_TRUE(good.ok()) << good << "\n" << ReadAllOf(ps.log);

  struct Case {
    const char* what;
    RpcSecurity security;
  };
  std::vector<Case> cases = {
      {"TLS client without a certificate", Security("", "", pki.ca, kToken)},
      {"client certificate of another CA", Security(pki.other_cert, pki.other_key, pki.ca, kToken)},
      {"plaintext client", Security("", "", "", kToken)},
      {"client that does not trust the pserver's CA",
       Security(pki.cert, pki.key, pki.other_ca, kToken)},
  };
  for (auto& c : cases) {
    Variable out;
    absl::Status s = Client(ps.endpoint, c.security)->GetVariable(Meta(), param, &out);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << c.what << ": " << s;
    EXPECT_NE(s.message().find(ps.endpoint), std::string::npos) << s;
  }
  // None of them reached the token check (refused at the handshake).
  std::string scrape = HttpGet(ps.metrics_port, "/metrics");
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Sample(scrape, "tessera_rpc_unauthenticated_total") < 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    scrape = HttpGet(ps.metrics_port, "/metrics");
  }
  EXPECT_EQ(Sample(scrape, "tessera_rpc_unauthenticated_total"), 0) << scrape;
}

// ------------------------------------------------------------------------------------------
// (c) A wrong or missing job token gets UNAUTHENTICATED, is counted, and changes nothing.

TEST(SecurityTest, WrongOrMissingTokenIsRefusedCountedAndChangesNothing) {
  const Pki& pki = TestPki();
  const std::string dir = MakeTempDir("sec_token");
  ProcessGroup group;
  // Async: every accepted gradient is applied at once, so a refused one would show.
  std::vector<std::string> flags = TlsFlags(pki);
  flags.push_back("--sync_mode=false");
  flags.push_back("--slice_var_up=false");
  Pserver ps = StartPserver(&group, dir, flags);
  ASSERT_GT(ps.pid, 0);
  std::vector<std::string> job = JobFlags(ps.endpoint);
  job.push_back("--sync_mode=false");
  job.push_back("--slice_var_up=false");
  Params p = ParamsOf(job);
  ASSERT_FALSE(p.params.empty());

  auto good = Client(ps.endpoint, Security(pki.cert, pki.key, pki.ca, kToken), true);
  auto get_all = [&](std::map<std::string, Variable>* out) {
    for (const auto& name : p.params) {
      absl::Status s = good->GetVariable(Meta(), name, &(*out)[name]);
      ASSERT_TRUE(s.ok()) << s << "\n" << ReadAllOf(ps.log);
    }
  };
  std::map<std::string, Variable> before;
  get_all(&before);

  // Gradients of ones: large enough to move every parameter.
  std::map<std::string, Variable> grads;
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Tensor& w = before[p.params[i]].Get<Tensor>();
    Tensor g(w.dtype(), w.shape());
    float* d = g.data<float>();
    for (int64_t k = 0; k < g.numel(); ++k) d[k] = 1.0f;
    *grads[p.grads[i]].GetMutable<Tensor>() = g;
  }

  const std::string wrong_token = "not-the-job-token";
  int refused = 0;
  for (const std::string& token : {wrong_token, std::string()}) {
    auto bad = Client(ps.endpoint, Security(pki.cert, pki.key, pki.ca, token));
    for (const auto& [name, g] : grads) {
      absl::Status s = bad->SendVariable(Meta(), name, g);
      EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
      EXPECT_EQ(s.message().find(kToken), std::string::npos) << s;
      EXPECT_EQ(s.message().find(wrong_token), std::string::npos) << s;
      EXPECT_NE(s.message().find(token.empty() ? "no job token" : "wrong job token"),
                std::string::npos)
          << s;
      ++refused;
    }
    Variable out;
    absl::Status s = bad->GetVariable(Meta(), p.params[0], &out);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
    ++refused;
    s = bad->Barrier(Meta(), SEND_BARRIER);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
    ++refused;
  }

  std::map<std::string, Variable> after;
  get_all(&after);
  for (const auto& name : p.params) {
    EXPECT_EQ(Bytes(before[name]), Bytes(after[name])) << name << " changed";
  }

  // The pserver counted every refusal (published every 500 ms).
  absl::Time deadline = absl::Now() + absl::Seconds(15);
  std::string scrape;
  while (true) {
    scrape = HttpGet(ps.metrics_port, "/metrics");
    if (Sample(scrape, "tessera_rpc_unauthenticated_total") >= refused) break;
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Sample(scrape, "tessera_rpc_unauthenticated_total"), refused) << scrape;
  EXPECT_EQ(scrape.find(kToken), std::string::npos);

  // Control: the same gradients with the right token do change the parameters.
  for (const auto& [name, g] : grads) {
    absl::Status s = good->SendVariable(Meta(), name, g);
    ASSERT_TRUE(s.ok()) << s;
  }
  std::map<std::string, Variable> updated;
  get_all(&updated);
  int changed = 0;
  for (const auto& name : p.params) changed += Bytes(before[name]) != Bytes(updated[name]);
  EXPECT_EQ(changed, static_cast<int>(p.params.size()));
}

// ------------------------------------------------------------------------------------------
// (c2) Crafted byte ranges. A GetVariable{offset: 2^63-1, length: 16} used to overflow the
// range check and crash a TLS pserver (a plaintext one dropped the connection). Every crafted
// range is refused with INVALID_ARGUMENT naming it, and the pserver serves on, unchanged.

// One raw GetVariable (what a hand-written peer sends): the gRPC status it gets.
grpc::Status RawGet(const std::string& endpoint, const RpcSecurity& security,
                    const std::string& name, int64_t offset, int64_t length) {
  GetRequest req;
  req.mutable_header()->set_job_id("sec");
  req.set_name(name);
  req.set_offset(offset);
  req.set_length(length);
  grpc::GenericStub stub(grpc::CreateChannel(endpoint, MakeChannelCredentials(security)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!security.job_token.empty()) ctx.AddMetadata(kJobTokenMetadataKey, security.job_token);
  grpc::ByteBuffer request = SerializeProto(req), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/tessera.PServer/GetVariable", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    ctx.TryCancel();
    done.WaitForNotification();
  }
  return status;
}

TEST(SecurityTest, CraftedByteRangesAreRefusedOverTlsAndPlaintext) {
  const Pki& pki = TestPki();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (bool tls : {true, false}) {
    SCOPED_TRACE(tls ? "TLS" : "plaintext");
    const std::string dir = MakeTempDir(tls ? "sec_range_tls" : "sec_range_plain");
    ProcessGroup group;
    Pserver ps = StartPserver(&group, dir, tls ? TlsFlags(pki) : std::vector<std::string>{});
    ASSERT_GT(ps.pid, 0);
    Params p = ParamsOf(JobFlags(ps.endpoint));
    ASSERT_FALSE(p.params.empty());
    const RpcSecurity security =
        tls ? Security(pki.cert, pki.key, pki.ca, kToken) : RpcSecurity();
    auto good = Client(ps.endpoint, security, /*wait_for_ready=*/true);
    Variable before;
    absl::Status s = good->GetVariable(Meta(), p.params[0], &before);
    ASSERT_TRUE(s.ok()) << s << "\n" << ReadAllOf(ps.log);
    const int64_t total = static_cast<int64_t>(before.Get<Tensor>().nbytes());

    struct Range {
      int64_t offset, length;
    };
    for (Range r : {Range{kMax, 16}, Range{kMax, 0}, Range{16, kMax}, Range{kMax, kMax},
                    Range{kMin, 16}, Range{-1, 0}, Range{0, -1}, Range{total + 1, 0},
                    Range{total - 4, 8}}) {
      grpc::Status st = RawGet(ps.endpoint, security, p.params[0], r.offset, r.length);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << r.offset << " +" << r.length << ": " << st.error_message();
      EXPECT_NE(st.error_message().find(absl::StrCat("byte range [", r.offset)),
                std::string::npos)
          << st.error_message();
      ASSERT_TRUE(group.Running(ps.pid)) << "pserver died on [" << r.offset << ", +" << r.length
                                         << ")\n"
                                         << ReadAllOf(ps.log);
    }
    // A range inside is served, and the pserver's parameters are what they were.
    grpc::Status inside = RawGet(ps.endpoint, security, p.params[0], 0, 4);
    EXPECT_TRUE(inside.ok()) << inside.error_message();
    Variable after;
    s = good->GetVariable(Meta(), p.params[0], &after);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(Bytes(before), Bytes(after));
  }
}

// ------------------------------------------------------------------------------------------
// (c3) Least authority without a token: a Checkpoint request names only "ckpt-<step>", and the
// pserver writes it under its own --checkpoint_dir, or nowhere when it has none.

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  auto list = io::PosixFileSystem::Default()->ListDir(dir);
  if (list.ok()) names = *list;
  std::sort(names.begin(), names.end());
  return names;
}

TEST(SecurityTest, UnauthenticatedCheckpointWritesOnlyUnderCheckpointDir) {
  const std::string dir = MakeTempDir("sec_ckpt");
  const std::string victim = dir + "/victim", own = dir + "/own";
  io::FileSystem* fs = io::PosixFileSystem::Default();
  ASSERT_TRUE(fs->CreateDirs(victim + "/" + io::CheckpointDirName(1)).ok());
  ASSERT_TRUE(fs->CreateDirs(own + "/" + io::CheckpointDirName(1)).ok());
  ASSERT_TRUE(io::WriteFileAtomic(fs, victim + "/precious", "keep me").ok());

  for (bool has_dir : {false, true}) {
    SCOPED_TRACE(has_dir ? "with --checkpoint_dir" : "without --checkpoint_dir");
    ProcessGroup group;
    Pserver ps = StartPserver(&group, dir,
                              has_dir ? std::vector<std::string>{"--checkpoint_dir=" + own}
                                      : std::vector<std::string>{});
    ASSERT_GT(ps.pid, 0);
    auto peer = Client(ps.endpoint, RpcSecurity(), /*wait_for_ready=*/true);  // no token
    // A path of the peer's choosing is refused whatever it looks like.
    for (const std::string& target :
         {victim, victim + "/" + io::CheckpointDirName(1), std::string("ckpt-1/../../victim"),
          std::string("../victim"), std::string("ckpt-")}) {
      absl::Status s = peer->Checkpoint(Meta(), target);
      ASSERT_FALSE(s.ok()) << target;
      EXPECT_TRUE(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) << s;
      EXPECT_NE(s.message().find(has_dir ? "not a ckpt-<step> name" : "no --checkpoint_dir"),
                std::string::npos)
          << s;
    }
    absl::Status s = peer->Checkpoint(Meta(), io::CheckpointDirName(1));
    if (has_dir) {
      // The one thing a peer may do: save this pserver's shard into its own directory.
      EXPECT_TRUE(s.ok()) << s << "\n" << ReadAllOf(ps.log);
      EXPECT_FALSE(ListDir(own + "/" + io::CheckpointDirName(1)).empty());
    } else {
      EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
      EXPECT_NE(s.message().find("no --checkpoint_dir"), std::string::npos) << s;
    }
    EXPECT_TRUE(group.Running(ps.pid)) << ReadAllOf(ps.log);
  }
  // Nothing was written outside the pserver's own directory.
  EXPECT_EQ(ListDir(victim), (std::vector<std::string>{io::CheckpointDirName(1), "precious"}));
  EXPECT_TRUE(ListDir(victim + "/" + io::CheckpointDirName(1)).empty());
  EXPECT_EQ(*fs->ReadFile(victim + "/precious"), "keep me");
}

// ------------------------------------------------------------------------------------------
// (c4) A Prefetch flood of fresh ids (what any peer may send without a token) meets the row
// budget: new ids are refused and counted, held rows stay, and the pserver's memory stops
// growing.

TEST(SecurityTest, RowBudgetHoldsUnderAPrefetchFlood) {
  constexpr int64_t kBudget = 20000;
  const std::string dir = MakeTempDir("sec_flood");
  ProcessGroup group;
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok());
  const std::string endpoint = (*eps)[0];
  const int metrics_port = PortOf((*eps)[1]);
  std::vector<std::string> job = {"--pservers=" + endpoint, "--trainers=1", "--example=ctr",
                                  "--job_id=sec", "--barrier_timeout_s=120",
                                  "--vocab_per_slot=1000", "--num_examples=512"};
  std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                   "--current_endpoint=" + endpoint,
                                   absl::StrCat("--metrics_port=", metrics_port),
                                   absl::StrCat("--table_max_rows=", kBudget)};
  args.insert(args.end(), job.begin(), job.end());
  const std::string log = dir + "/pserver.log";
  auto pid = group.Start(args, log);
  ASSERT_TRUE(pid.ok()) << pid.status();

  // The tables this pserver holds, from the same transpilation the daemon does.
  auto t = TranspileFlags(job);
  ASSERT_TRUE(t.ok()) << t.status();
  auto program = t->GetPserverProgram(endpoint);
  ASSERT_TRUE(program.ok()) << program.status();
  std::string table;
  for (const auto& op : program->blocks(0).ops()) {
    if (op.type() != "sparse_table") continue;
    // A table of a group (a slot's tables, the same ids) is served as the group's table.
    const std::string group = GetStringAttr(op, "group", "");
    table = group.empty() ? GetStringAttr(op, "table", "") : group;
  }
  ASSERT_FALSE(table.empty()) << "the ctr model has no distributed table";

  auto peer = Client(endpoint, RpcSecurity(), /*wait_for_ready=*/true);  // no token
  std::vector<int64_t> warm(1000);
  for (int i = 0; i < 1000; ++i) warm[i] = i;
  Tensor rows;
  absl::Status s = peer->Prefetch(Meta(), table, warm, &rows);
  ASSERT_TRUE(s.ok()) << s << "\n" << ReadAllOf(log);
  const Tensor held = rows;
  auto rss_before = ResidentKiB(*pid);
  ASSERT_TRUE(rss_before.ok());

  // 200 requests of 10,000 fresh random ids: 2,000,000 rows without a budget.
  uint64_t x = 88172645463325252ull;
  int refused = 0;
  for (int r = 0; r < 200; ++r) {
    std::vector<int64_t> ids(10000);
    for (auto& id : ids) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      id = static_cast<int64_t>(x);
    }
    s = peer->Prefetch(Meta(), table, ids, &rows);
    if (!s.ok()) {
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_NE(s.message().find(absl::StrCat("budget of ", kBudget, " rows")), std::string::npos)
          << s;
      ++refused;
    }
  }
  EXPECT_GE(refused, 190);
  ASSERT_TRUE(group.Running(*pid)) << ReadAllOf(log);
  auto rss_after = ResidentKiB(*pid);
  ASSERT_TRUE(rss_after.ok());
  // 2,000,000 rows would take well over 100 MiB; the budget's 20,000 about 2 MiB.
  EXPECT_LT(*rss_after - *rss_before, 48 * 1024)
      << "RSS grew from " << *rss_before << " to " << *rss_after << " KiB";

  // The rows held before the flood are served unchanged, and the refusals are counted.
  s = peer->Prefetch(Meta(), table, warm, &rows);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(rows.raw_data(), held.raw_data(), held.nbytes()), 0);
  absl::Time deadline = absl::Now() + absl::Seconds(15);
  std::string scrape;
  while (absl::Now() < deadline) {
    scrape = HttpGet(metrics_port, "/metrics");
    if (Sample(scrape, "tessera_pserver_table_refused_ids_total") >= refused) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GE(Sample(scrape, "tessera_pserver_table_refused_ids_total"), refused) << scrape;
  // Each table of the group flooded holds the budget's rows (they share the ids).
  const int64_t members = std::count(table.begin(), table.end(), '+') + 1;
  EXPECT_EQ(Sample(scrape, "tessera_pserver_table_rows"), members * kBudget) << scrape;
}

// ------------------------------------------------------------------------------------------
// (d) Incomplete or conflicting security flags: one clear line, before anything starts.

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs a daemon to its end; a daemon still running after `timeout` is a failure (and killed).
RunResult RunDaemon(const std::string& binary, const std::vector<std::string>& flags,
                    absl::Duration timeout = absl::Seconds(30)) {
  const std::string dir = MakeTempDir("sec_flags");
  ProcessGroup group;
  std::vector<std::string> args = {RunfilePath(binary)};
  args.insert(args.end(), flags.begin(), flags.end());
  RunResult r;
  auto pid = group.Start(args, dir + "/out.log");
  EXPECT_TRUE(pid.ok());
  if (!pid.ok()) return r;
  auto st = group.Wait(*pid, timeout);
  EXPECT_TRUE(st.ok()) << binary << " still running after " << timeout << ": " << st.status();
  if (st.ok() && WIFEXITED(*st)) r.exit_code = WEXITSTATUS(*st);
  r.output = ReadAllOf(dir + "/out.log");
  return r;
}

// ------------------------------------------------------------------------------------------
// (e) Fast failures naming the cause: a trainer that cannot reach a pserver (TLS on one side
// only, a host that does not resolve, nothing listening) ends within --connect_timeout_s + 5 s
// saying why; one whose pserver is killed mid-training ends within seconds, naming it.

TEST(SecurityTest, UnreachablePserversEndTrainersWithinTheConnectTimeoutNamingTheCause) {
  const Pki& pki = TestPki();
  const std::string dir = MakeTempDir("sec_connect");
  ProcessGroup group;
  Pserver tls = StartPserver(&group, dir, TlsFlags(pki));
  ASSERT_GT(tls.pid, 0);
  Pserver plain = StartPserver(&group, MakeTempDir("sec_connect_plain"), {});
  ASSERT_GT(plain.pid, 0);
  for (const Pserver* ps : {&tls, &plain}) {  // both serve before the trainers start
    auto c = Client(ps->endpoint,
                    ps == &tls ? Security(pki.cert, pki.key, pki.ca, kToken) : RpcSecurity(),
                    /*wait_for_ready=*/true);
    Variable v;
    (void)c->GetVariable(Meta(), "no-such-variable", &v);
  }
  auto eps = FreeEndpoints(1);  // nothing listens there
  ASSERT_TRUE(eps.ok());
  const absl::Duration bound = absl::Seconds(3 + 5);
  auto trainer = [&](const std::string& pserver, std::vector<std::string> extra) {
    std::vector<std::string> flags = JobFlags(pserver);
    flags.push_back("--connect_timeout_s=3");
    flags.insert(flags.end(), extra.begin(), extra.end());
    return RunDaemon("trainer/tessera_trainer", flags, bound);
  };
  struct Case {
    const char* what;
    RunResult r;
    std::vector<std::string> expect;
  };
  std::vector<Case> cases;
  cases.push_back({"plaintext trainer, TLS pserver", trainer(tls.endpoint, {}),
                   {tls.endpoint, "not reachable", "TLS"}});
  cases.push_back({"TLS trainer, plaintext pserver", trainer(plain.endpoint, TlsFlags(pki)),
                   {plain.endpoint, "not reachable", "TLS"}});
  cases.push_back(
      {"unresolvable host",
       trainer("no-such-host.invalid:6170", {}),
       {"no-such-host.invalid:6170", "cannot resolve the host", "DNS", "--connect_timeout_s=3"}});
  cases.push_back({"nothing listening", trainer((*eps)[0], {}),
                   {(*eps)[0], "not reachable"}});
  for (const Case& c : cases) {
    EXPECT_EQ(c.r.exit_code, 1) << c.what << ": " << c.r.output;
    for (const std::string& want : c.expect) {
      EXPECT_NE(c.r.output.find(want), std::string::npos)
          << c.what << ": no '" << want << "' in:\n" << c.r.output;
    }
  }
  EXPECT_TRUE(group.Running(tls.pid) && group.Running(plain.pid));
}

TEST(SecurityTest, PserverThatNoTrainerReachesFailsAfterTheStartupTimeout) {
  const std::string dir = MakeTempDir("sec_startup");
  ProcessGroup group;
  Pserver ps = StartPserver(&group, dir, {"--startup_timeout_s=2"});
  ASSERT_GT(ps.pid, 0);
  auto st = group.Wait(ps.pid, absl::Seconds(2 + 10));
  ASSERT_TRUE(st.ok()) << "pserver still waiting for trainers:\n" << ReadAllOf(ps.log);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << ReadAllOf(ps.log);
  EXPECT_NE(ReadAllOf(ps.log).find("no trainer reached it within --startup_timeout_s=2"),
            std::string::npos)
      << ReadAllOf(ps.log);
}

// A trainer (with `trainer_flags`) trains against a pserver until the pserver gets `signal`;
// the trainer must then exit 1 within `bound`, naming the pserver.
void ExpectTrainerEndsSoonAfterItsPserverGets(int signal, const std::string& name,
                                              const std::vector<std::string>& trainer_flags,
                                              absl::Duration bound) {
  const std::string dir = MakeTempDir(name);
  ProcessGroup group;
  Pserver ps = StartPserver(&group, dir, {"--epochs=100000"});
  ASSERT_GT(ps.pid, 0);
  std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer")};
  for (const auto& f : JobFlags(ps.endpoint)) args.push_back(f);
  args.push_back("--epochs=100000");  // trains until the pserver goes
  args.insert(args.end(), trainer_flags.begin(), trainer_flags.end());
  const std::string log = dir + "/trainer.log";
  auto trainer = group.Start(args, log);
  ASSERT_TRUE(trainer.ok());
  // Kill the pserver once steps are being made.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline &&
         Sample(HttpGet(ps.metrics_port, "/metrics"), "tessera_pserver_steps_total") < 5) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(Sample(HttpGet(ps.metrics_port, "/metrics"), "tessera_pserver_steps_total"), 5)
      << ReadAllOf(log);
  group.Kill(ps.pid, signal);
  // Not the 30 s RPC deadline of JobFlags: the trainer stops waiting for a pserver that is gone
  // (or frozen: it never answers, but its socket stays open).
  auto st = group.Wait(*trainer, bound);
  ASSERT_TRUE(st.ok()) << "trainer still running " << bound << " after its pserver got signal "
                       << signal << ":\n"
                       << ReadAllOf(log);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << ReadAllOf(log);
  EXPECT_NE(ReadAllOf(log).find("pserver " + ps.endpoint), std::string::npos) << ReadAllOf(log);
}

TEST(SecurityTest, KilledPserverEndsItsTrainerWithinSecondsNamingIt) {
  // Within --connect_timeout_s (10 s) + 5 s.
  ExpectTrainerEndsSoonAfterItsPserverGets(SIGKILL, "sec_killed", {}, absl::Seconds(15));
}

TEST(SecurityTest, FrozenPserverEndsItsTrainerWithinSecondsOfTheKeepalive) {
  // SIGSTOP: the kernel still holds the connection open, but no ping is answered. Within a few
  // --keepalive_s (about 8 s here at 1 s, the 2 s ABORT it tries to send included) plus a
  // margin, not the 30 s RPC deadline.
  ExpectTrainerEndsSoonAfterItsPserverGets(SIGSTOP, "sec_frozen", {"--keepalive_s=1"},
                                           absl::Seconds(15));
}

TEST(SecurityTest, MismatchedFlagsGiveOneClearError) {
  const Pki& pki = TestPki();
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> base = JobFlags((*eps)[0]);
  base.push_back("--current_endpoint=" + (*eps)[0]);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = base;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  auto one_line = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n') == 1; };

  RunResult r = RunDaemon("pserver/tessera_pserver", with({"--tls_cert=" + pki.cert}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tls_key is not set"), std::string::npos) << r.output;
  EXPECT_TRUE(one_line(r.output)) << r.output;

  r = RunDaemon("pserver/tessera_pserver",
                with({"--tls_cert=" + pki.cert, "--tls_key=" + pki.key}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tls_ca is not set"), std::string::npos) << r.output;

  std::vector<std::string> trainer = base;
  trainer.pop_back();  // no --current_endpoint
  trainer.push_back("--tls_key=" + pki.key);
  trainer.push_back("--tls_ca=" + pki.ca);
  r = RunDaemon("trainer/tessera_trainer", trainer);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tls_cert is not set"), std::string::npos) << r.output;
  EXPECT_TRUE(one_line(r.output)) << r.output;

  r = RunDaemon("pserver/tessera_pserver",
                with({"--job_token=x", "--job_token_file=" + pki.dir + "/token"}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--job_token and --job_token_file are both set"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(kToken), std::string::npos);

  // Unreadable files: the message names the setting and the file; a start-time failure, 2.
  const std::string missing = pki.dir + "/no-such.key";
  r = RunDaemon("pserver/tessera_pserver",
                with({"--tls_cert=" + pki.cert, "--tls_key=" + missing, "--tls_ca=" + pki.ca}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--tls_key file '" + missing + "'"), std::string::npos) << r.output;
  EXPECT_TRUE(one_line(r.output)) << r.output;

  r = RunDaemon("trainer/tessera_trainer",
                {"--pservers=" + (*eps)[0], "--trainers=1", "--example=mlp_regression",
                 "--job_token_file=" + missing});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--job_token_file file '" + missing + "'"), std::string::npos)
      << r.output;

  // A binary token (gRPC aborted on it in a metadata value): refused at start by position,
  // its bytes never printed.
  const std::string binary_token = pki.dir + "/binary_token";
  const std::string secret = std::string("s3cr") + '\x01' + "t\xff-bytes";
  WriteFile(binary_token, secret + "\n");
  for (const char* daemon : {"trainer/tessera_trainer", "pserver/tessera_pserver"}) {
    std::vector<std::string> flags = with({"--job_token_file=" + binary_token});
    r = RunDaemon(daemon, flags);
    EXPECT_EQ(r.exit_code, 2) << daemon << ": " << r.output;
    EXPECT_NE(r.output.find("--job_token_file '" + binary_token +
                            "': byte 5 of the token is not printable ASCII"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("s3cr"), std::string::npos) << r.output;
    EXPECT_TRUE(one_line(r.output)) << r.output;
  }
  r = RunDaemon("pserver/tessera_pserver", with({std::string("--job_token=a\tb")}));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--job_token: byte 2"), std::string::npos) << r.output;

  // A job that would train no step: refused at start, by both flags and data.
  r = RunDaemon("trainer/tessera_trainer",
                {"--pservers=" + (*eps)[0], "--trainers=2", "--trainer_id=1",
                 "--example=mlp_regression", "--batch_size=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--batch_size=1 is smaller than --trainers=2"), std::string::npos)
      << r.output;
  for (const std::vector<std::string>& zero :
       {std::vector<std::string>{"--trainers=2", "--num_examples=1", "--batch_size=2"},
        std::vector<std::string>{"--trainers=1", "--epochs=0"}}) {
    std::vector<std::string> flags = {"--pservers=" + (*eps)[0], "--example=mlp_regression"};
    flags.insert(flags.end(), zero.begin(), zero.end());
    r = RunDaemon("trainer/tessera_trainer", flags);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("this job would train 0 steps"), std::string::npos) << r.output;
  }

  // Unreadable training data and a port in use: start-time failures too.
  r = RunDaemon("trainer/tessera_trainer",
                {"--pservers=" + (*eps)[0], "--trainers=1", "--example=ctr",
                 "--train_data=" + pki.dir + "/no-such-data.txt"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(pki.dir + "/no-such-data.txt"), std::string::npos) << r.output;
  {
    ProcessGroup group;
    Pserver first = StartPserver(&group, MakeTempDir("sec_port"), {});
    ASSERT_GT(first.pid, 0);
    auto ready = Client(first.endpoint, RpcSecurity(), /*wait_for_ready=*/true);
    Variable v;
    (void)ready->GetVariable(Meta(), "no-such-variable", &v);  // returns once it serves
    std::vector<std::string> second = JobFlags(first.endpoint);
    second.push_back("--current_endpoint=" + first.endpoint);
    r = RunDaemon("pserver/tessera_pserver", second);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("cannot listen on " + first.endpoint), std::string::npos) << r.output;
  }

  // A file that is not a certificate: the pserver cannot start, and says so.
  r = RunDaemon("pserver/tessera_pserver", with({"--tls_cert=" + pki.dir + "/token",
                                                 "--tls_key=" + pki.key, "--tls_ca=" + pki.ca}));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--tls_cert"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------------------------------
// Daemons listen only on the configured address.

// Local IPv4 addresses ("0100007F" style, as in /proc/net/tcp) of LISTEN sockets on `port`.
std::vector<std::string> ListeningAddresses(const std::string& table, int port) {
  std::vector<std::string> out;
  std::istringstream in(ReadAllOf(table));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 4 || f[3] != "0A") continue;  // 0A = LISTEN
    auto colon = f[1].rfind(':');
    int p = static_cast<int>(std::strtol(f[1].substr(colon + 1).c_str(), nullptr, 16));
    if (p == port) out.push_back(f[1].substr(0, colon));
  }
  return out;
}

// Non-loopback IPv4 addresses of this machine.
std::vector<std::string> OtherLocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    if (!absl::StartsWith(buf, "127.")) out.push_back(buf);
  }
  ::freeifaddrs(ifs);
  return out;
}

// errno of a blocking connect() to host:port (0 on success), bounded by a 5 s send timeout.
int ConnectErrno(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  int err = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

TEST(SecurityTest, PserverListensOnlyOnItsConfiguredAddress) {
  const std::string dir = MakeTempDir("sec_bind");
  ProcessGroup group;
  Pserver ps = StartPserver(&group, dir, {});
  ASSERT_GT(ps.pid, 0);
  Params p = ParamsOf(JobFlags(ps.endpoint));
  ASSERT_FALSE(p.params.empty());
  Variable v;
  absl::Status up = Client(ps.endpoint, RpcSecurity(), true)->GetVariable(Meta(), p.params[0], &v);
  ASSERT_TRUE(up.ok()) << up << "\n" << ReadAllOf(ps.log);
  const int port = PortOf(ps.endpoint);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (HttpGet(ps.metrics_port, "/metrics").empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }

  // Every listening socket on the gRPC and metrics ports is bound to 127.0.0.1: "0100007F" in
  // /proc/net/tcp, or its IPv4-mapped form in /proc/net/tcp6 (gRPC listens on dual-stack
  // sockets); never a wildcard address.
  for (int listened : {port, ps.metrics_port}) {
    std::vector<std::string> all = ListeningAddresses("/proc/net/tcp", listened);
    for (const auto& a : ListeningAddresses("/proc/net/tcp6", listened)) all.push_back(a);
    ASSERT_FALSE(all.empty()) << "nothing listens on port " << listened;
    for (const auto& a : all) {
      EXPECT_TRUE(a == "0100007F" || a == "0000000000000000FFFF00000100007F")
          << "port " << listened << " is bound to " << a;
    }
  }
  // And other addresses of this machine do not reach it.
  std::vector<std::string> others = OtherLocalAddresses();
  if (others.empty()) {
    std::cout << "no non-loopback IPv4 address on this machine: reachability check skipped "
                 "(the /proc/net/tcp check above still applies)"
              << std::endl;
  }
  for (const auto& host : others) {
    EXPECT_EQ(ConnectErrno(host, port), ECONNREFUSED) << host << ":" << port;
    EXPECT_EQ(ConnectErrno(host, ps.metrics_port), ECONNREFUSED) << host << ":" << ps.metrics_port;
  }
}

// ------------------------------------------------------------------------------------------
// The collective rendezvous store (plain TCP) checks the job token too.

TEST(SecurityTest, RendezvousStoreRequiresTheJobToken) {
  auto server = collective::TcpStoreServer::Start("127.0.0.1:0", kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string ep = (*server)->endpoint();

  auto good = collective::TcpStore::Connect(ep, absl::Seconds(5), kToken);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("k", "v").ok());

  auto wrong = collective::TcpStore::Connect(ep, absl::Seconds(5), "not-the-token");
  EXPECT_TRUE(absl::IsUnauthenticated(wrong.status())) << wrong.status();
  EXPECT_EQ(wrong.status().message().find(kToken), std::string::npos);
  EXPECT_EQ(wrong.status().message().find("not-the-token"), std::string::npos);

  auto none = collective::TcpStore::Connect(ep, absl::Seconds(5));
  ASSERT_TRUE(none.ok()) << none.status();  // connecting reveals nothing
  auto got = (*none)->Get("k", absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnauthenticated(got.status())) << got.status();
  auto none2 = collective::TcpStore::Connect(ep, absl::Seconds(5));
  ASSERT_TRUE(none2.ok());
  EXPECT_TRUE(absl::IsUnauthenticated((*none2)->Set("k", "overwritten")));
  EXPECT_EQ((*server)->refused_connections(), 3);

  auto value = (*good)->Get("k", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");  // nothing stored by the refused clients

  // A store without a token accepts clients with or without one.
  auto open = collective::TcpStoreServer::Start("127.0.0.1:0");
  ASSERT_TRUE(open.ok());
  auto with_token = collective::TcpStore::Connect((*open)->endpoint(), absl::Seconds(5), kToken);
  ASSERT_TRUE(with_token.ok()) << with_token.status();
  EXPECT_TRUE((*with_token)->Set("a", "b").ok());
}

// Collective mode: trainer 0's rendezvous store lets in only trainers with the job's token.
TEST(SecurityTest, CollectiveTrainersNeedTheJobToken) {
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok());
  const std::string dir = MakeTempDir("sec_collective");
  auto run = [&](const std::string& token1, std::vector<RunResult>* out) {
    ProcessGroup group;
    std::vector<pid_t> pids;
    for (int k = 0; k < 2; ++k) {
      std::vector<std::string> args = {
          RunfilePath("trainer/tessera_trainer"),
          "--mode=collective",
          "--trainers=2",
          absl::StrCat("--trainer_id=", k),
          absl::StrCat("--trainer_endpoints=", (*eps)[0], ",", (*eps)[1]),
          "--example=mlp_regression",
          "--num_examples=256",
          "--num_test_examples=64",
          "--batch_size=64",
          "--barrier_timeout_s=5",
          "--log_every_steps=0",
          "--job_token=" + (k == 0 ? std::string(kToken) : token1)};
      auto pid = group.Start(args, absl::StrCat(dir, "/", token1, ".", k, ".log"));
      ASSERT_TRUE(pid.ok());
      pids.push_back(*pid);
    }
    for (int k = 0; k < 2; ++k) {
      auto st = group.Wait(pids[k], absl::Seconds(60));
      ASSERT_TRUE(st.ok()) << st.status();
      RunResult r;
      r.exit_code = WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
      r.output = ReadAllOf(absl::StrCat(dir, "/", token1, ".", k, ".log"));
      out->push_back(r);
    }
  };
  std::vector<RunResult> same;
  run(kToken, &same);
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(same[0].exit_code, 0) << same[0].output;
  EXPECT_EQ(same[1].exit_code, 0) << same[1].output;

  std::vector<RunResult> wrong;
  run("another-job", &wrong);
  ASSERT_EQ(wrong.size(), 2u);
  EXPECT_EQ(wrong[1].exit_code, 1) << wrong[1].output;
  EXPECT_NE(wrong[1].output.find("refused this rank's job token"), std::string::npos)
      << wrong[1].output;
  EXPECT_EQ(wrong[1].output.find(kToken), std::string::npos);
  EXPECT_NE(wrong[0].exit_code, 0) << wrong[0].output;  // rank 1 never joined
}

// LoadRpcSecurity: all three TLS files or none, and the token from a file (first line).
TEST(SecurityTest, LoadRpcSecurityChecksItsInputs) {
  const Pki& pki = TestPki();
  auto s = LoadRpcSecurity(pki.cert, "", pki.ca, "", "");
  EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
  EXPECT_NE(s.status().message().find("--tls_key"), std::string::npos);
  s = LoadRpcSecurity(pki.cert, pki.key, pki.ca, "", pki.dir + "/token");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->tls());
  EXPECT_EQ(s->job_token, kToken);
  EXPECT_NE(s->key_pem.find("PRIVATE KEY"), std::string::npos);
  s = LoadRpcSecurity("", "", "", "tok", "");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->tls());
  EXPECT_EQ(s->job_token, "tok");
  const std::string empty = pki.dir + "/empty_token";
  WriteFile(empty, "\n");
  s = LoadRpcSecurity("", "", "", "", empty);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(empty), std::string::npos) << s.status();

  EXPECT_TRUE(JobTokenMatches("", "anything"));
  EXPECT_TRUE(JobTokenMatches("abc", "abc"));
  EXPECT_FALSE(JobTokenMatches("abc", "abd"));
  EXPECT_FALSE(JobTokenMatches("abc", "ab"));
  EXPECT_FALSE(JobTokenMatches("abc", "abcabc"));
  EXPECT_FALSE(JobTokenMatches("abc", ""));
}

}  // namespace
}  // namespace tessera
