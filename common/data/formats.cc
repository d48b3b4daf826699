#include "common/data/formats.h"

#include <cmath>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/data/criteo.h"
#include "common/data/rng.h"
#include "common/data/text_fields.h"
#include "common/base/status.h"

namespace tessera {
namespace data {
namespace {

using text_fields::ParseFinite;
using text_fields::ParseInt64;
using text_fields::Quote;

absl::Status FieldError(size_t field, absl::string_view name, absl::string_view what,
                        absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("field ", field + 1, " (", name, "): ", what, " ", Quote(text)));
}

// A categorical value: a decimal int64 is that id, "" is 0, any other text its hash.
int64_t IdOf(absl::string_view text) {
  int64_t id = 0;
  if (text.empty() || ParseInt64(text, &id)) return id;
  return HashId(text);
}

// The tokens of `line` separated by spaces or tabs.
void SplitWords(absl::string_view line, std::vector<absl::string_view>* tokens) {
  tokens->clear();
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) tokens->push_back(line.substr(start, i - start));
  }
}

absl::Status CheckCounts(const DataSchema& s) {
  if (s.num_dense < 0 || s.num_sparse < 0 || s.num_multi < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data schema: num_dense=", s.num_dense, ", num_sparse=", s.num_sparse,
        " and num_multi=", s.num_multi, " must be >= 0"));
  }
  return absl::OkStatus();
}

class CriteoParser : public LineParser {
 public:
  explicit CriteoParser(const DataSchema& s) : s_(s) {}
  absl::Status Parse(absl::string_view line, Example* example) override {
    return ParseCriteoLine(line, s_.num_dense, s_.num_sparse, example, s_.num_multi,
                           s_.float_dense);
  }

 private:
  DataSchema s_;
};

// Splits one CSV record; quoted fields with "" inside are unescaped into `storage`.
absl::Status SplitCsv(absl::string_view line, std::vector<absl::string_view>* fields,
                      std::deque<std::string>* storage) {
  fields->clear();
  storage->clear();
  size_t pos = 0;
  while (true) {
    if (pos < line.size() && line[pos] == '"') {
      std::string value;
      bool escaped = false;
      size_t i = pos + 1;
      for (;; ++i) {
        if (i >= line.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("field ", fields->size() + 1, ": a quote is not closed"));
        }
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            escaped = true;
            value.push_back('"');
            ++i;
            continue;
          }
          break;
        }
        value.push_back(line[i]);
      }
      // i is the closing quote.
      if (escaped) {
        storage->push_back(std::move(value));
        fields->push_back(storage->back());
      } else {
        fields->push_back(line.substr(pos + 1, i - pos - 1));
      }
      pos = i + 1;
      if (pos == line.size()) return absl::OkStatus();
      if (line[pos] != ',') {
        return absl::InvalidArgumentError(absl::StrCat(
            "field ", fields->size(), ": text after its closing quote: ", Quote(line.substr(pos))));
      }
      ++pos;
      continue;
    }
    size_t comma = line.find(',', pos);
    if (comma == absl::string_view::npos) {
      fields->push_back(line.substr(pos));
      return absl::OkStatus();
    }
    fields->push_back(line.substr(pos, comma - pos));
    pos = comma + 1;
  }
}

class CsvParser : public LineParser {
 public:
  explicit CsvParser(const DataSchema& s) : s_(s) {
    CsvColumns& c = s_.csv;
    if (c.dense.empty()) {
      for (int i = 1; i <= s.num_dense; ++i) c.dense.push_back(absl::StrCat("I", i));
    }
    if (c.slots.empty()) {
      for (int i = 1; i <= s.num_sparse; ++i) c.slots.push_back(absl::StrCat("C", i));
    }
    if (c.multi.empty()) {
      for (int i = 1; i <= s.num_multi; ++i) c.multi.push_back(absl::StrCat("M", i));
    }
  }

  absl::Status Check() const {
    const CsvColumns& c = s_.csv;
    auto check = [](const char* what, size_t got, int want) -> absl::Status {
      if (got == static_cast<size_t>(want)) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat("CSV columns: ", got, " ", what,
                                                     " columns named, the model feeds ", want));
    };
    TS_RETURN_IF_ERROR(check("dense", c.dense.size(), s_.num_dense));
    TS_RETURN_IF_ERROR(check("slot", c.slots.size(), s_.num_sparse));
    return check("multi-hot", c.multi.size(), s_.num_multi);
  }

  bool has_header() const override { return true; }

  absl::Status Header(absl::string_view line) override {
    TS_RETURN_IF_ERROR(SplitCsv(line, &fields_, &storage_));
    std::map<std::string, size_t, std::less<>> index;
    for (size_t i = 0; i < fields_.size(); ++i) index.emplace(std::string(fields_[i]), i);
    names_.clear();
    for (absl::string_view f : fields_) names_.emplace_back(f);
    auto find = [&](const std::string& name, size_t* at) -> absl::Status {
      auto it = index.find(name);
      if (it == index.end()) {
        return absl::InvalidArgumentError(absl::StrCat("the CSV header has no column '", name,
                                                       "' (it has: ", absl::StrJoin(names_, ","),
                                                       ")"));
      }
      *at = it->second;
      return absl::OkStatus();
    };
    const CsvColumns& c = s_.csv;
    TS_RETURN_IF_ERROR(find(c.label, &label_));
    for (const auto& [names, at] : {std::make_pair(&c.dense, &dense_), std::make_pair(&c.slots, &slots_),
                              std::make_pair(&c.multi, &multi_)}) {
      at->clear();
      for (const std::string& name : *names) {
        size_t i = 0;
        TS_RETURN_IF_ERROR(find(name, &i));
        at->push_back(i);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Parse(absl::string_view line, Example* example) override {
    if (names_.empty()) return absl::FailedPreconditionError("CSV line before the header");
    TS_RETURN_IF_ERROR(SplitCsv(line, &fields_, &storage_));
    if (fields_.size() != names_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("expected ", names_.size(),
                                                     " comma-separated fields (the header's), got ",
                                                     fields_.size(), " in ", Quote(line)));
    }
    if (!ParseFinite(fields_[label_], false, &example->label)) {
      return FieldError(label_, names_[label_], "label is not a finite number:", fields_[label_]);
    }
    example->dense.resize(dense_.size());
    for (size_t i = 0; i < dense_.size(); ++i) {
      const size_t f = dense_[i];
      if (!ParseFinite(fields_[f], true, &example->dense[i])) {
        return FieldError(f, names_[f], "dense value is not a finite number:", fields_[f]);
      }
    }
    example->sparse.resize(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) example->sparse[i] = IdOf(fields_[slots_[i]]);
    example->multi.resize(multi_.size());
    for (size_t i = 0; i < multi_.size(); ++i) {
      std::vector<int64_t>& ids = example->multi[i];
      ids.clear();
      const absl::string_view text = fields_[multi_[i]];
      if (text.empty()) continue;
      for (absl::string_view id : absl::StrSplit(text, '|')) ids.push_back(IdOf(id));
    }
    return absl::OkStatus();
  }

 private:
  DataSchema s_;
  std::vector<std::string> names_;  // the header's
  size_t label_ = 0;
  std::vector<size_t> dense_, slots_, multi_;
  std::vector<absl::string_view> fields_;
  std::deque<std::string> storage_;
};

class LibsvmParser : public LineParser {
 public:
  explicit LibsvmParser(const DataSchema& s) : s_(s) {}
  absl::Status Parse(absl::string_view line, Example* example) override {
    SplitWords(line, &tokens_);
    if (tokens_.empty()) return absl::InvalidArgumentError("expected a label");
    if (!ParseFinite(tokens_[0], false, &example->label)) {
      return FieldError(0, "label", "label is not a finite number:", tokens_[0]);
    }
    if (example->label == -1) example->label = 0;
    example->dense.assign(static_cast<size_t>(s_.num_dense), 0.0f);
    example->sparse.clear();
    example->multi.resize(static_cast<size_t>(s_.num_multi));
    if (s_.num_multi > 0) example->multi[0].clear();
    for (size_t f = 1; f < tokens_.size(); ++f) {
      const absl::string_view t = tokens_[f];
      const size_t colon = t.find(':');
      int64_t index = -1;
      float value = 0;
      if (colon == absl::string_view::npos || !ParseInt64(t.substr(0, colon), &index) ||
          index < 0 || !ParseFinite(t.substr(colon + 1), false, &value)) {
        return FieldError(f, "feature", "not index:value with a 0-based index:", t);
      }
      if (index < s_.num_dense) {
        example->dense[static_cast<size_t>(index)] = value;
      } else if (s_.num_multi == 1 && value == 1) {
        example->multi[0].push_back(index);
      } else {
        return FieldError(f, "feature",
                          s_.num_multi == 1
                              ? "an id index (>= the dense count) must have value 1:"
                              : "index is not below the dense count (and the model has no "
                                "multi-hot slot for ids):",
                          t);
      }
    }
    return absl::OkStatus();
  }

 private:
  DataSchema s_;
  std::vector<absl::string_view> tokens_;
};

class MultiSlotParser : public LineParser {
 public:
  explicit MultiSlotParser(const DataSchema& s) : s_(s) {}
  absl::Status Parse(absl::string_view line, Example* example) override {
    SplitWords(line, &tokens_);
    size_t pos = 0;
    // The count of the next slot, which must be `want` (-1: any).
    auto count = [&](absl::string_view slot, int64_t want, int64_t* n) -> absl::Status {
      if (pos >= tokens_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("the line ends before slot ", slot));
      }
      if (!ParseInt64(tokens_[pos], n) || *n < 0 || (want >= 0 && *n != want) ||
          static_cast<size_t>(*n) > tokens_.size() - pos - 1) {
        return FieldError(pos, absl::StrCat("count of ", slot),
                          want >= 0 ? absl::StrCat("must be ", want, " (and its values follow):")
                                    : std::string("is not a count of the values that follow:"),
                          tokens_[pos]);
      }
      ++pos;
      return absl::OkStatus();
    };
    auto id = [&](absl::string_view slot, int64_t* out) -> absl::Status {
      if (!ParseInt64(tokens_[pos], out)) {
        return FieldError(pos, slot, "id is not a decimal int64:", tokens_[pos]);
      }
      ++pos;
      return absl::OkStatus();
    };
    int64_t n = 0;
    TS_RETURN_IF_ERROR(count("label", 1, &n));
    if (!ParseFinite(tokens_[pos], false, &example->label)) {
      return FieldError(pos, "label", "label is not a finite number:", tokens_[pos]);
    }
    ++pos;
    example->dense.resize(static_cast<size_t>(s_.num_dense));
    if (s_.num_dense > 0) {
      TS_RETURN_IF_ERROR(count("dense", s_.num_dense, &n));
      for (int i = 0; i < s_.num_dense; ++i, ++pos) {
        if (!ParseFinite(tokens_[pos], false, &example->dense[static_cast<size_t>(i)])) {
          return FieldError(pos, "dense", "value is not a finite number:", tokens_[pos]);
        }
      }
    }
    example->sparse.resize(static_cast<size_t>(s_.num_sparse));
    for (int i = 0; i < s_.num_sparse; ++i) {
      const std::string slot = absl::StrCat("C", i + 1);
      TS_RETURN_IF_ERROR(count(slot, 1, &n));
      TS_RETURN_IF_ERROR(id(slot, &example->sparse[static_cast<size_t>(i)]));
    }
    example->multi.resize(static_cast<size_t>(s_.num_multi));
    for (int i = 0; i < s_.num_multi; ++i) {
      const std::string slot = absl::StrCat("M", i + 1);
      TS_RETURN_IF_ERROR(count(slot, -1, &n));
      std::vector<int64_t>& ids = example->multi[static_cast<size_t>(i)];
      ids.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) TS_RETURN_IF_ERROR(id(slot, &ids[static_cast<size_t>(j)]));
    }
    if (pos != tokens_.size()) {
      return FieldError(pos, "end", "more values than the slots hold:", tokens_[pos]);
    }
    return absl::OkStatus();
  }

 private:
  DataSchema s_;
  std::vector<absl::string_view> tokens_;
};

}  // namespace

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  if (name == "criteo") return DataFormat::kCriteo;
  if (name == "csv") return DataFormat::kCsv;
  if (name == "libsvm") return DataFormat::kLibsvm;
  if (name == "multislot") return DataFormat::kMultiSlot;
  if (name == "idx") return DataFormat::kIdx;
  return absl::InvalidArgumentError(absl::StrCat(
      "data format '", name, "' is not one of criteo, csv, libsvm, multislot, idx"));
}

const char* DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kCriteo:
      return "criteo";
    case DataFormat::kCsv:
      return "csv";
    case DataFormat::kLibsvm:
      return "libsvm";
    case DataFormat::kMultiSlot:
      return "multislot";
    case DataFormat::kIdx:
      return "idx";
  }
  return "?";
}

absl::StatusOr<CsvColumns> ParseCsvColumns(absl::string_view spec) {
  CsvColumns c;
  for (absl::string_view part : absl::StrSplit(spec, ';', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    const absl::string_view key = part.substr(0, eq);
    const absl::string_view value = eq == absl::string_view::npos ? "" : part.substr(eq + 1);
    std::vector<std::string> names = absl::StrSplit(value, ',', absl::SkipEmpty());
    if (eq == absl::string_view::npos || names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CSV columns part '", part, "' is not key=column[,column...] (keys: label, dense, "
          "slots, multi)"));
    }
    if (key == "label" && names.size() == 1) {
      c.label = names[0];
    } else if (key == "dense") {
      c.dense = std::move(names);
    } else if (key == "slots") {
      c.slots = std::move(names);
    } else if (key == "multi") {
      c.multi = std::move(names);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "CSV columns part '", part, "': the key is not label (one column), dense, slots or "
          "multi"));
    }
  }
  return c;
}

int64_t HashId(absl::string_view text) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then a full-avalanche finish
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return static_cast<int64_t>(Mix64(h));
}

absl::StatusOr<std::unique_ptr<LineParser>> NewLineParser(const DataSchema& schema) {
  TS_RETURN_IF_ERROR(CheckCounts(schema));
  switch (schema.format) {
    case DataFormat::kCriteo:
      return std::unique_ptr<LineParser>(new CriteoParser(schema));
    case DataFormat::kCsv: {
      auto parser = std::make_unique<CsvParser>(schema);
      TS_RETURN_IF_ERROR(parser->Check());
      return std::unique_ptr<LineParser>(std::move(parser));
    }
    case DataFormat::kLibsvm:
      if (schema.num_sparse > 0 || schema.num_multi > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "libsvm data holds dense features and at most one multi-hot slot of ids; the model "
            "feeds ", schema.num_sparse, " categorical and ", schema.num_multi,
            " multi-hot slots"));
      }
      return std::unique_ptr<LineParser>(new LibsvmParser(schema));
    case DataFormat::kMultiSlot:
      return std::unique_ptr<LineParser>(new MultiSlotParser(schema));
    case DataFormat::kIdx:
      return absl::InvalidArgumentError(
          "idx data is not line-based: it is read whole (ReadIdxData), not line by line");
  }
  return absl::InvalidArgumentError("unknown data format");
}

}  // namespace data
}  // namespace tessera
