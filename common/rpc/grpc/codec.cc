#include "common/rpc/grpc/codec.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/printable.h"
#include "common/base/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/wire_format_lite.h"

namespace tessera {

namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kRowsField = 14;
constexpr int kPayloadField = 15;

// A slice that keeps a tensor buffer alive.
grpc::Slice BufferSlice(const std::shared_ptr<char>& buffer, size_t offset, size_t length) {
  auto* holder = new std::shared_ptr<char>(buffer);
  return grpc::Slice(
      buffer.get() + offset, length, [](void* p) { delete static_cast<std::shared_ptr<char>*>(p); },
      holder);
}

// Reads the slices of a ByteBuffer as one stream.
class SliceInputStream : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>* slices) : slices_(slices) {}
  bool Next(const void** data, int* size) override {
    while (index_ < slices_->size()) {
      const grpc::Slice& s = (*slices_)[index_];
      if (offset_ < s.size()) {
        *data = s.begin() + offset_;
        *size = static_cast<int>(s.size() - offset_);
        total_ += *size;
        offset_ = s.size();
        return true;
      }
      ++index_;
      offset_ = 0;
    }
    return false;
  }
  void BackUp(int count) override {
    offset_ -= count;
    total_ -= count;
  }
  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return total_; }

 private:
  const std::vector<grpc::Slice>* slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  int64_t total_ = 0;
};

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed variable message: ", what));
}

}  // namespace

RequestHeader ToHeader(const RequestMeta& meta) {
  RequestHeader h;
  h.set_job_id(meta.job_id);
  h.set_trainer_id(meta.trainer_id);
  h.set_step(meta.step);
  h.set_last_batch(meta.last_batch);
  return h;
}

RequestMeta FromHeader(const RequestHeader& header) {
  return RequestMeta{header.job_id(), header.trainer_id(), header.step(), header.last_batch()};
}

namespace {

constexpr int kHeaderField = 1;
constexpr int kNameField = 2;
constexpr int kTypeField = 3;
constexpr int kDtypeField = 4;
constexpr int kDimsField = 5;
constexpr int kHeightField = 6;
constexpr int kChunkOffsetField = 7;
constexpr int kTotalBytesField = 8;
constexpr int kRowsOfEntryField = 16;

constexpr int kBatchHeaderField = 1;
constexpr int kBatchVarsField = 2;
constexpr int kBatchSendBarrierField = 3;
constexpr int kBatchGetNamesField = 4;
constexpr int kBatchFetchBarrierField = 5;
constexpr int kBatchEpochEndField = 6;
constexpr int kBatchLookupsField = 7;

// Payloads up to this size are copied into the message's buffer rather than referenced in
// place (a slice of their own costs more than the copy).
constexpr size_t kCopyPayloadBytes = 512;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, WireFormatLite::WireType wire) {
  PutVarint(out, WireFormatLite::MakeTag(field, wire));
}

void PutVarintField(std::string* out, int field, uint64_t v) {
  if (v == 0) return;  // proto3: a zero scalar is not written
  PutTag(out, field, WireFormatLite::WIRETYPE_VARINT);
  PutVarint(out, v);
}

void PutBytesField(std::string* out, int field, const void* data, size_t size) {
  PutTag(out, field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  PutVarint(out, size);
  out->append(static_cast<const char*>(data), size);
}

// A message under construction: its small fields (and small payloads) go into one buffer, large
// tensor bytes are referenced in place. Finish() gives slices that alternate between ranges of
// the buffer (one allocation in all) and tensor buffers.
class SliceWriter {
 public:
  std::string& buf() { return buf_; }
  // The next bytes of the message are `length` bytes of `buffer` at `offset`.
  void Reference(const std::shared_ptr<char>& buffer, size_t offset, size_t length) {
    refs_.push_back({buf_.size(), buffer, offset, length});
  }
  grpc::ByteBuffer Finish() && {
    auto* owned = new std::string(std::move(buf_));
    grpc::Slice all(
        owned->data(), owned->size(), [](void* p) { delete static_cast<std::string*>(p); }, owned);
    if (refs_.empty()) return grpc::ByteBuffer(&all, 1);
    std::vector<grpc::Slice> slices;
    slices.reserve(2 * refs_.size() + 1);
    size_t pos = 0;
    for (const Ref& r : refs_) {
      if (r.at > pos) slices.push_back(all.sub(pos, r.at));
      pos = r.at;
      slices.push_back(BufferSlice(r.buffer, r.offset, r.length));
    }
    if (owned->size() > pos) slices.push_back(all.sub(pos, owned->size()));
    return grpc::ByteBuffer(slices.data(), slices.size());
  }

 private:
  struct Ref {
    size_t at;  // position in buf_ where the referenced bytes belong
    std::shared_ptr<char> buffer;
    size_t offset, length;
  };
  std::string buf_;
  std::vector<Ref> refs_;
};

// Writes a VariableMessage (with a header only when `meta` is given) of bytes [offset, offset +
// length) of `var` (length < 0: to the end); as a batch entry (field `entry_field` of the
// enclosing message, length-prefixed) when entry_field > 0. `rows_of_entry` nonzero is written
// instead of the row ids. `scratch` holds the small fields meanwhile.
void PutVariable(const RequestMeta* meta, const std::string& name, const Variable& var,
                 int64_t offset, int64_t length, int rows_of_entry, int entry_field,
                 std::string* scratch, SliceWriter* w) {
  std::string& small = *scratch;
  small.clear();
  if (meta != nullptr) {
    const std::string header = ToHeader(*meta).SerializeAsString();
    PutBytesField(&small, kHeaderField, header.data(), header.size());
  }
  PutBytesField(&small, kNameField, name.data(), name.size());
  const Tensor* value = nullptr;
  const SelectedRows* rows = var.GetIf<SelectedRows>();
  int64_t chunk_offset = 0, total_bytes = 0;
  if (rows != nullptr) {
    value = &rows->value;
    offset = 0;
    length = static_cast<int64_t>(value->nbytes());
  } else {
    value = &var.Get<Tensor>();
    const int64_t total = static_cast<int64_t>(value->nbytes());
    if (length < 0) length = total - offset;
    if (offset != 0 || length != total) {
      chunk_offset = offset;
      total_bytes = total;
    }
  }
  PutVarintField(&small, kTypeField, rows != nullptr ? SELECTED_ROWS : DENSE_TENSOR);
  PutVarintField(&small, kDtypeField, static_cast<uint64_t>(value->dtype()));
  if (!value->shape().empty()) {
    size_t packed = 0;
    for (int64_t d : value->shape()) packed += WireFormatLite::Int64Size(d);
    PutTag(&small, kDimsField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
    PutVarint(&small, packed);
    for (int64_t d : value->shape()) PutVarint(&small, static_cast<uint64_t>(d));
  }
  if (rows != nullptr) PutVarintField(&small, kHeightField, static_cast<uint64_t>(rows->height));
  PutVarintField(&small, kChunkOffsetField, static_cast<uint64_t>(chunk_offset));
  PutVarintField(&small, kTotalBytesField, static_cast<uint64_t>(total_bytes));
  if (rows != nullptr) {
    PutVarintField(&small, kRowsOfEntryField, static_cast<uint64_t>(rows_of_entry));
  }
  const size_t id_bytes =
      rows != nullptr && rows_of_entry == 0 ? rows->rows.size() * sizeof(int64_t) : 0;
  const size_t payload = static_cast<size_t>(length);
  auto field_size = [](size_t n) {
    return 1 + static_cast<size_t>(WireFormatLite::UInt64Size(n)) + n;  // tags 14, 15: 1 byte
  };
  std::string& out = w->buf();
  if (entry_field > 0) {
    const size_t entry = small.size() +
                         (rows != nullptr && rows_of_entry == 0 ? field_size(id_bytes) : 0) +
                         field_size(payload);
    PutTag(&out, entry_field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
    PutVarint(&out, entry);
  }
  out.append(small);
  if (rows != nullptr && rows_of_entry == 0) {
    PutBytesField(&out, kRowsField, rows->rows.data(), id_bytes);
  }
  PutTag(&out, kPayloadField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  PutVarint(&out, payload);
  if (payload == 0) return;
  if (payload <= kCopyPayloadBytes) {
    out.append(value->shared_buffer().get() + offset, payload);
  } else {
    w->Reference(value->shared_buffer(), static_cast<size_t>(offset), payload);
  }
}

// Appends `items` as PrefetchBatchRequest.Table messages in field `field` of `out`: a table
// whose ids vector is an earlier item's (the same pointer; the prefetch op hands a slot's deep
// and wide tables the same vector) names it (ids_of_table) instead of repeating the ids.
void PutLookupTables(std::string* out, int field, const std::vector<PrefetchItem>& items) {
  constexpr int kTableField = 1, kIdsField = 2, kIdsOfField = 3;  // PrefetchBatchRequest.Table
  size_t bytes = out->size();
  for (const PrefetchItem& item : items) bytes += item.table.size() + 24 + 8 * item.ids->size();
  out->reserve(bytes);
  std::string table;
  for (size_t i = 0; i < items.size(); ++i) {
    const PrefetchItem& item = items[i];
    table.clear();
    PutBytesField(&table, kTableField, item.table.data(), item.table.size());
    size_t same = 0;
    while (same < i && items[same].ids != item.ids) ++same;
    const size_t id_bytes = item.ids->size() * sizeof(int64_t);
    const bool shared = same < i && !item.ids->empty();
    if (shared) PutVarintField(&table, kIdsOfField, same + 1);
    const size_t ids_field = shared ? 0 : 1 + WireFormatLite::UInt64Size(id_bytes) + id_bytes;
    PutTag(out, field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
    PutVarint(out, table.size() + ids_field);
    out->append(table);
    if (!shared) PutBytesField(out, kIdsField, item.ids->data(), id_bytes);
  }
}

}  // namespace

grpc::ByteBuffer EncodeVariable(const RequestMeta& meta, const std::string& name,
                                const Variable& var, int64_t offset, int64_t length) {
  SliceWriter w;
  std::string scratch;
  PutVariable(&meta, name, var, offset, length, 0, 0, &scratch, &w);
  return std::move(w).Finish();
}

grpc::ByteBuffer EncodeBatch(const RequestMeta& meta, const std::vector<SendItem>& entries,
                             bool send_barrier) {
  return EncodeBatch(meta, entries, send_barrier, BatchExtras());
}

grpc::ByteBuffer EncodeBatch(const RequestMeta& meta, const std::vector<SendItem>& entries,
                             bool send_barrier, const BatchExtras& extras) {
  SliceWriter w;
  const std::string header = ToHeader(meta).SerializeAsString();
  PutBytesField(&w.buf(), kBatchHeaderField, header.data(), header.size());
  PutVarintField(&w.buf(), kBatchSendBarrierField, send_barrier ? 1 : 0);
  for (const std::string& name : extras.get_names) {
    PutBytesField(&w.buf(), kBatchGetNamesField, name.data(), name.size());
  }
  if (extras.fetch_barrier) PutVarintField(&w.buf(), kBatchFetchBarrierField, 1);
  if (extras.epoch_end) PutVarintField(&w.buf(), kBatchEpochEndField, 1);
  PutLookupTables(&w.buf(), kBatchLookupsField, extras.lookups);
  std::string scratch;
  // The sparse entries so far (index, rows): an entry whose row ids equal one of the last few
  // (a slot's deep and wide gradients) names it instead of repeating them.
  constexpr size_t kRowsLookBack = 4;
  std::vector<std::pair<int, const std::vector<int64_t>*>> sparse;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SendItem& e = entries[i];
    int rows_of_entry = 0;
    if (const SelectedRows* sr = e.var->GetIf<SelectedRows>()) {
      const std::vector<int64_t>& ids = sr->rows;
      for (size_t k = sparse.size(); k-- > 0 && k + kRowsLookBack >= sparse.size();) {
        const std::vector<int64_t>& other = *sparse[k].second;
        if (!ids.empty() && other.size() == ids.size() &&
            std::memcmp(other.data(), ids.data(), ids.size() * sizeof(int64_t)) == 0) {
          rows_of_entry = sparse[k].first + 1;
          break;
        }
      }
      if (rows_of_entry == 0) sparse.push_back({static_cast<int>(i), &ids});
    }
    PutVariable(nullptr, e.name, *e.var, 0, -1, rows_of_entry, kBatchVarsField, &scratch, &w);
  }
  return std::move(w).Finish();
}

grpc::ByteBuffer EncodePrefetchBatch(const RequestMeta& meta,
                                     const std::vector<PrefetchItem>& items, bool after_update) {
  constexpr int kTablesField = 2, kAfterUpdateField = 3;  // PrefetchBatchRequest
  SliceWriter w;
  std::string& out = w.buf();
  const std::string header = ToHeader(meta).SerializeAsString();
  out.reserve(header.size() + 16);
  PutBytesField(&out, kHeaderField, header.data(), header.size());
  PutLookupTables(&out, kTablesField, items);
  PutVarintField(&out, kAfterUpdateField, after_update ? 1 : 0);
  return std::move(w).Finish();
}

// Reads DecodedVariable's private fields for the decoders below.
class CodecAccess {
 public:
  // Parses the fields of one VariableMessage from `in`, up to its end (a top-level message) or
  // its limit (a batch entry), and validates them; `meta` (a batch's) replaces the message's own
  // header when given.
  static absl::Status Parse(google::protobuf::io::CodedInputStream& in, int64_t max_bytes,
                            const RequestMeta* meta, DecodedVariable* d);
  // Resolves `d`'s rows_of_entry against the batch's entries before it.
  static absl::Status ShareRows(const std::vector<DecodedVariable>& earlier, DecodedVariable* d);
  static void SetShared(DecodedVariable* d, const RequestMeta& meta,
                        std::shared_ptr<const std::vector<grpc::Slice>> slices) {
    d->meta_ = meta;
    d->slices_ = std::move(slices);
  }
};

absl::Status CodecAccess::Parse(google::protobuf::io::CodedInputStream& in, int64_t max_bytes,
                                const RequestMeta* meta, DecodedVariable* d) {
  // The fields are read straight from the stream (no protobuf message in between); a field of
  // an unknown number or of the wrong wire type is skipped, as protobuf parsers do.
  constexpr size_t kMaxDims = 64;
  bool have_rows = false, have_payload = false;
  int64_t rows_len = 0, payload_len = 0;
  VariableHeader& h = d->header_;
  RequestHeader header;
  int64_t chunk_offset = 0, total_bytes = 0;
  uint64_t v = 0;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) break;
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto wire = WireFormatLite::GetTagWireType(tag);
    if (wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint64_t len = 0;
      // The stream's limit is the message's (or entry's) end: no field runs past it.
      if (!in.ReadVarint64(&len) || len > static_cast<uint64_t>(max_bytes)) {
        return Bad("bad byte-field length");
      }
      const int left = std::max(0, in.BytesUntilLimit());
      if (len > static_cast<uint64_t>(left)) {
        return Bad(
            absl::StrCat("truncated field ", field, ": ", len, " bytes declared, ", left, " left"));
      }
      const int n = static_cast<int>(len);
      if (field == kRowsField || field == kPayloadField) {
        const int64_t begin = in.CurrentPosition();
        if (!in.Skip(n)) return Bad("truncated byte field");
        if (field == kRowsField) {
          have_rows = true;
          d->rows_begin_ = begin;
          rows_len = static_cast<int64_t>(len);
        } else {
          have_payload = true;
          d->payload_begin_ = begin;
          payload_len = static_cast<int64_t>(len);
        }
      } else if (field == kNameField) {
        if (!in.ReadString(&h.name, n)) return Bad("truncated name");
        if (!google::protobuf::internal::IsStructurallyValidUTF8(h.name.data(), n)) {
          return Bad("variable name is not UTF-8");
        }
      } else if (field == kHeaderField) {
        std::string bytes;
        if (!in.ReadString(&bytes, n) || !header.MergeFromString(bytes)) {
          return Bad("unparsable header");
        }
      } else if (field == kDimsField) {  // packed
        const auto limit = in.PushLimit(n);
        while (in.BytesUntilLimit() > 0) {
          if (h.dims.size() >= kMaxDims) return Bad("more than 64 dims");
          if (!in.ReadVarint64(&v)) return Bad("truncated dims");
          h.dims.push_back(static_cast<int64_t>(v));
        }
        in.PopLimit(limit);
      } else if (!in.Skip(n)) {
        return Bad("truncated field");
      }
      continue;
    }
    if (wire == WireFormatLite::WIRETYPE_VARINT &&
        (field == kTypeField || field == kDtypeField || field == kDimsField ||
         field == kHeightField || field == kChunkOffsetField || field == kTotalBytesField ||
         field == kRowsOfEntryField)) {
      if (!in.ReadVarint64(&v)) return Bad("truncated field");
      switch (field) {
        case kTypeField:
          h.type = static_cast<VarType>(static_cast<int32_t>(v));
          break;
        case kDtypeField:
          h.dtype = static_cast<DataType>(static_cast<int32_t>(v));
          break;
        case kDimsField:  // unpacked
          if (h.dims.size() >= kMaxDims) return Bad("more than 64 dims");
          h.dims.push_back(static_cast<int64_t>(v));
          break;
        case kHeightField:
          h.height = static_cast<int64_t>(v);
          break;
        case kChunkOffsetField:
          chunk_offset = static_cast<int64_t>(v);
          break;
        case kTotalBytesField:
          total_bytes = static_cast<int64_t>(v);
          break;
        default:
          d->rows_of_entry_ = static_cast<int32_t>(v);
      }
      continue;
    }
    if (!WireFormatLite::SkipField(&in, tag)) return Bad("truncated field");
  }
  if (!in.ConsumedEntireMessage()) return Bad("trailing garbage");

  d->meta_ = meta != nullptr ? *meta : FromHeader(header);
  if (h.name.empty()) return Bad("empty variable name");
  for (absl::Status printable :
       {CheckPrintable("variable name", h.name), CheckPrintable("job id", d->meta_.job_id)}) {
    if (!printable.ok()) return Bad(printable.message());
  }
  if (h.type != DENSE_TENSOR && h.type != SELECTED_ROWS) {
    return Bad(absl::StrCat("variable ", h.name, " has unsupported type ", h.type));
  }
  size_t elem = SizeOf(h.dtype);
  if (elem == 0) return Bad(absl::StrCat("variable ", h.name, " has unknown dtype ", h.dtype));
  int64_t numel = 1;
  for (int64_t dim : h.dims) {
    if (dim < 0) return Bad(absl::StrCat("variable ", h.name, " has negative dim ", dim));
    if (dim > 0 && numel > max_bytes / dim) {
      return Bad(
          absl::StrCat("variable ", h.name, " shape ", ShapeString(h.dims), " is too large"));
    }
    numel *= dim;
  }
  int64_t total = numel * static_cast<int64_t>(elem);
  if (total > max_bytes) {
    return Bad(absl::StrCat("variable ", h.name, " of ", total, " bytes exceeds the limit"));
  }
  h.chunk_bytes = payload_len;
  if (!have_payload && total > 0) return Bad(absl::StrCat("variable ", h.name, " has no payload"));
  if (d->rows_of_entry_ != 0 && (h.type != SELECTED_ROWS || have_rows || meta == nullptr)) {
    return Bad(absl::StrCat("variable ", h.name, " has rows_of_entry ", d->rows_of_entry_,
                            ", which only a sparse batch entry without row ids may have"));
  }
  if (h.type == SELECTED_ROWS) {
    if (h.dims.empty()) return Bad(absl::StrCat("sparse variable ", h.name, " has no dims"));
    if (d->rows_of_entry_ == 0 && (rows_len % 8 != 0 || rows_len / 8 != h.dims[0])) {
      return Bad(absl::StrCat("sparse variable ", h.name, " has ", rows_len,
                              " bytes of row ids for ", h.dims[0], " rows"));
    }
    if (payload_len != total) {
      return Bad(absl::StrCat("sparse variable ", h.name, " has ", payload_len,
                              " payload bytes, expected ", total));
    }
    h.num_rows = h.dims[0];
    h.total_bytes = total;
  } else {
    if (have_rows) return Bad(absl::StrCat("dense variable ", h.name, " carries row ids"));
    h.total_bytes = total_bytes == 0 ? total : total_bytes;
    h.chunk_offset = chunk_offset;
    if (h.total_bytes != total) {
      return Bad(absl::StrCat("variable ", h.name, " declares ", h.total_bytes, " bytes, its ",
                              DataTypeName(h.dtype), ShapeString(h.dims), " shape has ", total));
    }
    if (total_bytes == 0 && payload_len != total) {
      return Bad(absl::StrCat("variable ", h.name, " has ", payload_len, " payload bytes, its ",
                              DataTypeName(h.dtype), ShapeString(h.dims), " shape needs ", total));
    }
    if (h.chunk_offset < 0 || h.chunk_offset > total || payload_len > total - h.chunk_offset ||
        h.chunk_offset % static_cast<int64_t>(elem) != 0 ||
        payload_len % static_cast<int64_t>(elem) != 0) {
      return Bad(absl::StrCat("variable ", h.name, " chunk [", h.chunk_offset, ", +", payload_len,
                              ") does not fit its ", total, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CodecAccess::ShareRows(const std::vector<DecodedVariable>& earlier,
                                    DecodedVariable* d) {
  if (d->rows_of_entry_ == 0) return absl::OkStatus();
  const VariableHeader& h = d->header_;
  const int64_t k = static_cast<int64_t>(d->rows_of_entry_) - 1;
  if (k < 0 || k >= static_cast<int64_t>(earlier.size())) {
    return Bad(absl::StrCat("sparse variable ", h.name, " takes its row ids from entry ", k,
                            ", which is not an earlier entry of its batch (", earlier.size(),
                            " before it)"));
  }
  const DecodedVariable& src = earlier[static_cast<size_t>(k)];
  if (src.header_.type != SELECTED_ROWS || src.header_.num_rows != h.num_rows) {
    return Bad(absl::StrCat("sparse variable ", h.name, " with ", h.num_rows,
                            " rows takes its row ids from entry ", k, " (", src.header_.name,
                            "), which is not sparse with as many rows"));
  }
  d->rows_begin_ = src.rows_begin_;  // the same received bytes (src's own, or resolved too)
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::shared_ptr<const std::vector<grpc::Slice>>> ReceivedSlices(
    const grpc::ByteBuffer& buffer, int64_t max_bytes, absl::string_view what) {
  if (static_cast<int64_t>(buffer.Length()) > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " of ", buffer.Length(), " bytes exceeds the limit of ", max_bytes));
  }
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Dump(slices.get()).ok()) return Bad("unreadable byte buffer");
  return std::shared_ptr<const std::vector<grpc::Slice>>(std::move(slices));
}

// Sets `in`'s limit to the end of `buffer`, so that fields are checked against what is there.
absl::Status LimitToBuffer(const grpc::ByteBuffer& buffer,
                           google::protobuf::io::CodedInputStream& in) {
  if (buffer.Length() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("message of ", buffer.Length(), " bytes exceeds 2 GiB"));
  }
  in.PushLimit(static_cast<int>(buffer.Length()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodedVariable> DecodeVariable(const grpc::ByteBuffer& buffer, int64_t max_bytes) {
  TS_ASSIGN_OR_RETURN(auto slices, ReceivedSlices(buffer, max_bytes, "variable message"));
  SliceInputStream stream(slices.get());
  google::protobuf::io::CodedInputStream in(&stream);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
  TS_RETURN_IF_ERROR(LimitToBuffer(buffer, in));
  DecodedVariable d;
  TS_RETURN_IF_ERROR(CodecAccess::Parse(in, max_bytes, nullptr, &d));
  RequestMeta meta = d.meta();
  CodecAccess::SetShared(&d, meta, std::move(slices));
  return d;
}

absl::StatusOr<DecodedBatch> DecodeBatch(const grpc::ByteBuffer& buffer, int64_t max_bytes) {
  TS_ASSIGN_OR_RETURN(auto slices, ReceivedSlices(buffer, max_bytes, "variable batch"));
  SliceInputStream stream(slices.get());
  google::protobuf::io::CodedInputStream in(&stream);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
  TS_RETURN_IF_ERROR(LimitToBuffer(buffer, in));
  // The header may follow the entries (protobuf fields come in any order): entries are parsed
  // with a placeholder meta and given the batch's at the end.
  DecodedBatch batch;
  batch.vars.reserve(64);  // a step's gradients or rows without regrowing (the CTR job: 59)
  RequestHeader header;
  bool have_header = false;
  const RequestMeta none;
  // A bool field's varint (nonzero: true).
  auto read_bool = [&in](const char* name, bool* out) {
    uint64_t v;
    if (!in.ReadVarint64(&v)) return Bad(absl::StrCat("truncated ", name));
    *out = v != 0;
    return absl::OkStatus();
  };
  // A length-delimited field's bytes (within what is left of the batch).
  auto read_bytes = [&in](const char* name, std::string* out) {
    uint32_t len;
    if (!in.ReadVarint32(&len) || len > static_cast<uint32_t>(std::max(0, in.BytesUntilLimit())) ||
        !in.ReadString(out, static_cast<int>(len))) {
      return Bad(absl::StrCat("truncated ", name));
    }
    return absl::OkStatus();
  };
  while (true) {
    uint32_t tag = in.ReadTag();
    if (tag == 0) break;
    int field = WireFormatLite::GetTagFieldNumber(tag);
    auto wire = WireFormatLite::GetTagWireType(tag);
    if (field == kBatchVarsField && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t len;
      if (!in.ReadVarint32(&len) || len > static_cast<uint64_t>(max_bytes)) {
        return Bad("bad batch entry length");
      }
      auto limit = in.PushLimit(static_cast<int>(len));
      DecodedVariable d;
      TS_RETURN_IF_ERROR(CodecAccess::Parse(in, max_bytes, &none, &d));
      TS_RETURN_IF_ERROR(CodecAccess::ShareRows(batch.vars, &d));
      in.PopLimit(limit);
      batch.vars.push_back(std::move(d));
    } else if (field == kBatchHeaderField && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string bytes;
      uint32_t len;
      if (!in.ReadVarint32(&len) || !in.ReadString(&bytes, static_cast<int>(len)) ||
          !header.ParseFromString(bytes)) {
        return Bad("unparsable batch header");
      }
      have_header = true;
    } else if (field == kBatchSendBarrierField && wire == WireFormatLite::WIRETYPE_VARINT) {
      TS_RETURN_IF_ERROR(read_bool("send_barrier", &batch.send_barrier));
    } else if (field == kBatchGetNamesField && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string name;
      TS_RETURN_IF_ERROR(read_bytes("get name", &name));
      if (!google::protobuf::internal::IsStructurallyValidUTF8(name.data(),
                                                              static_cast<int>(name.size()))) {
        return Bad("get name is not UTF-8");
      }
      batch.extras.get_names.push_back(std::move(name));
    } else if (field == kBatchFetchBarrierField && wire == WireFormatLite::WIRETYPE_VARINT) {
      TS_RETURN_IF_ERROR(read_bool("fetch_barrier", &batch.extras.fetch_barrier));
    } else if (field == kBatchEpochEndField && wire == WireFormatLite::WIRETYPE_VARINT) {
      TS_RETURN_IF_ERROR(read_bool("epoch_end", &batch.extras.epoch_end));
    } else if (field == kBatchLookupsField && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      std::string bytes;
      TS_RETURN_IF_ERROR(read_bytes("lookup", &bytes));
      if (!batch.lookups.Add()->ParseFromString(bytes)) return Bad("unparsable lookup");
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Bad("truncated field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Bad("trailing garbage");
  if (!have_header) return Bad("batch without a header");
  batch.meta = FromHeader(header);
  absl::Status printable = CheckPrintable("job id", batch.meta.job_id);
  if (!printable.ok()) return Bad(printable.message());
  absl::flat_hash_set<absl::string_view> names;
  for (DecodedVariable& d : batch.vars) {
    const VariableHeader& h = d.header();
    if (h.type == DENSE_TENSOR && h.chunk_bytes != h.total_bytes) {
      return Bad(absl::StrCat("batch entry ", h.name, " is a chunk"));
    }
    if (!names.insert(h.name).second) {
      return Bad(absl::StrCat("variable ", h.name, " appears twice in one batch"));
    }
    CodecAccess::SetShared(&d, batch.meta, slices);
  }
  return batch;
}

void DecodedVariable::CopyRange(int64_t begin, int64_t length, void* dst) const {
  char* out = static_cast<char*>(dst);
  int64_t pos = 0;
  for (const grpc::Slice& s : *slices_) {
    int64_t size = static_cast<int64_t>(s.size());
    int64_t lo = std::max(begin, pos), hi = std::min(begin + length, pos + size);
    if (lo < hi) {
      std::memcpy(out + (lo - begin), s.begin() + (lo - pos), static_cast<size_t>(hi - lo));
    }
    pos += size;
    if (pos >= begin + length) break;
  }
}

void DecodedVariable::CopyPayload(void* dst) const {
  CopyRange(payload_begin_, header_.chunk_bytes, dst);
}

void DecodedVariable::CopyRows(int64_t* dst) const {
  CopyRange(rows_begin_, header_.num_rows * static_cast<int64_t>(sizeof(int64_t)), dst);
}

absl::Status DecodeVariableInto(const DecodedVariable& decoded, Variable* out) {
  const VariableHeader& h = decoded.header();
  if (h.type == SELECTED_ROWS) {
    SelectedRows* sr = out->GetMutable<SelectedRows>();
    sr->height = h.height;
    sr->rows.resize(h.num_rows);
    if (h.num_rows > 0) decoded.CopyRows(sr->rows.data());
    sr->value.Resize(h.dtype, h.dims);
    if (h.chunk_bytes > 0) decoded.CopyPayload(sr->value.raw_data());
    return absl::OkStatus();
  }
  if (h.chunk_bytes != h.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", h.name, " arrived as a chunk where a whole tensor was expected"));
  }
  Tensor* t = out->GetMutable<Tensor>();
  t->Resize(h.dtype, h.dims);
  if (h.chunk_bytes > 0) decoded.CopyPayload(t->raw_data());
  return absl::OkStatus();
}

grpc::ByteBuffer SerializeProto(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseProto(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return Bad("unreadable byte buffer");
  SliceInputStream stream(&slices);
  if (!message->ParseFromZeroCopyStream(&stream)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " message"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
