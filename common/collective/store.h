// Store: the key-value store ranks rendezvous through (transport addresses, NCCL unique ids).
//
// Implementations: HashStore (in memory, for ranks that are threads of one process), TcpStore
// (tcp_store.h: rank 0 serves it), FileStore (file_store.h: a directory every rank can read),
// and PrefixStore, a view that puts every key under a prefix so that several rendezvous (the
// world group, sub-groups) share one store. Values are written once per key; Get() waits for
// a key to appear. Implementations are thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_STORE_H_
#define TESSERA_COMMON_COLLECTIVE_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {
namespace collective {

class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key` (replacing an earlier value). Unavailable when the store cannot
  // be reached.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set. DeadlineExceeded (naming
  // the key) when it is not set in time.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Waits until every key is set, up to `timeout` in all.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  // "tcp store 10.0.0.1:6170", for messages.
  virtual std::string DebugName() const = 0;
};

// In-memory store. Thread-safe.
class HashStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  std::string DebugName() const override { return "in-memory store"; }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// Keys of `base` under "<prefix>/". Shares ownership of `base`.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix)), base_(std::move(base)) {}
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string DebugName() const override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_STORE_H_
