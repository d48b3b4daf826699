// AnsweringPServerClient: a PServerClient for tests that answers every call at once with one
// fixed status and touches nothing. A test's fake derives from it and overrides only the calls
// it watches. Thread-safe.
#ifndef TESSERA_COMMON_RPC_ANSWERING_CLIENT_H_
#define TESSERA_COMMON_RPC_ANSWERING_CLIENT_H_

#include <string>
#include <utility>
#include <vector>

#include "common/rpc/client.h"

namespace tessera {

class AnsweringPServerClient : public PServerClient {
 public:
  explicit AnsweringPServerClient(absl::Status answer = absl::UnimplementedError("fake pserver"),
                                  std::string endpoint = "fake:1")
      : answer_(std::move(answer)), endpoint_(std::move(endpoint)) {}

  const std::string& endpoint() const override { return endpoint_; }
  void SendVariableAsync(const RequestMeta&, const std::string&, const Variable*,
                         DoneCallback done) override {
    done(answer_);
  }
  void GetVariableAsync(const RequestMeta&, const std::string&, Variable*,
                        DoneCallback done) override {
    done(answer_);
  }
  void PrefetchAsync(const RequestMeta&, const std::string&, const std::vector<int64_t>*,
                     Tensor*, DoneCallback done) override {
    done(answer_);
  }
  void BarrierAsync(const RequestMeta&, BarrierKind, DoneCallback done) override {
    done(answer_);
  }
  void CheckpointAsync(const RequestMeta&, const std::string&, DoneCallback done) override {
    done(answer_);
  }
  void RegisterAsync(const RequestMeta&, const JobFields&, uint64_t, DoneCallback done) override {
    done(answer_);
  }

 private:
  const absl::Status answer_;
  const std::string endpoint_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_ANSWERING_CLIENT_H_
