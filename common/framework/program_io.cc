#include "common/framework/program_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/printable.h"
#include "common/base/status.h"
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

absl::Status ControlCharError(absl::string_view source, int block, absl::string_view where,
                              absl::string_view what, absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": block ", block, where, ": ", CheckPrintable(what, value).message()));
}
}  // namespace

absl::Status CheckProgramStrings(const ProgramDesc& program, absl::string_view source) {
  for (int b = 0; b < program.blocks_size(); ++b) {
    const BlockDesc& block = program.blocks(b);
    for (const VarDesc& var : block.vars()) {
      if (HasControlChar(var.name())) {
        return ControlCharError(source, b, "", "variable", var.name());
      }
    }
    for (int i = 0; i < block.ops_size(); ++i) {
      const OpDesc& op = block.ops(i);
      const std::string where = absl::StrCat(" op #", i);
      if (HasControlChar(op.type())) return ControlCharError(source, b, where, "type", op.type());
      for (const auto* slots : {&op.inputs(), &op.outputs()}) {
        for (const OpDesc::Var& slot : *slots) {
          if (HasControlChar(slot.parameter())) {
            return ControlCharError(source, b, where, "slot", slot.parameter());
          }
          for (const std::string& arg : slot.arguments()) {
            if (HasControlChar(arg)) return ControlCharError(source, b, where, "argument", arg);
          }
        }
      }
      for (const OpDesc::Attr& attr : op.attrs()) {
        if (HasControlChar(attr.name())) {
          return ControlCharError(source, b, where, "attribute", attr.name());
        }
        if (HasControlChar(attr.s())) {
          return ControlCharError(source, b, where, absl::StrCat("attribute ", attr.name()),
                                  attr.s());
        }
        for (const std::string& v : attr.strings().v()) {
          if (HasControlChar(v)) {
            return ControlCharError(source, b, where, absl::StrCat("attribute ", attr.name()), v);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTextMessage(absl::string_view text, absl::string_view source,
                              google::protobuf::Message* message) {
  FirstErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", errors.first().empty() ? " malformed text proto" : errors.first()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProgramDesc> ParseProgramText(absl::string_view text, absl::string_view source) {
  ProgramDesc program;
  TS_RETURN_IF_ERROR(ParseTextMessage(text, source, &program));
  if (program.blocks_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": program has no blocks"));
  }
  absl::Status names = CheckProgramStrings(program, source);
  if (!names.ok()) return names;
  return program;
}

std::string ProgramToText(const ProgramDesc& program) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(program, &out);
  return out;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
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
