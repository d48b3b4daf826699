// Wire codec for pserver messages over grpc::ByteBuffer, without copying tensor bytes into a
// protobuf string.
//
// Encoding: the small fields of every VariableMessage of a message (and the row ids, and
// payloads of at most 512 bytes) are written into one buffer; larger payloads are slices
// pointing at the tensor's own buffer (kept alive by the slice). The result is the ordinary
// protobuf encoding, so any protobuf parser reads it. Decoding: the fields are read straight
// from the received slices (any valid protobuf encoding of them); the two byte fields are
// located there and copied once, straight into the destination tensor. Neither side builds a
// protobuf message per variable (tests/bench/codec: about twice as fast as plain protobuf on
// the CTR job's messages). Every malformed input gives INVALID_ARGUMENT and writes nothing.
#ifndef TESSERA_COMMON_RPC_GRPC_CODEC_H_
#define TESSERA_COMMON_RPC_GRPC_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/rpc.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/pserver.pb.h"

namespace tessera {

// The wire protocol this build speaks, which a pserver reports in its RegisterResponse:
//   0  pservers older than the field;
//   1  a SendGetBatch may carry the next batch's lookups (VariableBatch.lookups);
//   2  tables placed whole on one pserver (--table_placement=table_wise: a table's lookups and
//      gradient, `<grad>.shard0`, all go to its owner);
//   3  table groups (--fuse_tables): tables looked up with the same ids are one pserver table
//      "<a>+<b>", looked up and updated as one.
//   4  a SendGetBatch without the send barrier (an async step's receive carrying the next
//      batch's lookups), which a pserver before 4 refuses.
// A trainer refuses, at registration, a pserver whose protocol is older than its own (an older
// pserver would ignore what it does not know and answer wrongly later: one before 2 compares
// no table placement and holds its row-wise shards).
inline constexpr uint32_t kWireProtocol = 4;

// Encodes bytes [offset, offset + length) of dense `var` (the whole variable when length < 0),
// or the whole of a SelectedRows `var`, as a VariableMessage.
grpc::ByteBuffer EncodeVariable(const RequestMeta& meta, const std::string& name,
                                const Variable& var, int64_t offset = 0, int64_t length = -1);

// A received VariableMessage with its byte fields not yet copied out (they stay in the received
// slices, which every entry of a batch shares).
class DecodedVariable {
 public:
  const RequestMeta& meta() const { return meta_; }
  const VariableHeader& header() const { return header_; }
  // Copies the payload bytes to dst (header().chunk_bytes bytes).
  void CopyPayload(void* dst) const;
  // Copies the row ids (header().num_rows of them).
  void CopyRows(int64_t* dst) const;

 private:
  friend class CodecAccess;
  void CopyRange(int64_t begin, int64_t length, void* dst) const;

  RequestMeta meta_;
  VariableHeader header_;
  std::shared_ptr<const std::vector<grpc::Slice>> slices_;
  int64_t payload_begin_ = 0;
  int64_t rows_begin_ = 0;
  int32_t rows_of_entry_ = 0;  // VariableMessage.rows_of_entry (resolved into rows_begin_)
};

// Parses and validates a VariableMessage: known dtype and type, non-negative dims, byte counts
// consistent with dtype/dims (and with chunk_offset/total_bytes), row count matching the value's
// first dim, total size at most max_bytes.
absl::StatusOr<DecodedVariable> DecodeVariable(const grpc::ByteBuffer& buffer, int64_t max_bytes);

// Encodes a VariableBatch (proto/pserver.proto): `meta` once, then every entry (a whole dense
// tensor or SelectedRows) as a VariableMessage without its own header. Tensor bytes are not
// copied: the buffer keeps them alive. A SelectedRows entry whose row ids equal those of a recent
// sparse entry (one of the last four with ids of their own) names that entry (rows_of_entry)
// instead of repeating them.
grpc::ByteBuffer EncodeBatch(const RequestMeta& meta, const std::vector<SendItem>& entries,
                             bool send_barrier);
// The VariableBatch fields beyond the entries and send_barrier (SendGetBatch; proto comments).
// `lookups` are encoded as EncodePrefetchBatch encodes its items; they are not decoded here
// (DecodedBatch::lookups).
struct BatchExtras {
  std::vector<std::string> get_names;
  bool fetch_barrier = false;
  bool epoch_end = false;
  std::vector<PrefetchItem> lookups;
};
grpc::ByteBuffer EncodeBatch(const RequestMeta& meta, const std::vector<SendItem>& entries,
                             bool send_barrier, const BatchExtras& extras);

// Encodes a PrefetchBatchRequest (proto/pserver.proto) for `items`, in one buffer: a table whose
// ids vector is an earlier table's (the same pointer) names it (ids_of_table) instead of
// repeating the ids.
grpc::ByteBuffer EncodePrefetchBatch(const RequestMeta& meta,
                                     const std::vector<PrefetchItem>& items, bool after_update);

// A received VariableBatch: every entry validated as DecodeVariable validates a message, none of
// them a chunk, no name twice; each entry's meta() is the batch's.
struct DecodedBatch {
  RequestMeta meta;
  bool send_barrier = false;
  // Get names: UTF-8 (as protobuf requires of strings), unchecked otherwise; no lookups.
  BatchExtras extras;
  // The lookups, parsed by protobuf (table names UTF-8), unchecked otherwise.
  google::protobuf::RepeatedPtrField<PrefetchBatchRequest::Table> lookups;
  std::vector<DecodedVariable> vars;
};
absl::StatusOr<DecodedBatch> DecodeBatch(const grpc::ByteBuffer& buffer, int64_t max_bytes);

// Decodes a whole message into a fresh Variable (dense or SelectedRows).
absl::Status DecodeVariableInto(const DecodedVariable& decoded, Variable* out);

// Plain protobuf messages <-> ByteBuffer (copies; for the small requests).
grpc::ByteBuffer SerializeProto(const google::protobuf::MessageLite& message);
absl::Status ParseProto(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

RequestHeader ToHeader(const RequestMeta& meta);
RequestMeta FromHeader(const RequestHeader& header);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_CODEC_H_
