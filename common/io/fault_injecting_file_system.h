// FaultInjectingFileSystem: a FileSystem wrapper for tests that fails the N-th mutating
// operation (Append, Sync, Close, Rename, SyncDir, CreateDirs, DeleteRecursively, creating a
// file), like leveldb's ErrorEnv. With `crash` set, the failing operation and every later one
// fail too, which models a process that died at that point (nothing after it reaches the disk,
// no cleanup runs); a failing Append first writes a prefix of its data (a torn write).
// Reads are never failed. With `skip_sync`, Sync and SyncDir are counted (and may fail) but do
// not reach the disk, which keeps tests that save thousands of times fast. Thread-safe.
#ifndef TESSERA_COMMON_IO_FAULT_INJECTING_FILE_SYSTEM_H_
#define TESSERA_COMMON_IO_FAULT_INJECTING_FILE_SYSTEM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/io/file_system.h"

namespace tessera {
namespace io {

class FaultInjectingFileSystem : public FileSystem {
 public:
  // `base` must outlive this. fail_at: 1-based index of the mutating operation to fail
  // (0: never fail).
  FaultInjectingFileSystem(FileSystem* base, int64_t fail_at, bool crash, bool skip_sync = false)
      : base_(base), fail_at_(fail_at), crash_(crash), skip_sync_(skip_sync) {}

  // Mutating operations seen so far (failed ones included).
  int64_t ops() const { return ops_.load(); }
  bool fired() const { return fired_.load(); }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  bool Exists(const std::string& path) override { return base_->Exists(path); }
  absl::Status DeleteRecursively(const std::string& path) override;

  // Counts one mutating operation named `what`; an error if it is to fail.
  absl::Status Tick(const std::string& what);
  bool skip_sync() const { return skip_sync_; }

 private:
  FileSystem* base_;
  const int64_t fail_at_;
  const bool crash_;
  const bool skip_sync_;
  std::atomic<int64_t> ops_{0};
  std::atomic<bool> fired_{false};
};

}  // namespace io
}  // namespace tessera

#endif  // TESSERA_COMMON_IO_FAULT_INJECTING_FILE_SYSTEM_H_
