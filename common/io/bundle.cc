#include "common/io/bundle.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"

namespace tessera {
namespace io {

namespace {

constexpr char kExportPrefix[] = "export-";

bool HasWhitespace(absl::string_view s) {
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return true;
  }
  return false;
}

// The last component of `path` (trailing slashes ignored).
std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// What is wrong with `meta` ("" if nothing): the rules of BundleMeta.
std::string BundleMetaProblem(const BundleMeta& meta) {
  if (meta.step < 0) return absl::StrCat("'step' ", meta.step, " is negative");
  if (meta.num_pservers < 0) {
    return absl::StrCat("'num_pservers' ", meta.num_pservers, " is negative");
  }
  if (meta.table_shard_method.empty() || HasWhitespace(meta.table_shard_method)) {
    return absl::StrCat("'table_shard_method' '", meta.table_shard_method, "' is not a name");
  }
  if (meta.delta) {
    if (meta.prev < 0 || meta.prev >= meta.step) {
      return absl::StrCat("'prev' ", meta.prev, " of a delta at step ", meta.step,
                          " is not an earlier step");
    }
    if (meta.base < 0 || meta.base > meta.prev) {
      return absl::StrCat("'base' ", meta.base, " of a delta on step ", meta.prev,
                          " is not at or before it");
    }
  } else {
    if (meta.prev != -1) {
      return absl::StrCat("'prev' ", meta.prev, " on a full export (only a delta has one)");
    }
    if (meta.base != meta.step) {
      return absl::StrCat("'base' ", meta.base, " of a full export is not its step ", meta.step);
    }
  }
  return "";
}

const char* LabelDtypeName(DataType dtype) {
  switch (dtype) {
    case FLOAT32:
      return "float32";
    case FLOAT64:
      return "float64";
    case INT64:
      return "int64";
    default:
      return nullptr;
  }
}

bool ParseLabelDtype(absl::string_view name, DataType* dtype) {
  for (DataType d : {FLOAT32, FLOAT64, INT64}) {
    if (name == LabelDtypeName(d)) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

// The chain-relevant part of a complete export's manifest for FinishExport: its prev (-1 for a
// full export or a manifest whose meta does not parse).
int64_t PrevOf(const StepDir& d) {
  if (!d.complete()) return -1;
  auto meta = GetBundleMeta(d.manifest, JoinPath(d.dir, kManifestName));
  return meta.ok() && meta->delta ? meta->prev : -1;
}

}  // namespace

std::string ExportDirName(int64_t step) { return StepDirName(kExportPrefix, step); }

int64_t ExportStep(const std::string& name) { return StepOfDirName(kExportPrefix, name); }

std::string ExportRequestName(int64_t step, bool delta) {
  return absl::StrCat(ExportDirName(step), delta ? ":delta" : ":full");
}

bool ParseExportRequestName(const std::string& name, int64_t* step, bool* delta) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return false;
  const int64_t s = ExportStep(name.substr(0, colon));
  if (s < 0) return false;
  const absl::string_view kind = absl::string_view(name).substr(colon + 1);
  if (kind != "full" && kind != "delta") return false;
  *step = s;
  *delta = kind == "delta";
  return true;
}

std::string BundleTableFileName(int pserver, int num_pservers, const std::string& table) {
  return absl::StrCat(PserverFilePrefix(pserver, num_pservers), ".", table, ".tbl");
}

void PutBundleMeta(const BundleMeta& meta, Manifest* manifest) {
  manifest->meta["step"] = absl::StrCat(meta.step);
  manifest->meta["kind"] = meta.delta ? "delta" : "full";
  if (meta.delta) {
    manifest->meta["prev"] = absl::StrCat(meta.prev);
  } else {
    manifest->meta.erase("prev");
  }
  manifest->meta["base"] = absl::StrCat(meta.base);
  manifest->meta["num_pservers"] = absl::StrCat(meta.num_pservers);
  manifest->meta["table_shard_method"] = meta.table_shard_method;
}

absl::StatusOr<BundleMeta> GetBundleMeta(const Manifest& manifest, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("export manifest ", path, ": ", why));
  };
  auto get = [&](const char* key) -> const std::string* {
    auto it = manifest.meta.find(key);
    return it == manifest.meta.end() ? nullptr : &it->second;
  };
  auto get_int = [&](const char* key, int64_t* out) -> absl::Status {
    const std::string* v = get(key);
    if (v == nullptr) return bad(absl::StrCat("no meta '", key, "'"));
    if (!absl::SimpleAtoi(*v, out)) {
      return bad(absl::StrCat("meta '", key, "' is '", *v, "', not an integer"));
    }
    return absl::OkStatus();
  };
  BundleMeta meta;
  TS_RETURN_IF_ERROR(get_int("step", &meta.step));
  const std::string* kind = get("kind");
  if (kind == nullptr) return bad("no meta 'kind'");
  if (*kind != "full" && *kind != "delta") {
    return bad(absl::StrCat("meta 'kind' is '", *kind, "', not full or delta"));
  }
  meta.delta = *kind == "delta";
  if (meta.delta) {
    TS_RETURN_IF_ERROR(get_int("prev", &meta.prev));
  } else if (get("prev") != nullptr) {
    return bad(absl::StrCat("meta 'prev' '", *get("prev"), "' on a full export"));
  }
  TS_RETURN_IF_ERROR(get_int("base", &meta.base));
  int64_t num_pservers;
  TS_RETURN_IF_ERROR(get_int("num_pservers", &num_pservers));
  if (num_pservers < 0 || num_pservers > (int64_t{1} << 30)) {
    return bad(absl::StrCat("meta 'num_pservers' ", num_pservers, " is out of range"));
  }
  meta.num_pservers = static_cast<int>(num_pservers);
  const std::string* method = get("table_shard_method");
  if (method == nullptr) return bad("no meta 'table_shard_method'");
  meta.table_shard_method = *method;
  const std::string problem = BundleMetaProblem(meta);
  if (!problem.empty()) return bad(absl::StrCat("meta ", problem));
  return meta;
}

absl::StatusOr<std::string> SerializeBundleModel(const BundleModel& model) {
  std::string out;
  absl::Status error;
  // One "<key> <values...>" line; every value must be a non-empty token.
  auto line = [&](const char* key, std::initializer_list<std::string> values) {
    if (!error.ok()) return;
    for (const std::string& v : values) {
      if (v.empty() || HasWhitespace(v)) {
        error = absl::InvalidArgumentError(
            absl::StrCat("model spec: ", key, " '", v, "' is empty or holds whitespace"));
        return;
      }
    }
    absl::StrAppend(&out, key);
    for (const std::string& v : values) absl::StrAppend(&out, " ", v);
    out += "\n";
  };
  if (!model.prediction.empty()) line("prediction", {model.prediction});
  if (!model.loss.empty()) line("loss", {model.loss});
  for (const auto& m : model.metrics) line("metric", {m});
  const FeedSpec& f = model.feeds;
  if (!f.dense.empty()) {
    line("dense", {f.dense, absl::StrCat(f.num_dense)});
  } else if (f.num_dense != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec: num_dense ", f.num_dense, " without a dense variable name"));
  }
  for (const auto& s : f.slots) line("slot", {s.name, absl::StrCat(s.dict_size)});
  for (const auto& s : f.multi_slots) line("multi_slot", {s.name, absl::StrCat(s.dict_size)});
  if (!f.label.empty()) {
    const char* dtype = LabelDtypeName(f.label_dtype);
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model spec: label '", f.label, "' has dtype ",
                                                     static_cast<int>(f.label_dtype),
                                                     ", not float32, float64 or int64"));
    }
    line("label", {f.label, dtype});
  }
  line("batch_size", {absl::StrCat(model.batch_size)});
  if (!model.data_format.empty()) line("data_format", {model.data_format});
  line("float_dense", {model.float_dense ? "1" : "0"});
  if (!model.csv_columns.empty()) line("csv_columns", {model.csv_columns});
  if (!error.ok()) return error;
  return out;
}

absl::StatusOr<BundleModel> ParseBundleModel(absl::string_view text, const std::string& path) {
  BundleModel model;
  std::set<std::string> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("model spec ", path, " line ", line_no, ": ", why));
    };
    // Every character SerializeBundleModel refuses inside a value separates fields here.
    std::vector<std::string> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    if (f.empty()) continue;
    const std::string& key = f[0];
    const bool repeated = key == "metric" || key == "slot" || key == "multi_slot";
    if (!repeated && !seen.insert(key).second) {
      return bad(absl::StrCat("'", key, "' given twice"));
    }
    auto want = [&](size_t n, const char* what) -> absl::Status {
      if (f.size() != n + 1) {
        return bad(absl::StrCat("'", key, "' takes ", what, ", got '", line, "'"));
      }
      return absl::OkStatus();
    };
    auto int_at = [&](size_t i, int64_t min, int64_t* out) -> absl::Status {
      if (!absl::SimpleAtoi(f[i], out) || *out < min) {
        return bad(absl::StrCat(key, " '", f[i], "' is not an integer >= ", min));
      }
      return absl::OkStatus();
    };
    if (key == "prediction" || key == "loss" || key == "metric" || key == "data_format" ||
        key == "csv_columns") {
      TS_RETURN_IF_ERROR(want(1, "one value"));
      if (key == "prediction") model.prediction = f[1];
      if (key == "loss") model.loss = f[1];
      if (key == "metric") model.metrics.push_back(f[1]);
      if (key == "data_format") model.data_format = f[1];
      if (key == "csv_columns") model.csv_columns = f[1];
    } else if (key == "dense") {
      TS_RETURN_IF_ERROR(want(2, "a name and a width"));
      int64_t n;
      TS_RETURN_IF_ERROR(int_at(2, 0, &n));
      if (n > (int64_t{1} << 30)) return bad(absl::StrCat("dense width ", n, " is too large"));
      model.feeds.dense = f[1];
      model.feeds.num_dense = static_cast<int>(n);
    } else if (key == "slot" || key == "multi_slot") {
      TS_RETURN_IF_ERROR(want(2, "a name and a dict size"));
      SlotFeed s;
      s.name = f[1];
      TS_RETURN_IF_ERROR(int_at(2, 0, &s.dict_size));
      (key == "slot" ? model.feeds.slots : model.feeds.multi_slots).push_back(s);
    } else if (key == "label") {
      TS_RETURN_IF_ERROR(want(2, "a name and a dtype"));
      if (!ParseLabelDtype(f[2], &model.feeds.label_dtype)) {
        return bad(absl::StrCat("label dtype '", f[2], "' is not float32, float64 or int64"));
      }
      model.feeds.label = f[1];
    } else if (key == "batch_size") {
      TS_RETURN_IF_ERROR(want(1, "one value"));
      TS_RETURN_IF_ERROR(int_at(1, 1, &model.batch_size));
    } else if (key == "float_dense") {
      TS_RETURN_IF_ERROR(want(1, "one value"));
      if (f[1] != "0" && f[1] != "1") {
        return bad(absl::StrCat("float_dense '", f[1], "' is not 0 or 1"));
      }
      model.float_dense = f[1] == "1";
    } else {
      return bad(absl::StrCat("unknown key '", key, "'"));
    }
  }
  return model;
}

absl::StatusOr<std::string> BeginExport(FileSystem* fs, const std::string& root, int64_t step) {
  return BeginStepDir(fs, root, kExportPrefix, step);
}

absl::Status CommitExport(FileSystem* fs, const std::string& dir, const BundleMeta& meta,
                          const std::map<std::string, std::string>& files,
                          const std::vector<std::string>& pserver_manifests) {
  const std::string problem = BundleMetaProblem(meta);
  if (!problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("export ", dir, ": meta ", problem));
  }
  ManifestWriter writer(fs, dir);
  for (const auto& [name, contents] : files) {
    if (name == kManifestName) {
      return absl::InvalidArgumentError(
          absl::StrCat("export ", dir, ": a file may not be named ", kManifestName));
    }
    TS_RETURN_IF_ERROR(writer.WriteFile(name, contents));
  }
  for (const auto& name : pserver_manifests) TS_RETURN_IF_ERROR(writer.AddExisting(name));
  Manifest m;
  PutBundleMeta(meta, &m);
  for (const auto& [k, v] : m.meta) writer.SetMeta(k, v);
  return writer.Commit(kManifestName);
}

absl::Status FinishExport(FileSystem* fs, const std::string& root, int64_t step, int keep) {
  // A kept delta keeps its chain: follow prev back to the base (or to a link that is gone).
  auto chains = [](const std::vector<StepDir>& all, std::set<int64_t>* kept) {
    std::map<int64_t, const StepDir*> by_step;
    for (const StepDir& d : all) by_step.emplace(d.step, &d);
    const std::set<int64_t> roots = *kept;
    for (int64_t s : roots) {
      auto it = by_step.find(s);
      while (it != by_step.end()) {
        const int64_t prev = PrevOf(*it->second);
        if (prev < 0 || !kept->insert(prev).second) break;  // a base, or a chain already kept
        it = by_step.find(prev);
      }
    }
  };
  return FinishStepDir(fs, root, kExportPrefix, step, keep, chains);
}

absl::Status AbandonExport(FileSystem* fs, const std::string& root, int64_t step) {
  return AbandonStepDir(fs, root, kExportPrefix, step);
}

absl::StatusOr<std::vector<BundleLink>> ResolveBundle(FileSystem* fs, const std::string& path) {
  const std::string clean = StripTrailingSlashes(path);
  TS_ASSIGN_OR_RETURN(std::string dir, ResolveStepDir(fs, clean, kExportPrefix, "export"));
  // The directory that holds the chain's exports.
  const std::string root = dir == clean ? DirName(clean) : clean;

  // Reads the export in `link_dir` (whose name is export-<want_step> unless want_step < 0).
  auto read_link = [&](const std::string& link_dir,
                       int64_t want_step) -> absl::StatusOr<BundleLink> {
    BundleLink link;
    link.dir = link_dir;
    const std::string manifest_path = JoinPath(link_dir, kManifestName);
    TS_ASSIGN_OR_RETURN(link.manifest, ReadManifest(fs, manifest_path));
    TS_ASSIGN_OR_RETURN(link.meta, GetBundleMeta(link.manifest, manifest_path));
    if (want_step >= 0 && link.meta.step != want_step) {
      return absl::DataLossError(absl::StrCat("export manifest ", manifest_path, ": meta step ",
                                              link.meta.step, " in ", ExportDirName(want_step)));
    }
    return link;
  };

  std::vector<BundleLink> chain;
  TS_ASSIGN_OR_RETURN(BundleLink newest, read_link(dir, ExportStep(BaseName(dir))));
  chain.push_back(std::move(newest));
  while (chain.back().meta.delta) {
    const BundleLink& cur = chain.back();
    const std::string cur_name = BaseName(cur.dir);
    const std::string prev_name = ExportDirName(cur.meta.prev);
    const std::string prev_dir = JoinPath(root, prev_name);
    if (!fs->Exists(JoinPath(prev_dir, kManifestName))) {
      return absl::FailedPreconditionError(
          absl::StrCat(cur_name, " is a delta on ", prev_name,
                       ", which is missing or incomplete (a gap in the delta chain): no ",
                       JoinPath(prev_dir, kManifestName)));
    }
    TS_ASSIGN_OR_RETURN(BundleLink link, read_link(prev_dir, cur.meta.prev));
    if (link.meta.base != cur.meta.base) {
      return absl::FailedPreconditionError(absl::StrCat(
          cur_name, " (base ", cur.meta.base, ") is a delta on ", prev_name, ", whose base is ",
          link.meta.base, " (", prev_dir, " was replaced by an export of another chain)"));
    }
    chain.push_back(std::move(link));
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

}  // namespace io
}  // namespace tessera
