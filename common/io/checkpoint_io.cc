#include "common/io/checkpoint_io.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/io/crc32c.h"
#include "common/base/status.h"

namespace tessera {
namespace io {

namespace {

constexpr char kHeader[] = "tessera-manifest 1";

bool ParseHex32(absl::string_view s, uint32_t* out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  *out = v;
  return true;
}

bool ValidToken(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') return false;
  }
  return true;
}

}  // namespace

const ManifestEntry* Manifest::Find(const std::string& name) const {
  for (const auto& e : files) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<int64_t> Manifest::IntMeta(const std::string& key, const std::string& path) const {
  auto it = meta.find(key);
  int64_t v;
  if (it == meta.end() || !absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", path, ": missing or malformed '", key, "'"));
  }
  return v;
}

std::string SerializeManifest(const Manifest& manifest) {
  std::string out = absl::StrCat(kHeader, "\n");
  for (const auto& [k, v] : manifest.meta) absl::StrAppend(&out, "meta ", k, " ", v, "\n");
  for (const auto& e : manifest.files) {
    absl::StrAppend(&out, "file ", e.name, " ", e.size, " ", absl::StrFormat("%08x", e.crc32c),
                    "\n");
  }
  absl::StrAppend(&out, "end ", absl::StrFormat("%08x", Crc32c(out)), "\n");
  return out;
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("manifest ", path, ": ", why));
  };
  const size_t end_at = text.rfind("end ");
  if (end_at == absl::string_view::npos || (end_at > 0 && text[end_at - 1] != '\n')) {
    return bad("truncated (no end line)");
  }
  absl::string_view trailer = text.substr(end_at + 4);
  if (trailer.empty() || trailer.back() != '\n') return bad("truncated (end line incomplete)");
  trailer.remove_suffix(1);
  uint32_t want;
  if (!ParseHex32(trailer, &want)) return bad("malformed end line");
  if (Crc32c(text.substr(0, end_at)) != want) return bad("checksum mismatch");
  std::vector<absl::string_view> lines =
      absl::StrSplit(text.substr(0, end_at), '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kHeader) return bad("not a tessera manifest");
  Manifest m;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    if (f.size() == 3 && f[0] == "meta") {
      m.meta[f[1]] = f[2];
    } else if (f.size() == 4 && f[0] == "file") {
      ManifestEntry e;
      e.name = f[1];
      if (!absl::SimpleAtoi(f[2], &e.size) || !ParseHex32(f[3], &e.crc32c)) {
        return bad(absl::StrCat("malformed line ", i + 1));
      }
      m.files.push_back(e);
    } else {
      return bad(absl::StrCat("malformed line ", i + 1));
    }
  }
  return m;
}

absl::StatusOr<Manifest> ReadManifest(FileSystem* fs, const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(path));
  return ParseManifest(text, path);
}

absl::StatusOr<std::string> ReadVerified(FileSystem* fs, const std::string& dir,
                                         const ManifestEntry& entry) {
  const std::string path = JoinPath(dir, entry.name);
  auto data = fs->ReadFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("file ", path, ": ", data.status().message()));
  }
  if (static_cast<int64_t>(data->size()) != entry.size) {
    return absl::DataLossError(absl::StrCat("file ", path, ": size ", data->size(),
                                            " bytes, manifest says ", entry.size,
                                            " (truncated or replaced)"));
  }
  if (Crc32c(*data) != entry.crc32c) {
    return absl::DataLossError(
        absl::StrCat("file ", path, ": checksum mismatch (corrupt)"));
  }
  return std::move(*data);
}

absl::Status ManifestWriter::WriteFile(const std::string& name, absl::string_view contents) {
  if (!ValidToken(name))
    return absl::InvalidArgumentError(absl::StrCat("bad file name '", name, "'"));
  TS_RETURN_IF_ERROR(WriteFileAtomic(fs_, JoinPath(dir_, name), contents));
  manifest_.files.push_back({name, static_cast<int64_t>(contents.size()), Crc32c(contents)});
  return absl::OkStatus();
}

absl::Status ManifestWriter::AddExisting(const std::string& name) {
  const std::string path = JoinPath(dir_, name);
  auto data = fs_->ReadFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("file ", path, ": ", data.status().message()));
  }
  manifest_.files.push_back({name, static_cast<int64_t>(data->size()), Crc32c(*data)});
  return absl::OkStatus();
}

absl::Status ManifestWriter::Commit(const std::string& manifest_name) {
  for (const auto& [k, v] : manifest_.meta) {
    if (!ValidToken(k) || !ValidToken(v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad manifest entry '", k, "'='", v, "'"));
    }
  }
  return WriteFileAtomic(fs_, JoinPath(dir_, manifest_name), SerializeManifest(manifest_));
}

std::string StepDirName(absl::string_view prefix, int64_t step) {
  return absl::StrFormat("%s%010d", prefix, step);
}

int64_t StepOfDirName(absl::string_view prefix, absl::string_view name) {
  if (name.size() <= prefix.size() || !absl::StartsWith(name, prefix)) return -1;
  absl::string_view digits = name.substr(prefix.size());
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
  }
  int64_t step;
  if (!absl::SimpleAtoi(digits, &step)) return -1;
  return step;
}

absl::StatusOr<std::vector<StepDir>> ListStepDirs(FileSystem* fs, const std::string& root,
                                                  absl::string_view prefix) {
  TS_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(root));
  std::vector<StepDir> out;
  for (const auto& n : names) {
    StepDir d;
    d.step = StepOfDirName(prefix, n);
    if (d.step < 0) continue;
    d.dir = JoinPath(root, n);
    const std::string manifest = JoinPath(d.dir, kManifestName);
    d.has_manifest = fs->Exists(manifest);
    if (d.has_manifest) {
      auto m = ReadManifest(fs, manifest);
      if (m.ok()) {
        d.manifest = std::move(*m);
      } else {
        d.manifest_error = m.status();
      }
    }
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) {
    return a.step != b.step ? a.step > b.step : a.dir > b.dir;
  });
  return out;
}

absl::StatusOr<std::string> BeginStepDir(FileSystem* fs, const std::string& root,
                                         absl::string_view prefix, int64_t step) {
  const std::string dir = JoinPath(root, StepDirName(prefix, step));
  if (fs->Exists(dir)) {
    TS_RETURN_IF_ERROR(fs->DeleteRecursively(JoinPath(dir, kManifestName)));
    TS_RETURN_IF_ERROR(fs->SyncDir(dir));
    TS_RETURN_IF_ERROR(fs->DeleteRecursively(dir));
  }
  TS_RETURN_IF_ERROR(fs->CreateDirs(dir));
  TS_RETURN_IF_ERROR(fs->SyncDir(root));
  return dir;
}

absl::Status FinishStepDir(FileSystem* fs, const std::string& root, absl::string_view prefix,
                           int64_t step, int keep, const StepDirKeepExtension& extend) {
  TS_RETURN_IF_ERROR(
      WriteFileAtomic(fs, JoinPath(root, kLatestName), StepDirName(prefix, step) + "\n"));
  TS_ASSIGN_OR_RETURN(std::vector<StepDir> all, ListStepDirs(fs, root, prefix));
  std::set<int64_t> kept = {step};
  int complete = 0;
  for (const StepDir& d : all) {
    if (d.step > step) continue;  // not ours to judge
    if (d.complete() && ++complete <= std::max(1, keep)) kept.insert(d.step);
  }
  if (extend) extend(all, &kept);
  for (const StepDir& d : all) {
    if (d.step > step || kept.count(d.step) > 0) continue;
    TS_RETURN_IF_ERROR(fs->DeleteRecursively(d.dir));
  }
  return absl::OkStatus();
}

absl::Status AbandonStepDir(FileSystem* fs, const std::string& root, absl::string_view prefix,
                            int64_t step) {
  const std::string dir = JoinPath(root, StepDirName(prefix, step));
  if (fs->Exists(JoinPath(dir, kManifestName))) return absl::OkStatus();  // committed
  return fs->DeleteRecursively(dir);
}

absl::StatusOr<std::string> ResolveStepDir(FileSystem* fs, const std::string& path,
                                           absl::string_view prefix, absl::string_view what) {
  if (fs->Exists(JoinPath(path, kManifestName))) return path;
  auto all = ListStepDirs(fs, path, prefix);
  if (!all.ok()) {
    return absl::NotFoundError(
        absl::StrCat("no ", what, " at ", path, ": ", all.status().message()));
  }
  for (const StepDir& d : *all) {
    // The newest with a manifest; a damaged one is an error, not silently skipped.
    if (!d.has_manifest) continue;
    if (!d.manifest_error.ok()) return d.manifest_error;
    return d.dir;
  }
  return absl::NotFoundError(
      absl::StrCat("no complete ", what, " (", prefix, "*/MANIFEST) under ", path));
}

namespace {
constexpr char kCheckpointPrefix[] = "ckpt-";
}  // namespace

std::string CheckpointDirName(int64_t step) { return StepDirName(kCheckpointPrefix, step); }

std::string PserverFilePrefix(int index, int num) {
  return absl::StrCat("pserver-", index, "-of-", num);
}

int64_t CheckpointStep(const std::string& name) { return StepOfDirName(kCheckpointPrefix, name); }

absl::StatusOr<std::string> BeginCheckpoint(FileSystem* fs, const std::string& root, int64_t step) {
  return BeginStepDir(fs, root, kCheckpointPrefix, step);
}

absl::Status FinishCheckpoint(FileSystem* fs, const std::string& root, int64_t step, int keep) {
  return FinishStepDir(fs, root, kCheckpointPrefix, step, keep, nullptr);
}

absl::Status AbandonCheckpoint(FileSystem* fs, const std::string& root, int64_t step) {
  return AbandonStepDir(fs, root, kCheckpointPrefix, step);
}

absl::StatusOr<std::string> ResolveCheckpoint(FileSystem* fs, const std::string& path) {
  return ResolveStepDir(fs, path, kCheckpointPrefix, "checkpoint");
}

absl::Status CommitTrainerCheckpoint(FileSystem* fs, const std::string& dir,
                                     const TrainerCheckpointState& state,
                                     const std::vector<std::string>& pserver_manifests) {
  ManifestWriter writer(fs, dir);
  for (const auto& name : pserver_manifests) TS_RETURN_IF_ERROR(writer.AddExisting(name));
  TS_RETURN_IF_ERROR(writer.WriteFile(
      "trainer.state",
      absl::StrCat("step ", state.step, "\nepoch ", state.epoch, "\nstep_in_epoch ",
                   state.step_in_epoch, "\nseed ", state.seed, "\ntrainers ", state.trainers,
                   "\nnum_pservers ", state.num_pservers, "\nstream_shuffle_buffer ",
                   state.stream_shuffle_buffer, "\nbatch_size ", state.batch_size, "\n")));
  writer.SetMeta("format", "1");
  writer.SetMeta("step", absl::StrCat(state.step));
  writer.SetMeta("num_pservers", absl::StrCat(state.num_pservers));
  writer.SetMeta("num_trainers", absl::StrCat(state.trainers));
  return writer.Commit(kManifestName);
}

absl::StatusOr<TrainerCheckpointState> ReadTrainerCheckpoint(FileSystem* fs,
                                                             const std::string& ckpt_dir) {
  const std::string manifest_path = JoinPath(ckpt_dir, kManifestName);
  TS_ASSIGN_OR_RETURN(Manifest m, ReadManifest(fs, manifest_path));
  const ManifestEntry* e = m.Find("trainer.state");
  if (e == nullptr) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", manifest_path, " lists no trainer.state"));
  }
  TS_ASSIGN_OR_RETURN(std::string text, ReadVerified(fs, ckpt_dir, *e));
  std::map<std::string, int64_t> kv;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    int64_t v;
    if (!absl::SimpleAtoi(f.second, &v)) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", JoinPath(ckpt_dir, e->name),
                                              ": malformed line '", line, "'"));
    }
    kv[f.first] = v;
  }
  TrainerCheckpointState st;
  for (auto [key, field] : {std::make_pair("step", &st.step), std::make_pair("epoch", &st.epoch),
                            std::make_pair("step_in_epoch", &st.step_in_epoch),
                            std::make_pair("trainers", &st.trainers),
                            std::make_pair("num_pservers", &st.num_pservers)}) {
    auto it = kv.find(key);
    if (it == kv.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", JoinPath(ckpt_dir, e->name), ": no '", key, "'"));
    }
    *field = it->second;
  }
  st.seed = static_cast<uint64_t>(kv["seed"]);
  auto stream = kv.find("stream_shuffle_buffer");
  st.stream_shuffle_buffer = stream == kv.end() ? -1 : stream->second;
  auto batch = kv.find("batch_size");
  st.batch_size = batch == kv.end() ? -1 : batch->second;
  return st;
}

}  // namespace io
}  // namespace tessera
