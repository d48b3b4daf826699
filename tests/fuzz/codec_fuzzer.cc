// Fuzz target: the pserver wire codec (common/rpc/grpc/codec.h) on arbitrary received bytes.
//
// Input: byte 0 picks how the remaining bytes are cut into gRPC slices (a received ByteBuffer
// is a list of slices, and a field may straddle them); the rest is the message. Every decoder a
// pserver or trainer runs on peer bytes gets the buffer: DecodeVariable (SendVariable requests,
// GetVariable/Prefetch responses), DecodeBatch (SendBatch requests, GetBatch/PrefetchBatch
// responses) and ParseProto for the small requests.
// The request checks every transport applies (common/rpc/request_checks.h) run on each parsed
// request: a GetVariable's byte range against variables of several sizes, up to 2^63-1 bytes,
// and the Prefetch ids field.
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a rejection is INVALID_ARGUMENT (RESOURCE_EXHAUSTED when over the size limit) with a
//     one-line, non-empty message;
//   - an accepted message has a self-consistent header (chunk inside the tensor, row ids for
//     every row) and decodes into a Variable of exactly that header; a whole tensor re-encodes
//     and decodes to the same bytes;
//   - an accepted batch has whole, distinctly named entries, each one as an accepted message;
//   - an accepted byte range lies inside its variable, and the range a server would encode from
//     it decodes as exactly that chunk.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/rpc/grpc/codec.h"
#include "common/rpc/request_checks.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace tessera {
namespace {

// Small enough that a hostile shape cannot make the fuzzer allocate much.
constexpr int64_t kMaxBytes = int64_t{1} << 20;

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "codec_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

void RequireGoodError(const absl::Status& s) {
  Require(s.code() == absl::StatusCode::kInvalidArgument ||
              s.code() == absl::StatusCode::kResourceExhausted,
          "rejection is INVALID_ARGUMENT or RESOURCE_EXHAUSTED");
  Require(!s.message().empty(), "rejection has a message");
  Require(s.message().find('\n') == absl::string_view::npos, "rejection message is one line");
}

grpc::ByteBuffer Slices(const uint8_t* data, size_t size, uint8_t pattern) {
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  int i = 0;
  while (pos < size) {
    // Slice lengths 1..16 driven by the pattern bits, or everything at once for pattern 0.
    size_t len = pattern == 0 ? size : 1 + ((pattern >> (i % 4)) & 0x0f);
    len = std::min(len, size - pos);
    slices.emplace_back(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    ++i;
  }
  if (slices.empty()) return grpc::ByteBuffer();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  Require(buffer.Dump(&slices).ok(), "encoded buffer dumps");
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

void CheckAccepted(const DecodedVariable& d) {
  const VariableHeader& h = d.header();
  Require(!h.name.empty(), "accepted variable has a name");
  Require(SizeOf(h.dtype) > 0, "accepted dtype is known");
  Require(h.chunk_bytes >= 0 && h.chunk_offset >= 0, "chunk is not negative");
  Require(h.chunk_offset + h.chunk_bytes <= h.total_bytes, "chunk lies inside the tensor");
  Require(h.total_bytes <= kMaxBytes, "tensor within the size limit");
  int64_t numel = NumElements(h.dims);
  Require(numel * static_cast<int64_t>(SizeOf(h.dtype)) == h.total_bytes,
          "total bytes match dtype and dims");
  if (h.type == SELECTED_ROWS) {
    Require(!h.dims.empty() && h.num_rows == h.dims[0], "one row id per row");
    Require(h.chunk_bytes == h.total_bytes, "sparse values arrive whole");
  }
  // What a server does: copy into a destination of the header's size.
  std::vector<char> payload(static_cast<size_t>(h.chunk_bytes) + 1);
  d.CopyPayload(payload.data());
  std::vector<int64_t> rows(static_cast<size_t>(h.num_rows) + 1);
  d.CopyRows(rows.data());

  Variable var;
  absl::Status s = DecodeVariableInto(d, &var);
  if (!s.ok()) {
    RequireGoodError(s);
    Require(h.type == DENSE_TENSOR && h.chunk_bytes != h.total_bytes,
            "only a dense chunk is refused as a whole variable");
    return;
  }
  const Tensor& value = h.type == SELECTED_ROWS ? var.Get<SelectedRows>().value : var.Get<Tensor>();
  Require(value.dtype() == h.dtype && value.shape() == h.dims, "decoded tensor has the header");
  Require(value.nbytes() == static_cast<size_t>(h.chunk_bytes), "decoded size matches");
  if (h.chunk_bytes > 0) {
    Require(std::memcmp(value.raw_data(), payload.data(), value.nbytes()) == 0,
            "decoded bytes are the payload");
  }
  if (h.type == SELECTED_ROWS) {
    const SelectedRows& sr = var.Get<SelectedRows>();
    Require(sr.rows.size() == static_cast<size_t>(h.num_rows), "decoded row count");
    Require(h.num_rows == 0 ||
                std::memcmp(sr.rows.data(), rows.data(), sr.rows.size() * sizeof(int64_t)) == 0,
            "decoded row ids");
  }
  // Round trip: what this process would send back decodes to the same variable.
  grpc::ByteBuffer again = EncodeVariable(d.meta(), h.name, var);
  auto d2 = DecodeVariable(again, kMaxBytes);
  Require(d2.ok(), "re-encoded variable decodes");
  Variable var2;
  Require(DecodeVariableInto(*d2, &var2).ok(), "re-encoded variable decodes into a Variable");
  Require(Flatten(EncodeVariable(d.meta(), h.name, var2)) == Flatten(again),
          "re-encoding is stable");
}

// What a server does with a GetVariable: resolve the range against the variable, then encode
// that range. Sizes include ones no tensor here can have, where only the arithmetic is checked.
void CheckGetRange(const GetRequest& get) {
  (void)CheckRequestMeta(FromHeader(get.header()));
  (void)CheckRequestName("variable name", get.name());
  for (int64_t total : {int64_t{0}, int64_t{4}, int64_t{24}, kMaxBytes,
                        std::numeric_limits<int64_t>::max()}) {
    auto range = ResolveByteRange("v", get.offset(), get.length(), total);
    if (!range.ok()) {
      RequireGoodError(range.status());
      continue;
    }
    Require(range->offset >= 0 && range->length >= 0 && range->offset <= total &&
                range->length <= total - range->offset,
            "accepted byte range lies inside the variable");
    // A server encodes the range of a real tensor (6 int32s); whole elements only, as the
    // trainers ask for.
    if (total != 24 || range->offset % 4 != 0 || range->length % 4 != 0) continue;
    Variable v;
    Tensor* t = v.GetMutable<Tensor>();
    t->Resize(INT32, {6});
    for (int i = 0; i < 6; ++i) t->data<int32_t>()[i] = i;
    auto chunk = DecodeVariable(EncodeVariable(RequestMeta{"j", 0, 0}, "v", v, range->offset,
                                               range->length),
                                kMaxBytes);
    Require(chunk.ok(), "an encoded accepted range decodes");
    Require(chunk->header().chunk_offset == range->offset &&
                chunk->header().chunk_bytes == range->length,
            "the encoded chunk is the accepted range");
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;  // NOLINT: a fuzz entry point outside the namespace
  // Protobuf logs every string field with invalid UTF-8 it refuses; the fuzzer makes many.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size == 0) return 0;
  grpc::ByteBuffer buffer = Slices(data + 1, size - 1, data[0]);

  auto decoded = DecodeVariable(buffer, kMaxBytes);
  if (decoded.ok()) {
    CheckAccepted(*decoded);
  } else {
    RequireGoodError(decoded.status());
  }
  auto batch = DecodeBatch(buffer, kMaxBytes);
  if (batch.ok()) {
    std::set<std::string> names;
    for (const DecodedVariable& d : batch->vars) {
      Require(d.header().chunk_bytes == d.header().total_bytes, "batch entries are whole");
      Require(names.insert(d.header().name).second, "batch entry names are distinct");
      Require(d.meta().job_id == batch->meta.job_id && d.meta().step == batch->meta.step,
              "batch entries carry the batch's meta");
      CheckAccepted(d);
    }
  } else {
    RequireGoodError(batch.status());
  }
  GetRequest get;
  GetBatchRequest get_batch;
  PrefetchBatchRequest prefetch_batch;
  PrefetchRequest prefetch;
  BarrierRequest barrier;
  CheckpointRequest checkpoint;
  RegisterRequest reg;
  for (google::protobuf::MessageLite* m : std::vector<google::protobuf::MessageLite*>{
           &get, &get_batch, &prefetch, &prefetch_batch, &barrier, &checkpoint, &reg}) {
    absl::Status s = ParseProto(buffer, m);
    if (!s.ok()) RequireGoodError(s);
  }
  if (ParseProto(buffer, &get).ok()) CheckGetRange(get);
  if (ParseProto(buffer, &prefetch).ok()) {
    absl::Status ids = CheckPrefetchIds(prefetch.table(), prefetch.ids().size());
    if (!ids.ok()) RequireGoodError(ids);
  }
  if (ParseProto(buffer, &barrier).ok()) {
    absl::Status reason = CheckAbortReason(barrier.reason());
    if (!reason.ok()) RequireGoodError(reason);
  }
  if (ParseProto(buffer, &get_batch).ok()) {
    for (const std::string& name : get_batch.names()) {
      absl::Status checked = CheckRequestName("variable name", name);
      if (!checked.ok()) RequireGoodError(checked);
    }
  }
  if (ParseProto(buffer, &prefetch_batch).ok()) {
    for (const PrefetchBatchRequest::Table& t : prefetch_batch.tables()) {
      absl::Status ids = CheckPrefetchIds(t.table(), t.ids().size());
      if (!ids.ok()) RequireGoodError(ids);
    }
  }
  if (ParseProto(buffer, &reg).ok()) {  // the job handshake's fields, as both transports check
    JobFields fields;
    for (const RegisterRequest::Field& f : reg.fields()) fields.push_back({f.name(), f.value()});
    absl::Status checked = CheckJobFields(fields);
    if (!checked.ok()) RequireGoodError(checked);
  }
  return 0;
}
