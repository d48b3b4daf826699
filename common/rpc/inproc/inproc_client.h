// InProcClient: a PServerClient that calls a RequestHandler in the same process (unit tests of
// pserver logic and trainer ops without sockets). Copies values as the network would.
// Thread-safe if the handler is.
#ifndef TESSERA_COMMON_RPC_INPROC_INPROC_CLIENT_H_
#define TESSERA_COMMON_RPC_INPROC_INPROC_CLIENT_H_

#include <string>

#include "common/rpc/client.h"
#include "common/rpc/server.h"

namespace tessera {

class InProcClient : public PServerClient {
 public:
  // `handler` must outlive the client.
  InProcClient(std::string endpoint, RequestHandler* handler)
      : endpoint_(std::move(endpoint)), handler_(handler) {}

  const std::string& endpoint() const override { return endpoint_; }
  void SendVariableAsync(const RequestMeta& meta, const std::string& name, const Variable* var,
                         DoneCallback done) override;
  void GetVariableAsync(const RequestMeta& meta, const std::string& name, Variable* out,
                        DoneCallback done) override;
  void PrefetchAsync(const RequestMeta& meta, const std::string& table,
                     const std::vector<int64_t>* ids, Tensor* out, DoneCallback done) override;
  void AwaitUpdateAsync(const RequestMeta& meta, DoneCallback done) override;
  void BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override;
  void SendBarrierAsync(const RequestMeta& meta, StepReply* reply, DoneCallback done) override;
  void AbortAsync(const RequestMeta& meta, const std::string& reason, DoneCallback done) override;
  void RegisterAsync(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                     DoneCallback done) override;
  void CheckpointAsync(const RequestMeta& meta, const std::string& dir,
                       DoneCallback done) override;

 private:
  absl::Status Admit(const RequestMeta& meta, absl::string_view what,
                     absl::string_view name) const;

  std::string endpoint_;
  RequestHandler* handler_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_INPROC_INPROC_CLIENT_H_
