// Reading and writing programs as text protos (the format `tessera_program` and
// `tessera_transpile` print, and that daemons accept as program files).
#ifndef TESSERA_COMMON_FRAMEWORK_PROGRAM_IO_H_
#define TESSERA_COMMON_FRAMEWORK_PROGRAM_IO_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "proto/program.pb.h"

namespace tessera {

// Parses text-format `message`; on error one line naming `source`, the line and column.
absl::Status ParseTextMessage(absl::string_view text, absl::string_view source,
                              google::protobuf::Message* message);
// Parses a text-format ProgramDesc. On error the message is one line naming `source`, the line
// and column, e.g. "model.pbtxt:12:5: Expected identifier, got: }".
absl::StatusOr<ProgramDesc> ParseProgramText(absl::string_view text, absl::string_view source);
// Every name and string attribute of `program` is free of control characters (they would
// split or forge the lines of errors and logs that echo them); otherwise InvalidArgument naming
// `source`, the block, the op and the string. ParseProgramText checks this.
absl::Status CheckProgramStrings(const ProgramDesc& program, absl::string_view source);
// Text form of `program` (deterministic: same program -> same bytes).
std::string ProgramToText(const ProgramDesc& program);

absl::StatusOr<ProgramDesc> ReadProgramFile(const std::string& path);
// Writes atomically (temporary file + rename).
absl::Status WriteProgramFile(const ProgramDesc& program, const std::string& path);

// Whole-file helpers; errors name the path and the OS error.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteStringToFileAtomic(const std::string& path, absl::string_view contents);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_PROGRAM_IO_H_
