// FileSystem: the few file operations checkpoints need, behind an interface so that tests can
// inject faults (fault_injecting_file_system.h). PosixFileSystem is the real one.
//
// Every error is a Status whose message names the path. Thread-safe: implementations hold no
// per-call state (a WritableFile is used by one thread at a time).
#ifndef TESSERA_COMMON_IO_FILE_SYSTEM_H_
#define TESSERA_COMMON_IO_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace io {

// A file being written. Close() must be called (the destructor closes without reporting).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  // Flushes the file's data to stable storage (fsync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // The whole file. NotFound if it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Atomically replaces `to` by `from` (same directory).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the directory's entries (creations, renames) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Creates `dir` and missing parents; OK if it exists.
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // Names (not paths) in `dir`, sorted. NotFound if `dir` does not exist.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // Removes a file, or a directory and everything under it. OK if absent.
  virtual absl::Status DeleteRecursively(const std::string& path) = 0;
};

// The local (POSIX) file system. Stateless; Default() lives for the whole process.
class PosixFileSystem : public FileSystem {
 public:
  static FileSystem* Default();

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  bool Exists(const std::string& path) override;
  absl::Status DeleteRecursively(const std::string& path) override;
};

// The directory part of `path` ("." when it has none).
std::string DirName(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

// Writes `contents` to `path` atomically and durably: a temp file in the same directory
// (<path>.tmp), fsync, rename over `path`, fsync the directory. On failure `path` is left as it
// was (the temp file is removed if possible).
absl::Status WriteFileAtomic(FileSystem* fs, const std::string& path, absl::string_view contents);

}  // namespace io
}  // namespace tessera

#endif  // TESSERA_COMMON_IO_FILE_SYSTEM_H_
