#include "pserver/bundle_tables.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "common/ops/sharding.h"

namespace tessera {

namespace {

constexpr char kTablePrefix[] = "table.";

std::string Key(const std::string& table, const char* field) {
  return absl::StrCat(kTablePrefix, table, ".", field);
}

const char* InitName(SparseTableInitializer::Kind kind) {
  switch (kind) {
    case SparseTableInitializer::kGaussian:
      return "gaussian_random";
    case SparseTableInitializer::kConstant:
      return "fill_constant";
    default:
      return "uniform_random";
  }
}

// The pserver manifests an export's MANIFEST lists (pserver-<i>-of-<P>.MANIFEST), by index.
absl::StatusOr<std::vector<io::Manifest>> PserverManifests(io::FileSystem* fs,
                                                           const io::BundleLink& link) {
  std::vector<io::Manifest> out(static_cast<size_t>(link.meta.num_pservers));
  std::vector<bool> seen(out.size(), false);
  for (const io::ManifestEntry& e : link.manifest.files) {
    if (!absl::StartsWith(e.name, "pserver-") || !absl::EndsWith(e.name, ".MANIFEST")) continue;
    int index = -1;
    for (int i = 0; i < link.meta.num_pservers; ++i) {
      if (e.name == io::PserverFilePrefix(i, link.meta.num_pservers) + ".MANIFEST") index = i;
    }
    const std::string path = io::JoinPath(link.dir, e.name);
    if (index < 0) {
      return absl::DataLossError(absl::StrCat("bundle ", link.dir, " lists ", e.name,
                                              ", which is not one of its ", link.meta.num_pservers,
                                              " pservers' manifests"));
    }
    TS_ASSIGN_OR_RETURN(std::string text, io::ReadVerified(fs, link.dir, e));
    TS_ASSIGN_OR_RETURN(out[static_cast<size_t>(index)], io::ParseManifest(text, path));
    seen[static_cast<size_t>(index)] = true;
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) {
      return absl::DataLossError(absl::StrCat(
          "bundle ", link.dir, " lists no ",
          io::PserverFilePrefix(static_cast<int>(i), link.meta.num_pservers), ".MANIFEST"));
    }
  }
  return out;
}

}  // namespace

void PutTableMeta(const std::string& name, const SparseTableOptions& o, io::Manifest* m) {
  auto real = [](double v) { return absl::StrFormat("%.9g", v); };
  m->meta[Key(name, "dim")] = absl::StrCat(o.dim);
  m->meta[Key(name, "init")] = InitName(o.initializer.kind);
  m->meta[Key(name, "min")] = real(o.initializer.min);
  m->meta[Key(name, "max")] = real(o.initializer.max);
  m->meta[Key(name, "mean")] = real(o.initializer.mean);
  m->meta[Key(name, "std")] = real(o.initializer.std);
  m->meta[Key(name, "value")] = real(o.initializer.value);
  m->meta[Key(name, "seed")] = absl::StrCat(o.initializer.seed);
}

std::vector<std::string> TablesInMeta(const io::Manifest& manifest) {
  std::vector<std::string> names;
  const std::string suffix = ".dim";
  for (const auto& [key, value] : manifest.meta) {
    if (absl::StartsWith(key, kTablePrefix) && absl::EndsWith(key, suffix)) {
      names.push_back(key.substr(sizeof(kTablePrefix) - 1,
                                 key.size() - (sizeof(kTablePrefix) - 1) - suffix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<SparseTableOptions> TableOptionsFromMeta(const io::Manifest& manifest,
                                                        const std::string& name,
                                                        const std::string& path) {
  auto get = [&](const char* field) -> absl::StatusOr<std::string> {
    auto it = manifest.meta.find(Key(name, field));
    if (it == manifest.meta.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no meta ", Key(name, field), " for table ", name));
    }
    return it->second;
  };
  auto real = [&](const char* field, double* out) -> absl::Status {
    TS_ASSIGN_OR_RETURN(std::string v, get(field));
    if (!absl::SimpleAtod(v, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": meta ", Key(name, field), " '", v, "' is not a number"));
    }
    return absl::OkStatus();
  };
  SparseTableOptions o;
  TS_ASSIGN_OR_RETURN(std::string dim, get("dim"));
  if (!absl::SimpleAtoi(dim, &o.dim) || o.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": meta ", Key(name, "dim"), " '", dim, "' is not a row width"));
  }
  TS_ASSIGN_OR_RETURN(std::string init, get("init"));
  if (init == "uniform_random") {
    o.initializer.kind = SparseTableInitializer::kUniform;
  } else if (init == "gaussian_random") {
    o.initializer.kind = SparseTableInitializer::kGaussian;
  } else if (init == "fill_constant") {
    o.initializer.kind = SparseTableInitializer::kConstant;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": meta ", Key(name, "init"), " '", init,
                                                   "' is not an initializer"));
  }
  double min, max, mean, std, value;
  TS_RETURN_IF_ERROR(real("min", &min));
  TS_RETURN_IF_ERROR(real("max", &max));
  TS_RETURN_IF_ERROR(real("mean", &mean));
  TS_RETURN_IF_ERROR(real("std", &std));
  TS_RETURN_IF_ERROR(real("value", &value));
  o.initializer.min = min;
  o.initializer.max = max;
  o.initializer.mean = mean;
  o.initializer.std = std;
  o.initializer.value = value;
  TS_ASSIGN_OR_RETURN(std::string seed, get("seed"));
  if (!absl::SimpleAtoi(seed, &o.initializer.seed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": meta ", Key(name, "seed"), " '", seed, "' is not a seed"));
  }
  return o;
}

absl::Status WritePserverExport(io::FileSystem* fs, const std::string& dir, int index,
                                int num_pservers, bool delta,
                                const std::vector<BundleTableRef>& tables) {
  io::ManifestWriter writer(fs, dir);
  const std::string prefix = io::PserverFilePrefix(index, num_pservers);
  SparseTableExportOptions eo;
  eo.only_changed = delta;
  MemberExports exports(eo);  // a group's members under one delta cut
  for (const BundleTableRef& t : tables) {
    TS_RETURN_IF_ERROR(writer.WriteFile(io::BundleTableFileName(index, num_pservers, t.name),
                                        exports.Take(t.table, t.member)));
  }
  io::Manifest meta;
  for (const BundleTableRef& t : tables) {
    PutTableMeta(t.name, t.member < 0 ? t.table->options() : t.table->MemberOptions(t.member),
                 &meta);
  }
  for (const auto& [key, value] : meta.meta) writer.SetMeta(key, value);
  writer.SetMeta("index", absl::StrCat(index));
  writer.SetMeta("num_pservers", absl::StrCat(num_pservers));
  writer.SetMeta("kind", delta ? "delta" : "full");
  return writer.Commit(prefix + ".MANIFEST");
}

absl::Status ApplyBundleDelta(io::FileSystem* fs, const io::BundleLink& link,
                              const BundleTablesOptions& options, BundleTables* tables) {
  ShardMethod method;
  if (!ParseShardMethod(link.meta.table_shard_method, &method)) {
    return absl::DataLossError(absl::StrCat("bundle ", link.dir, ": table_shard_method '",
                                            link.meta.table_shard_method, "'"));
  }
  std::function<bool(int64_t)> keep;
  if (options.num_shards > 1) {
    keep = [n = options.num_shards, me = options.shard, method](int64_t id) {
      return ShardOf(id, n, method) == me;
    };
  }
  TS_ASSIGN_OR_RETURN(std::vector<io::Manifest> manifests, PserverManifests(fs, link));
  for (int i = 0; i < link.meta.num_pservers; ++i) {
    const io::Manifest& m = manifests[static_cast<size_t>(i)];
    const std::string manifest_path =
        io::JoinPath(link.dir, io::PserverFilePrefix(i, link.meta.num_pservers) + ".MANIFEST");
    for (const std::string& name : TablesInMeta(m)) {
      std::unique_ptr<SparseTable>& table = (*tables)[name];
      if (table == nullptr) {
        TS_ASSIGN_OR_RETURN(SparseTableOptions o, TableOptionsFromMeta(m, name, manifest_path));
        if (options.table_shards > 0) o.num_shards = options.table_shards;
        auto created = SparseTable::Create(o);
        if (!created.ok()) {
          return absl::DataLossError(absl::StrCat(manifest_path, ": table ", name, ": ",
                                                  created.status().message()));
        }
        table = std::move(*created);
      }
      const std::string file = io::BundleTableFileName(i, link.meta.num_pservers, name);
      const io::ManifestEntry* entry = m.Find(file);
      if (entry == nullptr) {
        return absl::DataLossError(absl::StrCat(manifest_path, " describes table ", name,
                                                " but lists no ", file));
      }
      TS_ASSIGN_OR_RETURN(std::string bytes, io::ReadVerified(fs, link.dir, *entry));
      TS_RETURN_IF_ERROR(
          table->ImportBytes(bytes, io::JoinPath(link.dir, file), keep).status());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BundleTables> LoadBundleTables(io::FileSystem* fs,
                                              const std::vector<io::BundleLink>& chain,
                                              const BundleTablesOptions& options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("bundle tables: shard ", options.shard, " of ",
                                                   options.num_shards));
  }
  BundleTables tables;
  for (const io::BundleLink& link : chain) {
    TS_RETURN_IF_ERROR(ApplyBundleDelta(fs, link, options, &tables));
  }
  return tables;
}

}  // namespace tessera
