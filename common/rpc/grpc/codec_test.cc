#include "common/rpc/grpc/codec.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kMax = int64_t{1} << 30;

Variable Dense(int64_t rows, int64_t cols) {
  Variable v;
  Tensor* t = v.GetMutable<Tensor>();
  t->Resize(FLOAT32, {rows, cols});
  for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = 0.5f * i - 3;
  return v;
}

TEST(CodecTest, DenseRoundTripIsAValidProtobuf) {
  Variable v = Dense(3, 5);
  grpc::ByteBuffer bb = EncodeVariable({"job", 2, 17}, "w@GRAD", v);
  auto d = DecodeVariable(bb, kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->meta().job_id, "job");
  EXPECT_EQ(d->meta().trainer_id, 2);
  EXPECT_EQ(d->meta().step, 17);
  EXPECT_EQ(d->header().name, "w@GRAD");
  EXPECT_EQ(d->header().dims, (std::vector<int64_t>{3, 5}));
  Variable out;
  ASSERT_TRUE(DecodeVariableInto(*d, &out).ok());
  const Tensor& t = out.Get<Tensor>();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<float>()[i], 0.5f * i - 3);

  // The same bytes parse as an ordinary VariableMessage.
  VariableMessage msg;
  ASSERT_TRUE(ParseProto(bb, &msg).ok());
  EXPECT_EQ(msg.payload().size(), 60u);
  EXPECT_EQ(msg.name(), "w@GRAD");
}

TEST(CodecTest, ChunkCarriesItsRange) {
  Variable v = Dense(4, 4);
  grpc::ByteBuffer bb = EncodeVariable({"j", 0, 0}, "w", v, 16, 32);
  auto d = DecodeVariable(bb, kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->header().chunk_offset, 16);
  EXPECT_EQ(d->header().chunk_bytes, 32);
  EXPECT_EQ(d->header().total_bytes, 64);
  float buf[8];
  d->CopyPayload(buf);
  EXPECT_EQ(buf[0], v.Get<Tensor>().data<float>()[4]);
  EXPECT_EQ(buf[7], v.Get<Tensor>().data<float>()[11]);
}

TEST(CodecTest, SelectedRowsRoundTripWithExtremeIds) {
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->rows = {0, -1, INT64_MIN, INT64_MAX, 1000000000000000000LL};
  sr->value.Resize(FLOAT64, {5, 2});
  for (int i = 0; i < 10; ++i) sr->value.data<double>()[i] = i;
  auto d = DecodeVariable(EncodeVariable({"j", 1, 1}, "emb@GRAD", v), kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  Variable out;
  ASSERT_TRUE(DecodeVariableInto(*d, &out).ok());
  EXPECT_EQ(out.Get<SelectedRows>().rows, sr->rows);
  EXPECT_EQ(out.Get<SelectedRows>().value.data<double>()[9], 9.0);
}

TEST(CodecTest, EmptyTensorsRoundTrip) {
  Variable v = Dense(0, 7);
  auto d = DecodeVariable(EncodeVariable({"j", 0, 0}, "e", v), kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  Variable out;
  ASSERT_TRUE(DecodeVariableInto(*d, &out).ok());
  EXPECT_EQ(out.Get<Tensor>().shape(), (Shape{0, 7}));
}

// Builds a message from a VariableMessage proto (what a buggy or hostile peer might send).
grpc::ByteBuffer Raw(const VariableMessage& m) { return SerializeProto(m); }

TEST(CodecTest, RejectsMalformedMessages) {
  VariableMessage good;
  good.set_name("w");
  good.set_dtype(FLOAT32);
  good.add_dims(2);
  good.set_payload(std::string(8, '\0'));
  ASSERT_TRUE(DecodeVariable(Raw(good), kMax).ok());

  auto expect_bad = [](const VariableMessage& m, const std::string& needle) {
    auto d = DecodeVariable(Raw(m), kMax);
    ASSERT_FALSE(d.ok()) << needle;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
    EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status();
  };
  VariableMessage m = good;
  m.set_payload(std::string(7, '\0'));
  expect_bad(m, "7 payload bytes");
  m = good;
  m.set_dims(0, -2);
  expect_bad(m, "negative dim");
  m = good;
  m.set_dtype(static_cast<DataType>(42));
  expect_bad(m, "unknown dtype");
  m = good;
  m.clear_name();
  expect_bad(m, "empty variable name");
  m = good;
  m.set_type(SELECTED_ROWS);
  m.set_rows_data(std::string(8, '\0'));
  m.set_dims(0, 2);
  expect_bad(m, "row ids");
  m = good;
  m.set_total_bytes(8);
  m.set_chunk_offset(4);
  expect_bad(m, "does not fit");
  m = good;
  m.set_dims(0, int64_t{1} << 40);
  expect_bad(m, "too large");

  // Truncated buffer.
  std::string bytes = good.SerializeAsString();
  bytes.resize(bytes.size() - 3);
  grpc::Slice slice(bytes);
  auto d = DecodeVariable(grpc::ByteBuffer(&slice, 1), kMax);
  EXPECT_FALSE(d.ok());
  // Oversized message.
  auto big = DecodeVariable(Raw(good), 4);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tessera
