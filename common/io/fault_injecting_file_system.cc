#include "common/io/fault_injecting_file_system.h"

#include "absl/strings/str_cat.h"

namespace tessera {
namespace io {

namespace {

class FaultInjectingFile : public WritableFile {
 public:
  FaultInjectingFile(FaultInjectingFileSystem* fs, std::string path,
                     std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Append(absl::string_view data) override {
    absl::Status s = fs_->Tick(absl::StrCat("append to ", path_));
    if (!s.ok()) {
      base_->Append(data.substr(0, data.size() / 2)).IgnoreError();  // torn write
      return s;
    }
    return base_->Append(data);
  }
  absl::Status Sync() override {
    absl::Status s = fs_->Tick(absl::StrCat("fsync ", path_));
    if (!s.ok() || fs_->skip_sync()) return s;
    return base_->Sync();
  }
  absl::Status Close() override {
    absl::Status s = fs_->Tick(absl::StrCat("close ", path_));
    absl::Status closed = base_->Close();  // the descriptor is released either way
    return s.ok() ? closed : s;
  }

 private:
  FaultInjectingFileSystem* fs_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
};

}  // namespace

absl::Status FaultInjectingFileSystem::Tick(const std::string& what) {
  const int64_t n = ops_.fetch_add(1) + 1;
  if ((crash_ && fired_.load()) || (fail_at_ > 0 && n == fail_at_)) {
    fired_ = true;
    return absl::UnavailableError(
        absl::StrCat("injected fault at file operation ", n, " (", what, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewWritableFile(
    const std::string& path) {
  absl::Status s = Tick(absl::StrCat("create ", path));
  if (!s.ok()) return s;
  auto base = base_->NewWritableFile(path);
  if (!base.ok()) return base.status();
  return std::unique_ptr<WritableFile>(new FaultInjectingFile(this, path, std::move(*base)));
}

absl::Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  absl::Status s = Tick(absl::StrCat("rename ", from, " to ", to));
  return s.ok() ? base_->Rename(from, to) : s;
}

absl::Status FaultInjectingFileSystem::SyncDir(const std::string& dir) {
  absl::Status s = Tick(absl::StrCat("fsync directory ", dir));
  if (!s.ok() || skip_sync_) return s;
  return base_->SyncDir(dir);
}

absl::Status FaultInjectingFileSystem::CreateDirs(const std::string& dir) {
  absl::Status s = Tick(absl::StrCat("create directory ", dir));
  return s.ok() ? base_->CreateDirs(dir) : s;
}

absl::Status FaultInjectingFileSystem::DeleteRecursively(const std::string& path) {
  absl::Status s = Tick(absl::StrCat("delete ", path));
  return s.ok() ? base_->DeleteRecursively(path) : s;
}

}  // namespace io
}  // namespace tessera
