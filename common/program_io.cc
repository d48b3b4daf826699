#include "common/program_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace tessera {

namespace {
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int line, int column, const std::string& message) override {}
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

absl::Status OsError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}
}  // namespace

absl::StatusOr<ProgramDesc> ParseProgramText(absl::string_view text, absl::string_view source) {
  ProgramDesc program;
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &program)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", errors.first().empty() ? "malformed program" : errors.first()));
  }
  if (program.blocks_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": program has no blocks"));
  }
  return program;
}

std::string ProgramToText(const ProgramDesc& program) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(program, &out);
  return out;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return OsError("cannot read", path);
  return ss.str();
}

absl::Status WriteStringToFileAtomic(const std::string& path, absl::string_view contents) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return OsError("cannot create", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = OsError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    absl::Status s = OsError("cannot flush", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = OsError("cannot rename into", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<ProgramDesc> ReadProgramFile(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseProgramText(*text, path);
}

absl::Status WriteProgramFile(const ProgramDesc& program, const std::string& path) {
  return WriteStringToFileAtomic(path, ProgramToText(program));
}

}  // namespace tessera
