// Checkpoint files: atomic writes, per-checkpoint manifests with CRC-32C checksums, and the
// checkpoint directory layout (see README.md, "Checkpoints").
//
//   <root>/ckpt-<step, 10 digits>/   one checkpoint; complete iff its MANIFEST exists
//   <root>/ckpt-.../MANIFEST         written last (atomically): the commit point
//   <root>/LATEST                    "ckpt-<step>" of the last committed checkpoint (a hint for
//                                    people and tools; loading picks the newest complete one)
//
// A manifest is a text file:
//   tessera-manifest 1
//   meta <key> <value>                    (any number; keys and values without spaces)
//   file <name> <size> <crc32c, 8 hex>    (any number; names relative to the manifest's dir)
//   end <crc32c, 8 hex, of every preceding byte>
// Every file a checkpoint reads is checked against its manifest entry first (size, then
// checksum); a mismatch is DataLoss naming the file.
#ifndef TESSERA_COMMON_IO_CHECKPOINT_IO_H_
#define TESSERA_COMMON_IO_CHECKPOINT_IO_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/file_system.h"

namespace tessera {
namespace io {

inline constexpr char kManifestName[] = "MANIFEST";
inline constexpr char kLatestName[] = "LATEST";

struct ManifestEntry {
  std::string name;
  int64_t size = 0;
  uint32_t crc32c = 0;
};

struct Manifest {
  std::map<std::string, std::string> meta;
  std::vector<ManifestEntry> files;

  // The entry named `name`, or nullptr.
  const ManifestEntry* Find(const std::string& name) const;
  // meta[key] as an integer; InvalidArgument naming `path` and the key if absent or malformed.
  absl::StatusOr<int64_t> IntMeta(const std::string& key, const std::string& path) const;
};

std::string SerializeManifest(const Manifest& manifest);
// DataLoss naming `path` on any malformation or a checksum mismatch.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& path);
absl::StatusOr<Manifest> ReadManifest(FileSystem* fs, const std::string& path);

// Reads <dir>/<entry.name> and checks it against the entry. DataLoss names the file.
absl::StatusOr<std::string> ReadVerified(FileSystem* fs, const std::string& dir,
                                         const ManifestEntry& entry);

// Writes the files of one manifest into `dir` (which must exist), each atomically, recording
// their sizes and checksums; Commit() writes the manifest last. Not thread-safe.
class ManifestWriter {
 public:
  ManifestWriter(FileSystem* fs, std::string dir) : fs_(fs), dir_(std::move(dir)) {}
  absl::Status WriteFile(const std::string& name, absl::string_view contents);
  // Lists a file that is already in `dir` (written by another process), reading it for its
  // checksum. NotFound names the file.
  absl::Status AddExisting(const std::string& name);
  void SetMeta(const std::string& key, const std::string& value) { manifest_.meta[key] = value; }
  // Writes <dir>/<manifest_name> atomically.
  absl::Status Commit(const std::string& manifest_name);
  const Manifest& manifest() const { return manifest_; }

 private:
  FileSystem* fs_;
  std::string dir_;
  Manifest manifest_;
};

// Step directories: "<prefix><step, 10 digits>" under a root, complete iff their MANIFEST exists
// and parses. Checkpoints ("ckpt-", below) and inference exports ("export-", bundle.h) share
// these; each kind adds its own keep rule and commit.

// "<prefix>0000000042".
std::string StepDirName(absl::string_view prefix, int64_t step);
// The step of a "<prefix><step>" name (digits only); -1 if `name` is not one.
int64_t StepOfDirName(absl::string_view prefix, absl::string_view name);

// One "<prefix><step>" directory found under a root.
struct StepDir {
  int64_t step = 0;
  std::string dir;            // <root>/<prefix><step>
  bool has_manifest = false;  // its MANIFEST exists
  // Why an existing MANIFEST is unusable (DataLoss naming it: manifests are written
  // atomically, so one that does not parse is damaged); OK otherwise.
  absl::Status manifest_error;
  Manifest manifest;  // the parsed MANIFEST when complete()
  bool complete() const { return has_manifest && manifest_error.ok(); }
};

// Every <prefix>* directory under `root`, newest first, each manifest read. The ListDir error
// (naming `root`) if `root` cannot be listed.
absl::StatusOr<std::vector<StepDir>> ListStepDirs(FileSystem* fs, const std::string& root,
                                                  absl::string_view prefix);
// Creates <root>/<prefix><step>, or empties it (manifest first, so it stops being complete before
// anything else goes) if an earlier attempt left it. Returns the directory.
absl::StatusOr<std::string> BeginStepDir(FileSystem* fs, const std::string& root,
                                         absl::string_view prefix, int64_t step);
// After <root>/<prefix><step> is committed: writes LATEST ("<prefix><step>\n") first, then
// keeps the newest max(1, keep) complete directories at or below `step` (and `step` itself),
// plus whatever `extend` (may be null) adds to the kept steps given the listing; deletes the
// other complete ones at or below `step` and the incomplete ones older than `step`. Directories
// newer than `step` are never touched.
using StepDirKeepExtension =
    std::function<void(const std::vector<StepDir>& all, std::set<int64_t>* kept)>;
absl::Status FinishStepDir(FileSystem* fs, const std::string& root, absl::string_view prefix,
                           int64_t step, int keep, const StepDirKeepExtension& extend);
// Removes <root>/<prefix><step> unless it is complete (holds its MANIFEST).
absl::Status AbandonStepDir(FileSystem* fs, const std::string& root, absl::string_view prefix,
                            int64_t step);
// `path` itself if it holds a MANIFEST, else the newest complete <prefix>* under it; a damaged
// newest manifest is its DataLoss error, not skipped. NotFound naming `path` ("no <what> at
// <path>: ..." when it cannot be listed, "no complete <what> (<prefix>*/MANIFEST) under <path>"
// when it holds none).
absl::StatusOr<std::string> ResolveStepDir(FileSystem* fs, const std::string& path,
                                           absl::string_view prefix, absl::string_view what);

// "ckpt-0000000042".
std::string CheckpointDirName(int64_t step);
// "pserver-<index>-of-<num>": the prefix of pserver <index>'s files in a checkpoint of a job
// with <num> pservers (pserver/checkpoint.h writes them; trainer 0 lists their manifests).
std::string PserverFilePrefix(int index, int num);
// The step of a "ckpt-<step>" name; -1 if `name` is not one.
int64_t CheckpointStep(const std::string& name);

// Prepares <root>/ckpt-<step> for a new checkpoint: creates it, or empties it (manifest first,
// so it stops being complete before anything else goes) if an earlier attempt left it.
absl::StatusOr<std::string> BeginCheckpoint(FileSystem* fs, const std::string& root, int64_t step);
// After <root>/ckpt-<step>/MANIFEST is written: points LATEST at it and deletes older
// checkpoints beyond the newest `keep` complete ones (and incomplete ones older than it).
absl::Status FinishCheckpoint(FileSystem* fs, const std::string& root, int64_t step, int keep);

// After a save of <root>/ckpt-<step> failed (a full disk, a pserver gone): removes that
// directory unless it is complete (holds its MANIFEST), so that no partial checkpoint is left.
// Committed checkpoints are never touched.
absl::Status AbandonCheckpoint(FileSystem* fs, const std::string& root, int64_t step);

// The checkpoint to restore from `path`: `path` itself if it holds a MANIFEST, else the newest
// complete ckpt-* under it. NotFound naming `path` if there is none.
absl::StatusOr<std::string> ResolveCheckpoint(FileSystem* fs, const std::string& path);

// What trainer 0 saves (in sync mode every trainer is at the same step and data position, so
// trainer 0's position is the job's): the text file "trainer.state" of "<key> <value>" lines.
struct TrainerCheckpointState {
  int64_t step = 0;           // steps run
  int64_t epoch = 0;          // the epoch of the next step
  int64_t step_in_epoch = 0;  // its index within that epoch
  uint64_t seed = 0;          // the data order's seed (each epoch shuffles with seed + epoch)
  int64_t trainers = 1;
  int64_t num_pservers = 1;
  // --reader=stream's shuffle buffer, whose streams a restore replays; -1: the in-memory reader
  // (and checkpoints written before streaming existed).
  int64_t stream_shuffle_buffer = -1;
  int64_t batch_size = -1;  // the global batch (-1: not recorded by older checkpoints)
};

// The commit: writes <dir>/trainer.state, then <dir>/MANIFEST listing it and the pservers'
// manifests `pserver_manifests` (already in `dir`; checksummed here) with meta step,
// num_pservers, num_trainers. After it returns OK the checkpoint is complete.
absl::Status CommitTrainerCheckpoint(FileSystem* fs, const std::string& dir,
                                     const TrainerCheckpointState& state,
                                     const std::vector<std::string>& pserver_manifests);
// Reads trainer.state of the complete checkpoint `ckpt_dir`, verified against its MANIFEST.
absl::StatusOr<TrainerCheckpointState> ReadTrainerCheckpoint(FileSystem* fs,
                                                             const std::string& ckpt_dir);

}  // namespace io
}  // namespace tessera

#endif  // TESSERA_COMMON_IO_CHECKPOINT_IO_H_
