#include "common/collective/file_store.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/file_store.h"

namespace tessera {
namespace collective {
namespace {

// Values are stored with a one-byte header: Gloo's FileStore refuses empty files.
constexpr char kHeader = 'v';

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    partial = path.substr(0, i);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError(absl::StrCat("file store: cannot create directory '", partial,
                                                 "': ", std::strerror(errno)));
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat("file store: '", path, "' is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("file store: empty path (give a directory every rank sees)");
  }
  absl::Status made = MakeDirs(path);
  if (!made.ok()) return made;
  try {
    auto store = std::make_unique<gloo::rendezvous::FileStore>(path);
    return std::unique_ptr<FileStore>(new FileStore(path, std::move(store)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("file store: cannot use directory '", path, "': ", e.what()));
  }
}

FileStore::FileStore(std::string path, std::unique_ptr<gloo::rendezvous::FileStore> store)
    : path_(std::move(path)), store_(std::move(store)) {}

FileStore::~FileStore() = default;

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  std::vector<char> data;
  data.reserve(value.size() + 1);
  data.push_back(kHeader);
  data.insert(data.end(), value.begin(), value.end());
  absl::MutexLock lock(&mu_);
  try {
    store_->set(key, data);
  } catch (const std::exception& e) {
    if (std::strstr(e.what(), "already exists") != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("file store: key '", key, "' is already set in ", path_,
                       " (left by an earlier job? use a fresh directory for every job)"));
    }
    return absl::UnavailableError(
        absl::StrCat("file store ", path_, ": cannot set key '", key, "': ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  // Gloo's wait polls the directory (every 10 ms) without touching shared state: no lock.
  gloo::rendezvous::FileStore* store;
  {
    absl::MutexLock lock(&mu_);
    store = store_.get();
  }
  try {
    store->wait(keys, Millis(timeout));
  } catch (const gloo::IoException& e) {
    return absl::DeadlineExceededError(
        absl::StrCat("keys not set in ", DebugName(), " within ", absl::FormatDuration(timeout),
                     " (did every rank start with the same directory?)"));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(DebugName(), ": wait failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  absl::Status waited = Wait({key}, timeout);
  if (!waited.ok()) {
    if (absl::IsDeadlineExceeded(waited)) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' not set in ", DebugName(),
                                                      " within ", absl::FormatDuration(timeout),
                                                      " (did every rank start?)"));
    }
    return waited;
  }
  std::vector<char> data;
  {
    absl::MutexLock lock(&mu_);
    try {
      data = store_->get(key);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat(DebugName(), ": cannot read key '", key, "': ", e.what()));
    }
  }
  if (data.empty() || data[0] != kHeader) {
    return absl::DataLossError(
        absl::StrCat(DebugName(), ": key '", key, "' holds a value this store did not write"));
  }
  return std::string(data.begin() + 1, data.end());
}

}  // namespace collective
}  // namespace tessera
