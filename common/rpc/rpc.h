// Types shared by the pserver RPC client and server interfaces. Neither interface knows about
// gRPC: common/rpc/grpc/ implements them over the network, common/rpc/inproc/ in process.
#ifndef TESSERA_COMMON_RPC_RPC_H_
#define TESSERA_COMMON_RPC_RPC_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/framework/variable.h"
#include "proto/pserver.pb.h"

namespace tessera {

// Carried by every request.
struct RequestMeta {
  std::string job_id;
  int trainer_id = 0;
  int64_t step = 0;
  // On a send barrier (sync mode, streamed data): this trainer has no batch after this step.
  bool last_batch = false;
  // On a gradient (sync mode): the request that carries it ends with its trainer's send
  // barrier, so the pserver leaves applying it to the step's optimize. A gradient that arrives
  // ahead of the barrier (an early send, a dense tensor's chunk calls, the leading parts of a
  // batch cut at the chunk size, a program with separate send_barrier ops) may be applied as
  // soon as every trainer's copy is in. Set by the server from the batch, never on the wire.
  bool barrier_follows = false;
};

// What a released send barrier answers (sync mode, streamed data). Shared by the requests of
// one step to all pservers: any of them may set it.
struct StepReply {
  // Some trainer had no batch after this step: the epoch ends after it for every trainer.
  std::atomic<bool> epoch_end{false};
};

// Describes a received variable (or one chunk of a large dense one) before its bytes are
// written: the server asks the handler where to put them.
struct VariableHeader {
  std::string name;
  VarType type = DENSE_TENSOR;
  DataType dtype = FLOAT32;
  std::vector<int64_t> dims;  // of the whole tensor (dense) or the value (SelectedRows)
  int64_t height = 0;
  int64_t chunk_offset = 0;   // bytes
  int64_t chunk_bytes = 0;    // bytes of payload in this message
  int64_t total_bytes = 0;    // bytes of the whole tensor
  int64_t num_rows = 0;       // SelectedRows: number of row ids
};

using DoneCallback = std::function<void(absl::Status)>;

// Returns `n` callbacks for `n` async calls: once all of them ran, `then` runs if none failed,
// else `done` with the first error (on the thread of the last callback). n == 0 runs `then` now.
std::vector<DoneCallback> JoinThen(int n, std::function<void()> then, DoneCallback done);

// The entries of batched requests (PServerClient::SendBatchAsync and friends).
struct SendItem {
  std::string name;
  const Variable* var;  // a whole dense tensor or SelectedRows
};
struct GetItem {
  std::string name;
  Variable* out;  // receives the dense tensor (its buffer reused when the size matches)
};
struct PrefetchItem {
  std::string table;
  const std::vector<int64_t>* ids;
  Tensor* out;  // receives [ids->size(), width]
};

// The job handshake's fields (RegisterRequest): (name, value) pairs every process of a job must
// agree on.
using JobFields = std::vector<std::pair<std::string, std::string>>;

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_RPC_H_
