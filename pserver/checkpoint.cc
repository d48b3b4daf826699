#include "pserver/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/io/checkpoint_io.h"
#include "common/ops/sharding.h"
#include "proto/tensor.pb.h"

namespace tessera {

namespace {

constexpr size_t kLifeRecordBytes = 20;  // int64 id | uint32 seen | uint32 count | uint32 pending

const VarDesc* FindVar(const ProgramDesc& program, const std::string& name) {
  for (const auto& b : program.blocks()) {
    for (const auto& v : b.vars()) {
      if (v.name() == name) return &v;
    }
  }
  return nullptr;
}

std::vector<int64_t> ShapeOf(const VarDesc& v) { return {v.shape().begin(), v.shape().end()}; }

// `name` without a trailing ".block<index>".
std::string StripBlockSuffix(const std::string& name, int index) {
  const std::string suffix = absl::StrCat(".block", index);
  if (absl::EndsWith(name, suffix)) return name.substr(0, name.size() - suffix.size());
  return name;
}

template <typename T>
T GetLE(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

struct SavedShard {
  std::string prefix;
  io::Manifest manifest;
  int64_t step = 0;
  std::map<std::string, DenseSlice> slices;
  std::map<std::string, std::pair<int, int64_t>> tables;  // name -> (shard, applies)
  std::map<std::string, Tensor> dense;
};

absl::Status ParseMeta(const std::string& text, const std::string& path, SavedShard* out) {
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_no;
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    bool ok = true;
    if (f.size() == 2 && f[0] == "step") {
      ok = absl::SimpleAtoi(f[1], &out->step);
    } else if (f.size() == 6 && f[0] == "slice") {
      DenseSlice s;
      s.origin = f[2];
      ok = absl::SimpleAtoi(f[3], &s.begin_row) && absl::SimpleAtoi(f[4], &s.rows) &&
           absl::SimpleAtoi(f[5], &s.origin_rows);
      out->slices[f[1]] = s;
    } else if (f.size() == 4 && f[0] == "table") {
      int shard;
      int64_t applies;
      ok = absl::SimpleAtoi(f[2], &shard) && absl::SimpleAtoi(f[3], &applies);
      out->tables[f[1]] = {shard, applies};
    } else {
      ok = false;
    }
    if (!ok) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, ": malformed line ", line_no));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, DenseSlice> DenseSlices(const ProgramDesc& program,
                                              const std::vector<VarBlock>& param_blocks) {
  std::map<std::string, const VarBlock*> by_name;
  std::map<std::string, int64_t> origin_rows;
  for (const auto& b : param_blocks) {
    by_name[b.name] = &b;
    origin_rows[b.var] = std::max(origin_rows[b.var], b.begin_row + b.num_rows);
  }
  std::map<std::string, DenseSlice> out;
  auto copy_of = [](const std::string& origin) {
    DenseSlice s;
    s.origin = origin;
    return s;
  };
  // Variables of optimize blocks, classified against the block's parameter slice.
  for (int bi = 1; bi < program.blocks_size(); ++bi) {
    const VarBlock* param = nullptr;
    for (const auto& op : program.blocks(bi).ops()) {
      auto rv = GetStringsAttr(op, kOpRoleVarAttr);
      if (!rv.empty() && by_name.count(rv[0]) > 0) param = by_name[rv[0]];
    }
    if (param == nullptr) continue;
    const bool sliced = param->name != param->var;
    for (const auto& op : program.blocks(bi).ops()) {
      std::vector<std::string> args = AllInputArgs(op);
      for (const auto& a : AllOutputArgs(op)) args.push_back(a);
      for (const auto& a : args) {
        const VarDesc* v = FindVar(program, a);
        if (v == nullptr || !v->persistable() || out.count(a) > 0) continue;
        const std::string origin = sliced ? StripBlockSuffix(a, param->index) : a;
        if (ShapeOf(*v) == param->shape) {
          DenseSlice s;
          s.origin = a == param->name ? param->var : origin;
          s.begin_row = param->begin_row;
          s.rows = param->num_rows;
          s.origin_rows = origin_rows[param->var];
          out[a] = s;
        } else {
          out[a] = copy_of(origin);
        }
      }
    }
  }
  for (const auto& b : program.blocks()) {
    for (const auto& v : b.vars()) {
      if (v.persistable() && out.count(v.name()) == 0) out[v.name()] = copy_of(v.name());
    }
  }
  return out;
}

absl::Status SavePserverShard(io::FileSystem* fs, const std::string& dir,
                              const PserverShardToSave& shard) {
  const std::string prefix = io::PserverFilePrefix(shard.index, shard.num_pservers);
  io::ManifestWriter writer(fs, dir);
  TensorMap map;
  for (const auto& [name, t] : shard.dense) TensorToProto(t, &(*map.mutable_tensors())[name]);
  std::string bytes;
  if (!map.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("cannot serialize the dense variables of ", prefix));
  }
  TS_RETURN_IF_ERROR(writer.WriteFile(prefix + ".dense", bytes));
  std::string meta = absl::StrCat("step ", shard.step, "\n");
  for (const auto& [name, s] : shard.slices) {
    if (shard.dense.count(name) == 0) continue;
    absl::StrAppend(&meta, "slice ", name, " ", s.origin, " ", s.begin_row, " ", s.rows, " ",
                    s.origin_rows, "\n");
  }
  for (const auto& t : shard.tables) {
    absl::StrAppend(&meta, "table ", t.name, " ", t.shard, " ", t.applies, "\n");
  }
  TS_RETURN_IF_ERROR(writer.WriteFile(prefix + ".meta", meta));
  SparseTableExportOptions eo;
  eo.with_optimizer_state = true;
  eo.keep_delta_cut = true;  // a checkpoint takes no rows from the next serving delta
  MemberExports exports(eo);
  std::map<const SparseTable*, std::string> life_bytes;
  for (const auto& t : shard.tables) {
    // The table's export bytes go through `fs` like every other file of the checkpoint; a
    // member's are the file of that table alone.
    TS_RETURN_IF_ERROR(writer.WriteFile(absl::StrCat(prefix, ".", t.name, ".tbl"),
                                        exports.Take(t.table, t.member)));
    // Last-seen stamps and pending admission counts: 20-byte records, the same for every member
    // of a table (encoded once).
    std::string& bytes = life_bytes[t.table];
    if (bytes.empty()) {
      std::vector<SparseTableLifecycleRecord> life;
      t.table->ExportLifecycle(&life);
      bytes.assign(life.size() * kLifeRecordBytes, '\0');
      for (size_t i = 0; i < life.size(); ++i) {
        char* r = &bytes[i * kLifeRecordBytes];
        const uint32_t pending = life[i].pending ? 1 : 0;
        std::memcpy(r, &life[i].id, 8);
        std::memcpy(r + 8, &life[i].seen, 4);
        std::memcpy(r + 12, &life[i].count, 4);
        std::memcpy(r + 16, &pending, 4);
      }
    }
    TS_RETURN_IF_ERROR(writer.WriteFile(absl::StrCat(prefix, ".", t.name, ".life"), bytes));
  }
  writer.SetMeta("pserver_index", absl::StrCat(shard.index));
  writer.SetMeta("num_pservers", absl::StrCat(shard.num_pservers));
  writer.SetMeta("step", absl::StrCat(shard.step));
  return writer.Commit(prefix + ".MANIFEST");
}

absl::StatusOr<PserverRestored> RestorePserverShard(io::FileSystem* fs, const std::string& ckpt_dir,
                                                    const PserverRestoreTarget& target) {
  const std::string top_path = io::JoinPath(ckpt_dir, io::kManifestName);
  TS_ASSIGN_OR_RETURN(io::Manifest top, io::ReadManifest(fs, top_path));
  TS_ASSIGN_OR_RETURN(int64_t num, top.IntMeta("num_pservers", top_path));
  if (num < 1 || num > 100000) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", top_path, ": num_pservers ", num));
  }
  std::vector<SavedShard> saved(static_cast<size_t>(num));
  for (int i = 0; i < num; ++i) {
    SavedShard& s = saved[i];
    s.prefix = io::PserverFilePrefix(i, static_cast<int>(num));
    const io::ManifestEntry* e = top.Find(s.prefix + ".MANIFEST");
    if (e == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint manifest ", top_path, " lists no ", s.prefix, ".MANIFEST"));
    }
    TS_ASSIGN_OR_RETURN(std::string text, io::ReadVerified(fs, ckpt_dir, *e));
    TS_ASSIGN_OR_RETURN(s.manifest, io::ParseManifest(text, io::JoinPath(ckpt_dir, e->name)));
    for (const char* part : {".meta", ".dense"}) {
      const std::string name = s.prefix + part;
      const io::ManifestEntry* f = s.manifest.Find(name);
      if (f == nullptr) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", ckpt_dir, ": ", s.prefix, ".MANIFEST lists no ", name));
      }
      TS_ASSIGN_OR_RETURN(std::string data, io::ReadVerified(fs, ckpt_dir, *f));
      const std::string path = io::JoinPath(ckpt_dir, name);
      if (std::string(part) == ".meta") {
        TS_RETURN_IF_ERROR(ParseMeta(data, path, &s));
        continue;
      }
      TensorMap map;
      if (!map.ParseFromString(data)) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": not a tensor map"));
      }
      for (const auto& [n, proto] : map.tensors()) {
        absl::Status st = TensorFromProto(proto, &s.dense[n]);
        if (!st.ok()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint file ", path, ": variable ", n, ": ", st.message()));
        }
      }
    }
  }
  PserverRestored result;
  result.saved_pservers = static_cast<int>(num);
  result.step = saved[0].step;

  // Dense variables: assembled from the saved slices of their origin.
  for (const auto& [name, want] : target.slices) {
    Variable* var = target.scope->FindVar(name);
    if (var == nullptr || !var->Is<Tensor>() || !var->Get<Tensor>().initialized()) continue;
    Tensor* t = var->GetMutable<Tensor>();
    const int64_t rows = t->rank() == 0 ? 1 : t->dim(0);
    const size_t row_bytes = rows == 0 ? 0 : t->nbytes() / static_cast<size_t>(rows);
    const int64_t begin = want.begin_row < 0 ? 0 : want.begin_row;
    std::vector<bool> filled(static_cast<size_t>(rows), false);
    for (const auto& s : saved) {
      for (const auto& [sname, have] : s.slices) {
        if (have.origin != want.origin) continue;
        const Tensor& src = s.dense.at(sname);
        if (src.dtype() != t->dtype()) {
          return absl::DataLossError(absl::StrCat("checkpoint ", ckpt_dir, ": variable ", sname,
                                                  " of ", s.prefix, " is ",
                                                  DataTypeName(src.dtype()), ", this pserver's ",
                                                  name, " is ", DataTypeName(t->dtype())));
        }
        const int64_t src_rows = src.rank() == 0 ? 1 : src.dim(0);
        const size_t src_row_bytes =
            src_rows == 0 ? 0 : src.nbytes() / static_cast<size_t>(src_rows);
        if (have.begin_row < 0 || want.begin_row < 0) {
          // Whole copies: only a tensor of the same shape will do.
          if (src.shape() != t->shape() || !(have.begin_row < 0 || have.rows == have.origin_rows)) {
            continue;
          }
          std::memcpy(t->raw_data(), src.raw_data(), t->nbytes());
          std::fill(filled.begin(), filled.end(), true);
          continue;
        }
        if (src_row_bytes != row_bytes) {
          return absl::DataLossError(absl::StrCat("checkpoint ", ckpt_dir, ": variable ", sname,
                                                  " of ", s.prefix, " has rows of ", src_row_bytes,
                                                  " bytes, this pserver's ", name, " ", row_bytes));
        }
        const int64_t lo = std::max(begin, have.begin_row);
        const int64_t hi = std::min(begin + rows, have.begin_row + have.rows);
        for (int64_t r = lo; r < hi; ++r) {
          std::memcpy(static_cast<char*>(t->raw_data()) + (r - begin) * row_bytes,
                      static_cast<const char*>(src.raw_data()) + (r - have.begin_row) * row_bytes,
                      row_bytes);
          filled[static_cast<size_t>(r - begin)] = true;
        }
      }
    }
    const auto missing = std::find(filled.begin(), filled.end(), false);
    if (missing != filled.end()) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", ckpt_dir, " has no value for row ",
                                              begin + (missing - filled.begin()), " of variable ",
                                              want.origin, " (needed by this pserver's ", name,
                                              "; was it saved by a different model?)"));
    }
  }

  // Table shards: every saved shard's rows that this pserver owns now.
  ShardMethod method;
  if (!ParseShardMethod(target.table_shard_method, &method)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table_shard_method '", target.table_shard_method, "'"));
  }
  for (const auto& t : target.tables) {
    // The ids this table shard owns now (resharding): of the pserver count, or every id of a
    // table held whole.
    const int shards = t.num_shards > 0 ? t.num_shards : target.num_pservers;
    auto mine = [&](int64_t id) { return ShardOf(id, shards, method) == t.shard; };
    int64_t applies = 0;
    for (const auto& s : saved) {
      auto it = s.tables.find(t.name);
      if (it == s.tables.end()) continue;
      applies = std::max(applies, it->second.second);
      const std::string name = absl::StrCat(s.prefix, ".", t.name, ".tbl");
      const io::ManifestEntry* f = s.manifest.Find(name);
      if (f == nullptr) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", ckpt_dir, ": ", s.prefix, ".MANIFEST lists no ", name));
      }
      TS_ASSIGN_OR_RETURN(std::string data, io::ReadVerified(fs, ckpt_dir, *f));
      TS_ASSIGN_OR_RETURN(int64_t loaded,
                          t.table->ImportBytes(data, io::JoinPath(ckpt_dir, name), mine, t.member));
      result.table_rows += loaded;
    }
    // Then the last-seen stamps and pending admission counts of the ids it owns now.
    for (const auto& s : saved) {
      if (s.tables.count(t.name) == 0) continue;
      const std::string name = absl::StrCat(s.prefix, ".", t.name, ".life");
      const io::ManifestEntry* f = s.manifest.Find(name);
      if (f == nullptr) continue;
      TS_ASSIGN_OR_RETURN(std::string data, io::ReadVerified(fs, ckpt_dir, *f));
      if (data.size() % kLifeRecordBytes != 0) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", io::JoinPath(ckpt_dir, name),
                                                ": size ", data.size(), " is not a multiple of ",
                                                kLifeRecordBytes));
      }
      std::vector<SparseTableLifecycleRecord> life;
      for (size_t at = 0; at < data.size(); at += kLifeRecordBytes) {
        const char* r = data.data() + at;
        SparseTableLifecycleRecord rec;
        rec.id = GetLE<int64_t>(r);
        if (!mine(rec.id)) continue;
        rec.seen = GetLE<uint32_t>(r + 8);
        rec.count = GetLE<uint32_t>(r + 12);
        rec.pending = GetLE<uint32_t>(r + 16) != 0;
        life.push_back(rec);
      }
      t.table->ImportLifecycle(life);
    }
    result.table_applies[t.name] = applies;
  }
  return result;
}

}  // namespace tessera
