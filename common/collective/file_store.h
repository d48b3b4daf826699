// FileStore: rendezvous through a directory every rank can read and write (a local directory
// for one machine, a shared file system such as NFS for several), on top of Gloo's
// gloo::rendezvous::FileStore (one file per key, written to a temporary name then renamed).
//
// The directory must be fresh for every job: a key left by an earlier run is an error (it
// would hand out stale addresses), reported as FailedPrecondition naming the directory.
// Thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_FILE_STORE_H_
#define TESSERA_COMMON_COLLECTIVE_FILE_STORE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/collective/store.h"

namespace gloo {
namespace rendezvous {
class FileStore;
}  // namespace rendezvous
}  // namespace gloo

namespace tessera {
namespace collective {

class FileStore : public Store {
 public:
  // Uses directory `path`, creating it (and missing parents) if needed. InvalidArgument when
  // the path is empty, Unavailable when the directory cannot be created.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(const std::string& path);
  ~FileStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  std::string DebugName() const override { return "file store " + path_; }

 private:
  FileStore(std::string path, std::unique_ptr<gloo::rendezvous::FileStore> store);

  const std::string path_;
  absl::Mutex mu_;
  std::unique_ptr<gloo::rendezvous::FileStore> store_ ABSL_GUARDED_BY(mu_);
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_FILE_STORE_H_
