#include "common/collective/context.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/collective/file_store.h"
#include "common/collective/mpi_session.h"
#include "common/collective/tcp_store.h"

#ifdef TESSERA_WITH_NCCL
#include "common/collective/nccl/nccl_communicator.h"
#endif

namespace tessera {
namespace collective {
namespace {

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1";
}

std::string ThisHostName() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

absl::Status CheckRankSize(int rank, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("collective init: world_size must be >= 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("collective init: rank ", rank,
                                                   " is not in [0, world_size ", world_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

Context::Context() = default;

Context::~Context() {
  // No barrier here (a failing rank must not wait for the others): close, then stop the store.
  world_.reset();
  if (server_ != nullptr) server_->Shutdown();
}

absl::Status Context::Init(InitMethod method, int rank, int world_size, const InitParams& params) {
  if (IsInitialized()) {
    return absl::FailedPreconditionError("collective context is already initialized");
  }
  std::string default_hostname;
  std::shared_ptr<Store> store;
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<MpiSession> mpi;
  int local_rank = params.local_rank;
  switch (method) {
    case InitMethod::kTcp: {
      absl::Status ok = CheckRankSize(rank, world_size);
      if (!ok.ok()) return ok;
      std::string host;
      int port = 0;
      ok = ParseEndpoint(params.endpoint, &host, &port);
      if (!ok.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("collective init (tcp): ", ok.message(), " in InitParams::endpoint"));
      }
      if (port == 0) {
        return absl::InvalidArgumentError(absl::StrCat("collective init (tcp): endpoint '",
                                                       params.endpoint, "' needs a fixed port"));
      }
      if (IsLoopbackHost(host)) default_hostname = "127.0.0.1";
      if (rank == 0) {
        auto started = TcpStoreServer::Start(params.endpoint, params.job_token);
        if (!started.ok()) return started.status();
        server = std::move(*started);
      }
      auto client = TcpStore::Connect(params.endpoint, params.timeout, params.job_token);
      if (!client.ok()) return client.status();
      store = std::move(*client);
      break;
    }
    case InitMethod::kFileSystem: {
      absl::Status ok = CheckRankSize(rank, world_size);
      if (!ok.ok()) return ok;
      auto opened = FileStore::Open(params.path);
      if (!opened.ok()) return opened.status();
      store = std::move(*opened);
      break;
    }
    case InitMethod::kMpi: {
      auto started = MpiSession::Start();
      if (!started.ok()) return started.status();
      mpi = std::move(*started);
      if ((rank >= 0 && rank != mpi->rank()) || (world_size >= 0 && world_size != mpi->size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "collective init (mpi): rank ", rank, " / world_size ", world_size,
            " disagree with MPI's ", mpi->rank(), " / ", mpi->size(), " (pass -1 for both)"));
      }
      rank = mpi->rank();
      world_size = mpi->size();
      if (local_rank < 0) local_rank = mpi->local_rank();
      std::string endpoint;
      if (rank == 0) {
        const std::string host =
            params.mpi_store_host.empty() ? ThisHostName() : params.mpi_store_host;
        auto started_server = TcpStoreServer::Start(absl::StrCat(host, ":0"), params.job_token);
        if (started_server.ok()) {
          server = std::move(*started_server);
          endpoint = server->endpoint();
        }
        // On failure rank 0 broadcasts an empty endpoint so that no rank waits in vain.
        auto sent = mpi->Broadcast(endpoint, 0);
        if (!started_server.ok()) return started_server.status();
        if (!sent.ok()) return sent.status();
      } else {
        auto received = mpi->Broadcast("", 0);
        if (!received.ok()) return received.status();
        endpoint = *received;
        if (endpoint.empty()) {
          return absl::UnavailableError(
              "collective init (mpi): rank 0 could not start the rendezvous store");
        }
      }
      std::string host;
      int port = 0;
      if (ParseEndpoint(endpoint, &host, &port).ok() && IsLoopbackHost(host)) {
        default_hostname = "127.0.0.1";
      }
      auto client = TcpStore::Connect(endpoint, params.timeout, params.job_token);
      if (!client.ok()) return client.status();
      store = std::move(*client);
      break;
    }
  }
  InitParams adjusted = params;
  adjusted.local_rank = local_rank;
  absl::Status ok = InitBackend(std::move(store), rank, world_size, adjusted, default_hostname);
  if (!ok.ok()) return ok;
  server_ = std::move(server);
  mpi_ = std::move(mpi);
  return absl::OkStatus();
}

absl::Status Context::InitWithStore(std::shared_ptr<Store> store, int rank, int world_size,
                                    const InitParams& params) {
  if (IsInitialized()) {
    return absl::FailedPreconditionError("collective context is already initialized");
  }
  absl::Status ok = CheckRankSize(rank, world_size);
  if (!ok.ok()) return ok;
  if (store == nullptr) return absl::InvalidArgumentError("collective init: null store");
  return InitBackend(std::move(store), rank, world_size, params, "");
}

absl::Status Context::InitBackend(std::shared_ptr<Store> store, int rank, int world_size,
                                  const InitParams& params, const std::string& default_hostname) {
  if (params.max_devices_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective init: max_devices_per_node must be >= 1, got ", params.max_devices_per_node));
  }
  if (params.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective init: timeout must be positive, got ", absl::FormatDuration(params.timeout)));
  }
  const int local_rank =
      params.local_rank >= 0 ? params.local_rank : rank % params.max_devices_per_node;
  std::shared_ptr<Store> scoped =
      params.job_id.empty() ? store : std::make_shared<PrefixStore>(params.job_id, store);
  std::unique_ptr<Communicator> world;
  switch (params.backend) {
    case BackendType::kGloo: {
      GlooOptions gloo = params.gloo;
      gloo.timeout = params.timeout;
      if (gloo.hostname.empty() && gloo.interface.empty()) gloo.hostname = default_hostname;
      auto comm = GlooCommunicator::Create(scoped, rank, world_size, gloo);
      if (!comm.ok()) return comm.status();
      world = std::move(*comm);
      break;
    }
    case BackendType::kNccl: {
#ifdef TESSERA_WITH_NCCL
      NcclOptions nccl;
      nccl.device_id =
          params.device_id >= 0 ? params.device_id : local_rank % params.max_devices_per_node;
      nccl.timeout = params.timeout;
      auto comm = NcclCommunicator::Create(scoped, rank, world_size, nccl);
      if (!comm.ok()) return comm.status();
      world = std::move(*comm);
      break;
#else
      return absl::UnimplementedError(
          "collective init: this build has no NCCL backend (rebuild with --config=cuda on a "
          "machine with CUDA and NCCL, or use the gloo backend)");
#endif
    }
    case BackendType::kNone:
      return absl::InvalidArgumentError("collective init: no backend chosen (gloo or nccl)");
  }
  backend_ = params.backend;
  local_rank_ = local_rank;
  max_devices_per_node_ = params.max_devices_per_node;
  device_id_ = params.device_id;
  store_ = std::move(store);
  world_ = std::move(world);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> Context::NewGroup(const std::vector<int>& ranks) {
  if (!IsInitialized()) {
    return absl::FailedPreconditionError("new_group: collective context is not initialized");
  }
  return world_->NewGroup(ranks);
}

absl::Status Context::Shutdown() {
  absl::Status status;
  if (world_ != nullptr && world_->health().ok()) status = world_->Barrier();
  world_.reset();
  if (server_ != nullptr) server_->Shutdown();
  server_.reset();
  store_.reset();
  mpi_.reset();
  backend_ = BackendType::kNone;
  local_rank_ = 0;
  device_id_ = -1;
  return status;
}

}  // namespace collective
}  // namespace tessera
