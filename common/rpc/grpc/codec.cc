#include "common/rpc/grpc/codec.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/printable.h"
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
  return h;
}

RequestMeta FromHeader(const RequestHeader& header) {
  return RequestMeta{header.job_id(), header.trainer_id(), header.step()};
}

grpc::ByteBuffer EncodeVariable(const RequestMeta& meta, const std::string& name,
                                const Variable& var, int64_t offset, int64_t length) {
  VariableMessage msg;
  *msg.mutable_header() = ToHeader(meta);
  msg.set_name(name);
  const Tensor* value = nullptr;
  const SelectedRows* rows = var.GetIf<SelectedRows>();
  if (rows != nullptr) {
    msg.set_type(SELECTED_ROWS);
    msg.set_height(rows->height);
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

  std::vector<grpc::Slice> slices;
  slices.emplace_back(msg.SerializeAsString());
  if (rows != nullptr) {
    size_t n = rows->rows.size() * sizeof(int64_t);
    slices.emplace_back(LengthPrefix(kRowsField, n));
    if (n > 0) slices.emplace_back(rows->rows.data(), n);  // copies: ids are small
  }
  slices.emplace_back(LengthPrefix(kPayloadField, static_cast<size_t>(length)));
  if (length > 0) {
    slices.push_back(BufferSlice(value->shared_buffer(), static_cast<size_t>(offset),
                                 static_cast<size_t>(length)));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<DecodedVariable> DecodeVariable(const grpc::ByteBuffer& buffer, int64_t max_bytes) {
  if (static_cast<int64_t>(buffer.Length()) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("variable message of ", buffer.Length(),
                                                     " bytes exceeds the limit of ", max_bytes));
  }
  DecodedVariable d;
  if (!buffer.Dump(&d.slices_).ok()) return Bad("unreadable byte buffer");
  SliceInputStream stream(&d.slices_);
  google::protobuf::io::CodedInputStream in(&stream);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
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
          d.rows_begin_ = begin;
          rows_len = static_cast<int64_t>(len);
        } else {
          have_payload = true;
          d.payload_begin_ = begin;
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

  d.meta_ = FromHeader(msg.header());
  VariableHeader& h = d.header_;
  h.name = msg.name();
  h.type = msg.type();
  h.dtype = msg.dtype();
  h.dims.assign(msg.dims().begin(), msg.dims().end());
  h.height = msg.height();
  if (h.name.empty()) return Bad("empty variable name");
  for (absl::Status printable :
       {CheckPrintable("variable name", h.name), CheckPrintable("job id", d.meta_.job_id)}) {
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
  if (h.type == SELECTED_ROWS) {
    if (h.dims.empty()) return Bad(absl::StrCat("sparse variable ", h.name, " has no dims"));
    if (rows_len % 8 != 0 || rows_len / 8 != h.dims[0]) {
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
  return d;
}

void DecodedVariable::CopyRange(int64_t begin, int64_t length, void* dst) const {
  char* out = static_cast<char*>(dst);
  int64_t pos = 0;
  for (const grpc::Slice& s : slices_) {
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
