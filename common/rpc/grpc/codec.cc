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

std::string LengthPrefix(int field, size_t length) {
  std::string out;
  google::protobuf::io::StringOutputStream sos(&out);
  google::protobuf::io::CodedOutputStream cos(&sos);
  cos.WriteTag(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  cos.WriteVarint64(length);
  cos.Trim();
  return out;
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

// Appends the encoding of a VariableMessage (with a header only when `meta` is given) to `out`;
// returns its length in bytes.
// `rows_of_entry` (a batch entry's VariableMessage.rows_of_entry): nonzero writes it instead of
// the row ids.
size_t AppendVariable(const RequestMeta* meta, const std::string& name, const Variable& var,
                      int64_t offset, int64_t length, std::vector<grpc::Slice>* out,
                      int rows_of_entry = 0) {
  VariableMessage msg;
  if (meta != nullptr) *msg.mutable_header() = ToHeader(*meta);
  msg.set_name(name);
  const Tensor* value = nullptr;
  const SelectedRows* rows = var.GetIf<SelectedRows>();
  if (rows != nullptr) {
    msg.set_type(SELECTED_ROWS);
    msg.set_height(rows->height);
    msg.set_rows_of_entry(rows_of_entry);
    value = &rows->value;
    offset = 0;
    length = static_cast<int64_t>(value->nbytes());
  } else {
    msg.set_type(DENSE_TENSOR);
    value = &var.Get<Tensor>();
    int64_t total = static_cast<int64_t>(value->nbytes());
    if (length < 0) length = total - offset;
    if (offset != 0 || length != total) {
      msg.set_chunk_offset(offset);
      msg.set_total_bytes(total);
    }
  }
  msg.set_dtype(value->dtype());
  for (int64_t d : value->shape()) msg.add_dims(d);

  const size_t first = out->size();
  out->emplace_back(msg.SerializeAsString());
  if (rows != nullptr && rows_of_entry == 0) {
    size_t n = rows->rows.size() * sizeof(int64_t);
    out->emplace_back(LengthPrefix(kRowsField, n));
    if (n > 0) out->emplace_back(rows->rows.data(), n);  // copies: ids are small
  }
  out->emplace_back(LengthPrefix(kPayloadField, static_cast<size_t>(length)));
  if (length > 0) {
    out->push_back(BufferSlice(value->shared_buffer(), static_cast<size_t>(offset),
                               static_cast<size_t>(length)));
  }
  size_t bytes = 0;
  for (size_t i = first; i < out->size(); ++i) bytes += (*out)[i].size();
  return bytes;
}

constexpr int kBatchHeaderField = 1;
constexpr int kBatchVarsField = 2;
constexpr int kBatchSendBarrierField = 3;

}  // namespace

grpc::ByteBuffer EncodeVariable(const RequestMeta& meta, const std::string& name,
                                const Variable& var, int64_t offset, int64_t length) {
  std::vector<grpc::Slice> slices;
  AppendVariable(&meta, name, var, offset, length, &slices);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer EncodeBatch(const RequestMeta& meta, const std::vector<SendItem>& entries,
                             bool send_barrier) {
  VariableBatch head;
  *head.mutable_header() = ToHeader(meta);
  head.set_send_barrier(send_barrier);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(head.SerializeAsString());
  std::vector<grpc::Slice> entry;
  // The sparse entries so far (index, rows): an entry whose row ids equal one of the last few
  // (a slot's deep and wide gradients) names it instead of repeating them.
  constexpr size_t kRowsLookBack = 4;
  std::vector<std::pair<int, const std::vector<int64_t>*>> sparse;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SendItem& e = entries[i];
    entry.clear();
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
    size_t bytes = AppendVariable(nullptr, e.name, *e.var, 0, -1, &entry, rows_of_entry);
    slices.emplace_back(LengthPrefix(kBatchVarsField, bytes));
    for (grpc::Slice& s : entry) slices.push_back(std::move(s));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
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
  std::string small;  // every field but the two byte fields, re-encoded
  google::protobuf::io::StringOutputStream sos(&small);
  bool have_rows = false, have_payload = false;
  int64_t rows_len = 0, payload_len = 0;
  {
    google::protobuf::io::CodedOutputStream out(&sos);
    while (true) {
      uint32_t tag = in.ReadTag();
      if (tag == 0) break;
      int field = WireFormatLite::GetTagFieldNumber(tag);
      auto wire = WireFormatLite::GetTagWireType(tag);
      if ((field == kRowsField || field == kPayloadField) &&
          wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        uint64_t len;
        if (!in.ReadVarint64(&len) || len > static_cast<uint64_t>(max_bytes)) {
          return Bad("bad byte-field length");
        }
        int64_t begin = in.CurrentPosition();
        if (!in.Skip(static_cast<int>(len))) return Bad("truncated byte field");
        if (field == kRowsField) {
          have_rows = true;
          d->rows_begin_ = begin;
          rows_len = static_cast<int64_t>(len);
        } else {
          have_payload = true;
          d->payload_begin_ = begin;
          payload_len = static_cast<int64_t>(len);
        }
        continue;
      }
      if (!WireFormatLite::SkipField(&in, tag, &out)) return Bad("truncated field");
    }
    if (!in.ConsumedEntireMessage()) return Bad("trailing garbage");
  }
  VariableMessage msg;
  if (!msg.ParseFromString(small)) return Bad("unparsable header fields");

  d->meta_ = meta != nullptr ? *meta : FromHeader(msg.header());
  VariableHeader& h = d->header_;
  h.name = msg.name();
  h.type = msg.type();
  h.dtype = msg.dtype();
  h.dims.assign(msg.dims().begin(), msg.dims().end());
  h.height = msg.height();
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
  d->rows_of_entry_ = msg.rows_of_entry();
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
    h.total_bytes = msg.total_bytes() == 0 ? total : msg.total_bytes();
    h.chunk_offset = msg.chunk_offset();
    if (h.total_bytes != total) {
      return Bad(absl::StrCat("variable ", h.name, " declares ", h.total_bytes, " bytes, its ",
                              DataTypeName(h.dtype), ShapeString(h.dims), " shape has ", total));
    }
    if (msg.total_bytes() == 0 && payload_len != total) {
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

}  // namespace

absl::StatusOr<DecodedVariable> DecodeVariable(const grpc::ByteBuffer& buffer, int64_t max_bytes) {
  TS_ASSIGN_OR_RETURN(auto slices, ReceivedSlices(buffer, max_bytes, "variable message"));
  SliceInputStream stream(slices.get());
  google::protobuf::io::CodedInputStream in(&stream);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
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
  // The header may follow the entries (protobuf fields come in any order): entries are parsed
  // with a placeholder meta and given the batch's at the end.
  DecodedBatch batch;
  RequestHeader header;
  bool have_header = false;
  const RequestMeta none;
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
      uint64_t v;
      if (!in.ReadVarint64(&v)) return Bad("truncated send_barrier");
      batch.send_barrier = v != 0;
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
