// Fuzz target: the files an inference bundle loader reads from disk (common/io/bundle.h), all of
// them untrusted. The first byte of the input picks the parser that gets the rest (its value
// modulo 3):
//   0  model.spec text: io::ParseBundleModel;
//   1  a MANIFEST: io::ParseManifest, then io::GetBundleMeta;
//   2  a table file (pserver-<i>-of-<P>.<table>.tbl): SparseTable::ImportBytes into small tables
//      (sgd, adagrad and adam of the header's dim when it is 1 .. 64), each holding a few rows.
// Checksums make a randomly mutated manifest or table file almost never valid, so each is also
// parsed a second time with its checksums recomputed (the manifest's end line; the table's
// header, every whole record and the tombstone trailer), which lets the fuzzer reach the checks
// behind them (meta rules, flags, dim and state width, count and size, duplicate ids, tombstones
// that are also records).
//
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a refusal is one line: INVALID_ARGUMENT (model spec), DATA_LOSS (manifest, its meta),
//     DATA_LOSS or INVALID_ARGUMENT (table file);
//   - a parsed model spec serializes, and the text parses back and serializes the same;
//   - a parsed manifest serializes to text that parses back and serializes the same; a meta that
//     GetBundleMeta accepts follows the chain rules and survives PutBundleMeta;
//   - a refused table file leaves the table as it was (Size() and a full export with optimizer
//     state are unchanged);
//   - an accepted table file loaded what it says: every record (the last one of a repeated id,
//     records beating tombstones of the same id) is a row with the record's values and state
//     (zeros without state), the tombstones that are not records hold no row, the table holds
//     exactly the rows it held before minus the tombstones plus the records, and the count
//     returned is the number of records (with a keep filter: those that pass it).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/io/bundle.h"
#include "common/io/checkpoint_io.h"
#include "common/io/crc32c.h"
#include "pserver/sparse_table.h"

namespace tessera {
namespace {

namespace fmt = sparse_table_format;

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "bundle_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

void RequireOneLine(const absl::Status& s) {
  Require(!s.ok() && !s.message().empty(), "error has a message");
  Require(s.message().find('\n') == absl::string_view::npos, "error message is one line");
}

// ---- model.spec ----

void FuzzModelSpec(absl::string_view text) {
  absl::StatusOr<io::BundleModel> model = io::ParseBundleModel(text, "fuzz/model.spec");
  if (!model.ok()) {
    RequireOneLine(model.status());
    Require(model.status().code() == absl::StatusCode::kInvalidArgument,
            "model spec refusal is INVALID_ARGUMENT");
    return;
  }
  absl::StatusOr<std::string> printed = io::SerializeBundleModel(*model);
  Require(printed.ok(), "a parsed model spec serializes");
  absl::StatusOr<io::BundleModel> back = io::ParseBundleModel(*printed, "printed/model.spec");
  Require(back.ok(), "a serialized model spec parses back");
  absl::StatusOr<std::string> reprinted = io::SerializeBundleModel(*back);
  Require(reprinted.ok() && *reprinted == *printed, "a model spec reserializes the same");
}

// ---- MANIFEST ----

bool SameMeta(const io::BundleMeta& a, const io::BundleMeta& b) {
  return a.step == b.step && a.delta == b.delta && a.prev == b.prev && a.base == b.base &&
         a.num_pservers == b.num_pservers && a.table_shard_method == b.table_shard_method;
}

void FuzzManifestText(absl::string_view text) {
  const std::string path = "fuzz/export-0000000001/MANIFEST";
  absl::StatusOr<io::Manifest> manifest = io::ParseManifest(text, path);
  if (!manifest.ok()) {
    RequireOneLine(manifest.status());
    Require(manifest.status().code() == absl::StatusCode::kDataLoss,
            "manifest refusal is DATA_LOSS");
    return;
  }
  const std::string printed = io::SerializeManifest(*manifest);
  absl::StatusOr<io::Manifest> back = io::ParseManifest(printed, "printed/MANIFEST");
  Require(back.ok(), "a serialized manifest parses back");
  Require(io::SerializeManifest(*back) == printed, "a manifest reserializes the same");
  Require(back->meta == manifest->meta && back->files.size() == manifest->files.size(),
          "a manifest parses back to the same meta and files");

  absl::StatusOr<io::BundleMeta> meta = io::GetBundleMeta(*manifest, path);
  if (!meta.ok()) {
    RequireOneLine(meta.status());
    Require(meta.status().code() == absl::StatusCode::kDataLoss,
            "bundle meta refusal is DATA_LOSS");
    return;
  }
  Require(meta->step >= 0 && meta->num_pservers >= 0, "bundle meta step, pservers >= 0");
  if (meta->delta) {
    Require(meta->prev >= 0 && meta->prev < meta->step && meta->base >= 0 &&
                meta->base <= meta->prev,
            "a delta's prev is earlier and its base at or before prev");
  } else {
    Require(meta->prev == -1 && meta->base == meta->step, "a full export is its own base");
  }
  io::Manifest put;
  io::PutBundleMeta(*meta, &put);
  absl::StatusOr<io::BundleMeta> again = io::GetBundleMeta(put, "put/MANIFEST");
  Require(again.ok() && SameMeta(*again, *meta), "PutBundleMeta then GetBundleMeta is the same");
}

void FuzzManifest(absl::string_view text) {
  FuzzManifestText(text);
  // The same text with the checksum of its (last) end line recomputed and what followed that
  // line dropped, or with an end line added if it has none.
  const size_t end_at = text.rfind("end ");
  std::string body(end_at == absl::string_view::npos ? text : text.substr(0, end_at));
  if (!body.empty() && body.back() != '\n') body += '\n';
  const std::string fixed = absl::StrFormat("%send %08x\n", body, io::Crc32c(body));
  if (fixed != text) FuzzManifestText(fixed);
}

// ---- table files ----

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// A copy of `bytes` with the header CRC, the CRC of every whole record the header's count and the
// size allow, and (flag bit 1) the tombstone trailer's CRC recomputed.
std::string FixChecksums(absl::string_view bytes) {
  std::string f(bytes);
  if (f.size() < fmt::kHeaderBytes) return f;
  char* h = f.data();
  Put<uint32_t>(h + 36, fmt::Crc32c(h, 36));
  const uint64_t dim = Get<uint32_t>(h + 16), state_width = Get<uint32_t>(h + 20);
  const uint64_t count = Get<uint64_t>(h + 24);
  const uint32_t flags = Get<uint32_t>(h + 12);
  const uint64_t record_bytes = 8 + 4 * (dim + state_width) + 4;
  const uint64_t max_count = (f.size() - fmt::kHeaderBytes) / record_bytes;
  for (uint64_t i = 0; i < std::min(count, max_count); ++i) {
    char* r = h + fmt::kHeaderBytes + i * record_bytes;
    Put<uint32_t>(r + record_bytes - 4, fmt::Crc32c(r, record_bytes - 4));
  }
  if ((flags & fmt::kFlagTombstones) == 0 || count > max_count) return f;
  const uint64_t records_end = fmt::kHeaderBytes + count * record_bytes;
  const uint64_t rest = f.size() - records_end;
  if (rest < fmt::kTrailerFixedBytes) return f;
  const uint64_t n = Get<uint64_t>(h + records_end);
  if (n > (rest - fmt::kTrailerFixedBytes) / 8) return f;
  Put<uint32_t>(h + records_end + 8 + 8 * n, fmt::Crc32c(h + records_end, 8 + 8 * n));
  return f;
}

std::set<int64_t> RowIds(const SparseTable& table) {
  std::vector<SparseTableLifecycleRecord> records;
  table.ExportLifecycle(&records);
  std::set<int64_t> ids;
  for (const auto& r : records) {
    if (!r.pending) ids.insert(r.id);
  }
  return ids;
}

// A table of `dim` with `optimizer` holding a few rows (ids that the seed files also use).
std::unique_ptr<SparseTable> NewTable(int64_t dim, const char* optimizer) {
  SparseTableOptions options;
  options.dim = dim;
  options.optimizer = optimizer;
  options.num_shards = 4;
  options.prefault = false;
  options.initializer.seed = 7;
  absl::StatusOr<std::unique_ptr<SparseTable>> table = SparseTable::Create(options);
  Require(table.ok(), "a small table can be created");
  const std::vector<int64_t> ids = {1, 2, 3, -5, 1000};
  std::vector<float> grads(ids.size() * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  Require((*table)->ApplyGradients(ids, grads.data(), 0.1f, 1).ok(), "seed rows are applied");
  return std::move(*table);
}

void ImportInto(SparseTable* table, absl::string_view bytes, bool filtered) {
  SparseTableExportOptions all;
  all.with_optimizer_state = true;
  all.keep_delta_cut = true;
  const std::string before = table->ExportBytes(all);
  const int64_t size_before = table->Size();
  const std::set<int64_t> ids_before = RowIds(*table);
  auto keep = [](int64_t id) { return id % 2 == 0; };
  std::function<bool(int64_t)> filter;
  if (filtered) filter = keep;

  absl::StatusOr<int64_t> loaded = table->ImportBytes(bytes, "fuzz/pserver-0-of-1.emb.tbl", filter);
  if (!loaded.ok()) {
    RequireOneLine(loaded.status());
    Require(loaded.status().code() == absl::StatusCode::kDataLoss ||
                loaded.status().code() == absl::StatusCode::kInvalidArgument,
            "table file refusal is DATA_LOSS or INVALID_ARGUMENT");
    Require(table->Size() == size_before, "a refused table file leaves Size() unchanged");
    Require(table->ExportBytes(all) == before, "a refused table file leaves the rows unchanged");
    return;
  }

  // Accepted: the file is well formed, so its layout can be read directly.
  const char* h = bytes.data();
  const int64_t dim = table->options().dim;
  const int64_t table_state = table->state_width();
  Require(Get<uint32_t>(h + 16) == dim, "an accepted file has the table's dim");
  const uint32_t flags = Get<uint32_t>(h + 12);
  Require((flags & ~(fmt::kFlagOnlyChanged | fmt::kFlagTombstones)) == 0,
          "an accepted file has known flags");
  const uint64_t state_width = Get<uint32_t>(h + 20);
  Require(state_width == 0 || static_cast<int64_t>(state_width) == table_state,
          "an accepted file has no state or the table's");
  const uint64_t count = Get<uint64_t>(h + 24);
  const uint64_t record_bytes = 8 + 4 * (dim + state_width) + 4;
  uint64_t end = fmt::kHeaderBytes + count * record_bytes;
  Require(end <= bytes.size(), "an accepted file holds its records");

  std::map<int64_t, const char*> last;  // id -> its last record
  int64_t passing = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const char* r = h + fmt::kHeaderBytes + i * record_bytes;
    const int64_t id = Get<int64_t>(r);
    if (filter && !filter(id)) continue;
    ++passing;
    last[id] = r;
  }
  std::set<int64_t> dead;
  if (flags & fmt::kFlagTombstones) {
    const uint64_t n = Get<uint64_t>(h + end);
    Require(end + 8 + 8 * n + 4 == bytes.size(), "an accepted trailer ends the file");
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t id = Get<int64_t>(h + end + 8 + 8 * i);
      if (!filter || filter(id)) dead.insert(id);
    }
  } else {
    Require(end == bytes.size(), "an accepted file without trailer ends after its records");
  }
  Require(*loaded == passing, "ImportBytes returns the number of records loaded");

  std::set<int64_t> expected = ids_before;
  for (int64_t id : dead) expected.erase(id);
  for (const auto& [id, r] : last) expected.insert(id);
  Require(table->Size() == static_cast<int64_t>(expected.size()),
          "rows after import = rows before - tombstones + records");
  Require(RowIds(*table) == expected, "the table holds the expected ids");

  std::vector<float> values(dim), state(table_state > 0 ? table_state : 1);
  std::vector<float> want_state(table_state);
  for (const auto& [id, r] : last) {
    Require(table->PeekRow(id, values.data(), state.data()), "a loaded record is a row");
    Require(std::memcmp(values.data(), r + 8, 4 * dim) == 0, "a row has its record's values");
    if (table_state == 0) continue;
    if (state_width > 0) {
      std::memcpy(want_state.data(), r + 8 + 4 * dim, 4 * state_width);
    } else {
      std::fill(want_state.begin(), want_state.end(), 0.0f);
    }
    Require(std::memcmp(state.data(), want_state.data(), 4 * table_state) == 0,
            "a row has its record's state (zeros without state)");
  }
  for (int64_t id : dead) {
    if (last.count(id) == 0) {
      Require(!table->PeekRow(id, values.data()), "a tombstone that is no record holds no row");
    }
  }
}

void ImportAll(absl::string_view bytes) {
  const uint32_t dim = bytes.size() >= fmt::kHeaderBytes ? Get<uint32_t>(bytes.data() + 16) : 0;
  if (dim < 1 || dim > 64) {
    // Refused by the header checks whatever the table: one table will do.
    ImportInto(NewTable(4, "sgd").get(), bytes, false);
    return;
  }
  ImportInto(NewTable(dim, "sgd").get(), bytes, false);
  ImportInto(NewTable(dim, "adagrad").get(), bytes, false);
  ImportInto(NewTable(dim, "adam").get(), bytes, true);
}

void FuzzTable(absl::string_view bytes) {
  ImportAll(bytes);
  const std::string fixed = FixChecksums(bytes);
  if (fixed != bytes) ImportAll(fixed);
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      FuzzModelSpec(rest);
      break;
    case 1:
      FuzzManifest(rest);
      break;
    default:
      FuzzTable(rest);
      break;
  }
  return 0;
}
