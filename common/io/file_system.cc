#include "common/io/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace io {

namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  const int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Append(absl::string_view data) override {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("cannot write", path_);
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return Errno("cannot fsync", path_);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0) return Errno("cannot close", path_);
    return absl::OkStatus();
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

FileSystem* PosixFileSystem::Default() {
  static PosixFileSystem* fs = new PosixFileSystem;
  return fs;
}

absl::StatusOr<std::unique_ptr<WritableFile>> PosixFileSystem::NewWritableFile(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
}

absl::StatusOr<std::string> PosixFileSystem::ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Errno(absl::StrCat("cannot rename ", from, " to"), to);
  }
  return absl::OkStatus();
}

absl::Status PosixFileSystem::SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status PosixFileSystem::CreateDirs(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty directory name");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", prefix);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PosixFileSystem::ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Errno("cannot list directory", dir);
  std::vector<std::string> out;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool PosixFileSystem::Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::Status PosixFileSystem::DeleteRecursively(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    auto names = ListDir(path);
    if (!names.ok()) return names.status();
    for (const auto& n : *names) {
      absl::Status s = DeleteRecursively(JoinPath(path, n));
      if (!s.ok()) return s;
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", path);
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", path);
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

absl::Status WriteFileAtomic(FileSystem* fs, const std::string& path, absl::string_view contents) {
  const std::string temp = absl::StrCat(path, ".tmp");
  absl::Status s = [&]() -> absl::Status {
    auto file = fs->NewWritableFile(temp);
    if (!file.ok()) return file.status();
    absl::Status st = (*file)->Append(contents);
    if (st.ok()) st = (*file)->Sync();
    absl::Status closed = (*file)->Close();
    if (st.ok()) st = closed;
    if (st.ok()) st = fs->Rename(temp, path);
    return st;
  }();
  if (!s.ok()) {
    fs->DeleteRecursively(temp).IgnoreError();  // best effort; a leftover .tmp is never read
    return s;
  }
  return fs->SyncDir(DirName(path));
}

}  // namespace io
}  // namespace tessera
