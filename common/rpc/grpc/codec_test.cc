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

// The decoder reads fields itself: it must take any valid protobuf encoding (fields in any
// order, dims packed or not, unknown fields, known numbers with another wire type skipped as
// protobuf skips them), and refuse what protobuf would refuse (a name that is not UTF-8).
TEST(CodecTest, DecodesAnyProtobufEncodingOfTheFields) {
  auto tag = [](int field, int wire) { return static_cast<char>(field << 3 | wire); };
  std::string bytes;
  bytes += tag(15, 2) + std::string("\x08") + std::string(8, '\x01');  // payload first
  bytes += tag(5, 0) + std::string("\x02");                            // dims unpacked: 2
  bytes += tag(99 & 15, 0) + std::string("\x07");                      // field 3 (type) = 7...
  bytes.resize(bytes.size() - 2);                                      // ...taken back
  bytes += std::string("\x98\x06") + std::string("\x05");              // unknown field 99
  bytes += tag(4, 2) + std::string(1, '\0');                           // dtype, wrong wire type
  bytes += tag(2, 2) + std::string("\x01") + "x";                      // name "x"
  bytes += tag(2, 2) + std::string("\x01") + "w";                      // the last name counts
  bytes += tag(1, 2) + std::string("\x05") + tag(1, 2) + "\x03job";    // header {job_id: "job"}
  grpc::Slice slice(bytes);
  auto d = DecodeVariable(grpc::ByteBuffer(&slice, 1), kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->header().name, "w");
  EXPECT_EQ(d->header().dims, (std::vector<int64_t>{2}));
  EXPECT_EQ(d->header().dtype, FLOAT32);
  EXPECT_EQ(d->meta().job_id, "job");
  // The same content as protobuf itself writes it decodes the same.
  VariableMessage parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  auto again = DecodeVariable(Raw(parsed), kMax);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->header().name, "w");
  EXPECT_EQ(again->header().dims, d->header().dims);

  VariableMessage bad;
  bad.set_dtype(FLOAT32);
  bad.add_dims(0);
  std::string raw = bad.SerializeAsString() + tag(2, 2) + "\x02\xc3\x28";  // invalid UTF-8
  grpc::Slice bad_slice(raw);
  auto refused = DecodeVariable(grpc::ByteBuffer(&bad_slice, 1), kMax);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("UTF-8"), std::string::npos) << refused.status();
  VariableMessage deep;
  deep.set_name("w");
  for (int i = 0; i < 65; ++i) deep.add_dims(1);
  auto too_deep = DecodeVariable(Raw(deep), kMax);
  EXPECT_NE(too_deep.status().message().find("more than 64 dims"), std::string::npos)
      << too_deep.status();
  // A name whose length runs past the message's end.
  std::string cut = tag(2, 2) + std::string("\x7f") + "w";
  grpc::Slice cut_slice(cut);
  EXPECT_EQ(DecodeVariable(grpc::ByteBuffer(&cut_slice, 1), kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
}

Variable Sparse(std::vector<int64_t> rows, int64_t width) {
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->height = 1000;
  sr->rows = std::move(rows);
  sr->value.Resize(FLOAT32, {static_cast<int64_t>(sr->rows.size()), width});
  for (int64_t i = 0; i < sr->value.numel(); ++i) sr->value.data<float>()[i] = 1.5f * i;
  return v;
}

// Cuts a byte string into slices of `size` bytes (a received buffer's fields may straddle).
grpc::ByteBuffer Sliced(const std::string& bytes, size_t size) {
  std::vector<grpc::Slice> slices;
  for (size_t pos = 0; pos < bytes.size(); pos += size) {
    slices.emplace_back(bytes.substr(pos, size));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST(CodecTest, BatchRoundTripsEveryEntryAndIsAValidProtobuf) {
  Variable w = Dense(3, 5), e = Dense(0, 4), g = Sparse({7, -3, INT64_MAX}, 2);
  grpc::ByteBuffer bb =
      EncodeBatch({"job", 1, 9}, {{"w@GRAD", &w}, {"emb@GRAD", &g}, {"empty", &e}}, true);
  // Every field may straddle slices.
  for (size_t cut : {size_t{1}, size_t{7}, size_t{1} << 20}) {
    auto batch = DecodeBatch(Sliced(Flatten(bb), cut), kMax);
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(batch->meta.job_id, "job");
    EXPECT_EQ(batch->meta.trainer_id, 1);
    EXPECT_EQ(batch->meta.step, 9);
    EXPECT_TRUE(batch->send_barrier);
    ASSERT_EQ(batch->vars.size(), 3u);
    EXPECT_EQ(batch->vars[0].header().name, "w@GRAD");
    EXPECT_EQ(batch->vars[1].header().name, "emb@GRAD");
    EXPECT_EQ(batch->vars[2].header().name, "empty");
    EXPECT_EQ(batch->vars[1].meta().step, 9);  // the batch's meta
    Variable out_w, out_g, out_e;
    ASSERT_TRUE(DecodeVariableInto(batch->vars[0], &out_w).ok());
    ASSERT_TRUE(DecodeVariableInto(batch->vars[1], &out_g).ok());
    ASSERT_TRUE(DecodeVariableInto(batch->vars[2], &out_e).ok());
    for (int i = 0; i < 15; ++i) EXPECT_EQ(out_w.Get<Tensor>().data<float>()[i], 0.5f * i - 3);
    EXPECT_EQ(out_g.Get<SelectedRows>().rows, g.Get<SelectedRows>().rows);
    EXPECT_EQ(out_g.Get<SelectedRows>().height, 1000);
    EXPECT_EQ(out_g.Get<SelectedRows>().value.data<float>()[5], 7.5f);
    EXPECT_EQ(out_e.Get<Tensor>().shape(), (Shape{0, 4}));
  }
  VariableBatch msg;
  ASSERT_TRUE(ParseProto(bb, &msg).ok());
  EXPECT_EQ(msg.header().step(), 9);
  ASSERT_EQ(msg.vars_size(), 3);
  EXPECT_EQ(msg.vars(0).payload().size(), 60u);
  EXPECT_FALSE(msg.vars(0).has_header());  // entries carry no header of their own
  EXPECT_EQ(msg.vars(1).rows_data().size(), 24u);
}

// A slot's deep and wide gradients have the same rows: the second names the first's ids instead
// of repeating them, and decodes to the same rows.
TEST(CodecTest, BatchSendsEqualRowIdsOnce) {
  Variable deep = Sparse({7, -3, INT64_MAX}, 4), wide = Sparse({7, -3, INT64_MAX}, 1);
  Variable other = Sparse({7, -3, 5}, 1), dense = Dense(2, 2),
           again = Sparse({7, -3, INT64_MAX}, 2);
  grpc::ByteBuffer bb = EncodeBatch({"job", 0, 3},
                                    {{"deep@GRAD", &deep},
                                     {"w", &dense},
                                     {"wide@GRAD", &wide},
                                     {"other@GRAD", &other},
                                     {"again@GRAD", &again}},
                                    false);
  VariableBatch msg;
  ASSERT_TRUE(ParseProto(bb, &msg).ok());
  ASSERT_EQ(msg.vars_size(), 5);
  EXPECT_EQ(msg.vars(0).rows_data().size(), 24u);
  EXPECT_EQ(msg.vars(0).rows_of_entry(), 0);
  EXPECT_EQ(msg.vars(2).rows_data().size(), 0u);
  EXPECT_EQ(msg.vars(2).rows_of_entry(), 1);       // entry 0
  EXPECT_EQ(msg.vars(3).rows_data().size(), 24u);  // other ids: its own
  EXPECT_EQ(msg.vars(4).rows_of_entry(), 1);
  for (size_t cut : {size_t{5}, size_t{1} << 20}) {
    auto batch = DecodeBatch(Sliced(Flatten(bb), cut), kMax);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->vars.size(), 5u);
    for (int i : {0, 2, 3, 4}) {
      Variable out;
      ASSERT_TRUE(DecodeVariableInto(batch->vars[i], &out).ok());
      const Variable& in = i == 0 ? deep : i == 2 ? wide : i == 3 ? other : again;
      EXPECT_EQ(out.Get<SelectedRows>().rows, in.Get<SelectedRows>().rows) << i;
      const Tensor& v = out.Get<SelectedRows>().value;
      ASSERT_EQ(v.shape(), in.Get<SelectedRows>().value.shape()) << i;
      for (int64_t k = 0; k < v.numel(); ++k) EXPECT_EQ(v.data<float>()[k], 1.5f * k) << i;
    }
  }
}

// A valid batch: job "job", step 1, one dense float entry "w" of 2 elements.
VariableBatch BatchOfDenseW() {
  VariableBatch b;
  *b.mutable_header() = ToHeader({"job", 0, 1});
  VariableMessage* v = b.add_vars();
  v->set_name("w");
  v->set_dtype(FLOAT32);
  v->add_dims(2);
  v->set_payload(std::string(8, '\0'));
  return b;
}

// DecodeBatch refuses `m` with a one-line INVALID_ARGUMENT containing `needle`.
void ExpectBadBatch(const VariableBatch& m, const std::string& needle) {
  auto d = DecodeBatch(SerializeProto(m), kMax);
  ASSERT_FALSE(d.ok()) << needle;
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status();
  EXPECT_EQ(d.status().message().find('\n'), std::string::npos);
}

// A peer's rows_of_entry must name an earlier sparse entry with as many rows, in a batch, and
// come without row ids of its own.
TEST(CodecTest, RejectsBadRowReferences) {
  VariableBatch good = BatchOfDenseW();
  VariableMessage* a = good.add_vars();
  a->set_name("a");
  a->set_type(SELECTED_ROWS);
  a->set_dtype(FLOAT32);
  a->add_dims(2);
  a->add_dims(1);
  a->set_rows_data(std::string(16, '\1'));
  a->set_payload(std::string(8, '\0'));
  VariableMessage* b = good.add_vars();
  *b = *a;
  b->set_name("b");
  b->clear_rows_data();
  b->set_rows_of_entry(2);
  auto ok = DecodeBatch(SerializeProto(good), kMax);
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::vector<int64_t> rows(2);
  ok->vars[2].CopyRows(rows.data());
  EXPECT_EQ(rows, (std::vector<int64_t>(2, 0x0101010101010101)));

  VariableBatch m = good;
  m.mutable_vars(2)->set_rows_of_entry(3);  // itself
  ExpectBadBatch(m, "not an earlier entry");
  m.mutable_vars(2)->set_rows_of_entry(9);
  ExpectBadBatch(m, "not an earlier entry");
  m.mutable_vars(2)->set_rows_of_entry(-1);
  ExpectBadBatch(m, "not an earlier entry");
  m.mutable_vars(2)->set_rows_of_entry(1);  // the dense entry
  ExpectBadBatch(m, "not sparse with as many rows");
  m = good;
  m.mutable_vars(2)->set_dims(0, 3);
  m.mutable_vars(2)->set_payload(std::string(12, '\0'));
  ExpectBadBatch(m, "not sparse with as many rows");
  m = good;
  m.mutable_vars(2)->set_rows_data(std::string(16, '\2'));  // ids of its own as well
  ExpectBadBatch(m, "rows_of_entry");
  m = good;
  m.mutable_vars(0)->set_rows_of_entry(1);  // on a dense entry
  ExpectBadBatch(m, "rows_of_entry");
  // Outside a batch there is nothing to refer to.
  VariableMessage single = good.vars(2);
  *single.mutable_header() = ToHeader({"job", 0, 1});
  auto lone = DecodeVariable(SerializeProto(single), kMax);
  EXPECT_EQ(lone.status().code(), absl::StatusCode::kInvalidArgument) << lone.status();
  EXPECT_NE(lone.status().message().find("rows_of_entry"), std::string::npos) << lone.status();
}

// EncodePrefetchBatch writes an ordinary PrefetchBatchRequest; a table fed by the same ids
// vector as an earlier one names it.
// A SendGetBatch's fields (the names to fetch, the fetch barrier) and its reply's epoch_end
// travel with the batch: protobuf reads them, and so does the decoder; a get name that is not
// UTF-8 is refused, as protobuf refuses such a string.
TEST(CodecTest, BatchCarriesGetNamesFetchBarrierAndEpochEnd) {
  Variable g = Dense(1, 2);
  BatchExtras extras;
  extras.get_names = {"w", "b.block1", std::string("\xc3\xa9t\xc3\xa9")};
  extras.fetch_barrier = true;
  extras.epoch_end = true;
  grpc::ByteBuffer buffer = EncodeBatch({"job", 1, 7}, {{"w@GRAD", &g}}, true, extras);
  VariableBatch parsed;
  ASSERT_TRUE(ParseProto(buffer, &parsed).ok());
  ASSERT_EQ(parsed.get_names_size(), 3);
  EXPECT_EQ(parsed.get_names(2), extras.get_names[2]);
  EXPECT_TRUE(parsed.fetch_barrier());
  EXPECT_TRUE(parsed.epoch_end());
  auto d = DecodeBatch(buffer, kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->extras.get_names, extras.get_names);
  EXPECT_TRUE(d->extras.fetch_barrier);
  EXPECT_TRUE(d->extras.epoch_end);
  EXPECT_TRUE(d->send_barrier);
  ASSERT_EQ(d->vars.size(), 1u);

  auto plain = DecodeBatch(EncodeBatch({"job", 1, 7}, {{"w@GRAD", &g}}, false), kMax);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->extras.get_names.empty());
  EXPECT_FALSE(plain->extras.fetch_barrier);
  EXPECT_FALSE(plain->extras.epoch_end);

  VariableBatch m = BatchOfDenseW();
  m.add_get_names("\xff\xfe");
  ExpectBadBatch(m, "get name is not UTF-8");
}

// The next batch's lookups riding on a SendGetBatch: encoded as a PrefetchBatchRequest's tables
// (shared ids once), parsed back as such; a lookup that is not a Table message is refused.
TEST(CodecTest, BatchCarriesLookups) {
  Variable g = Dense(1, 2);
  std::vector<int64_t> ids = {3, -1, INT64_MAX}, other = {9};
  Tensor out;
  BatchExtras extras;
  extras.get_names = {"w"};
  extras.lookups = {{"deep", &ids, &out}, {"wide", &ids, &out}, {"other", &other, &out}};
  grpc::ByteBuffer buffer = EncodeBatch({"job", 1, 7}, {{"w@GRAD", &g}}, true, extras);
  VariableBatch parsed;
  ASSERT_TRUE(ParseProto(buffer, &parsed).ok());
  ASSERT_EQ(parsed.lookups_size(), 3);
  auto d = DecodeBatch(buffer, kMax);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->lookups.size(), 3);
  const auto& decoded = d->lookups;
  for (const auto* lookups : {&parsed.lookups(), &decoded}) {
    EXPECT_EQ(lookups->Get(0).table(), "deep");
    ASSERT_EQ(lookups->Get(0).ids().size(), 3 * sizeof(int64_t));
    int64_t last;
    std::memcpy(&last, lookups->Get(0).ids().data() + 16, sizeof(last));
    EXPECT_EQ(last, INT64_MAX);
    EXPECT_EQ(lookups->Get(1).table(), "wide");
    EXPECT_TRUE(lookups->Get(1).ids().empty());
    EXPECT_EQ(lookups->Get(1).ids_of_table(), 1);
    EXPECT_EQ(lookups->Get(2).ids().size(), sizeof(int64_t));
    EXPECT_EQ(lookups->Get(2).ids_of_table(), 0);
  }
  EXPECT_EQ(d->extras.get_names, extras.get_names);
  ASSERT_EQ(d->vars.size(), 1u);
  EXPECT_TRUE(DecodeBatch(EncodeBatch({"job", 1, 7}, {}, true), kMax)->lookups.empty());

  // Field 7 holding a Table whose name runs past its end.
  const std::string bad = BatchOfDenseW().SerializeAsString() + std::string("\x3a\x02\x0a\x05");
  auto refused = DecodeBatch(Sliced(bad, bad.size()), kMax);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unparsable lookup"), std::string::npos)
      << refused.status();
}

TEST(CodecTest, PrefetchBatchIsAValidProtobuf) {
  std::vector<int64_t> a = {3, -1, INT64_MAX}, b = {9}, empty;
  Tensor out;
  for (bool after : {false, true}) {
    grpc::ByteBuffer bb = EncodePrefetchBatch(
        {"job", 2, 7},
        {{"deep", &a, &out}, {"other", &b, &out}, {"wide", &a, &out}, {"none", &empty, &out}},
        after);
    PrefetchBatchRequest req;
    ASSERT_TRUE(ParseProto(bb, &req).ok());
    EXPECT_EQ(req.header().job_id(), "job");
    EXPECT_EQ(req.header().trainer_id(), 2);
    EXPECT_EQ(req.header().step(), 7);
    EXPECT_EQ(req.after_update(), after);
    ASSERT_EQ(req.tables_size(), 4);
    EXPECT_EQ(req.tables(0).table(), "deep");
    EXPECT_EQ(req.tables(0).ids(), std::string(reinterpret_cast<const char*>(a.data()), 24));
    EXPECT_EQ(req.tables(0).ids_of_table(), 0);
    EXPECT_EQ(req.tables(1).ids().size(), 8u);
    EXPECT_EQ(req.tables(2).table(), "wide");
    EXPECT_TRUE(req.tables(2).ids().empty());
    EXPECT_EQ(req.tables(2).ids_of_table(), 1);
    EXPECT_EQ(req.tables(3).table(), "none");
    EXPECT_TRUE(req.tables(3).ids().empty());
    EXPECT_EQ(req.tables(3).ids_of_table(), 0);
  }
}

TEST(CodecTest, BatchHeaderMayFollowItsEntries) {
  Variable w = Dense(2, 2);
  VariableBatch head;
  *head.mutable_header() = ToHeader({"job", 0, 4});
  std::string entries = Flatten(EncodeBatch({"", 0, 0}, {{"w", &w}}, false));
  // EncodeBatch writes its (here empty-job) header first; a peer may order fields otherwise.
  VariableBatch parsed;
  ASSERT_TRUE(parsed.ParseFromString(entries));
  parsed.clear_header();
  std::string bytes = parsed.SerializeAsString() + head.SerializeAsString();
  auto batch = DecodeBatch(Sliced(bytes, 3), kMax);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->meta.job_id, "job");
  EXPECT_EQ(batch->meta.step, 4);
  ASSERT_EQ(batch->vars.size(), 1u);
  EXPECT_EQ(batch->vars[0].meta().job_id, "job");
}

TEST(CodecTest, RejectsMalformedBatches) {
  VariableBatch good = BatchOfDenseW();
  ASSERT_TRUE(DecodeBatch(SerializeProto(good), kMax).ok());

  VariableBatch m = good;
  *m.add_vars() = good.vars(0);
  ExpectBadBatch(m, "appears twice");
  m = good;
  m.mutable_vars(0)->set_total_bytes(16);
  m.mutable_vars(0)->mutable_dims()->Set(0, 4);
  ExpectBadBatch(m, "is a chunk");
  m = good;
  m.mutable_vars(0)->set_dims(0, -1);
  ExpectBadBatch(m, "negative dim");
  m = good;
  m.clear_header();
  ExpectBadBatch(m, "without a header");
  m = good;
  m.mutable_header()->set_job_id("j\nob");
  ExpectBadBatch(m, "job id");
  // An entry's length that runs past the buffer, and a truncated buffer.
  std::string bytes = good.SerializeAsString();
  bytes.resize(bytes.size() - 2);
  grpc::Slice slice(bytes);
  EXPECT_EQ(DecodeBatch(grpc::ByteBuffer(&slice, 1), kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Oversized.
  EXPECT_EQ(DecodeBatch(SerializeProto(good), 8).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tessera
