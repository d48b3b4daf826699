#include "trainer/feeder.h"

#include <cmath>
#include <limits>

#include "common/layers/layers.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using data::Example;

// x [-1, 2] float, ids a (local table of 10 rows) and b (distributed), label y.
FeedSpec Spec() {
  FeedSpec spec;
  spec.dense = "x";
  spec.num_dense = 2;
  spec.slots = {{"a", 10}, {"b", 0}};
  spec.label = "y";
  return spec;
}

ProgramDesc Program(DataType label_dtype = FLOAT32) {
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  layers::Data(b, "x", {-1, 2});
  layers::Data(b, "a", {-1, 1}, INT64);
  layers::Data(b, "b", {-1, 1}, INT64);
  layers::Data(b, "y", {-1, 1}, label_dtype);
  return main;
}

std::vector<Example> Batch() {
  return {{{1.0f, 2.0f}, {3, -7}, 1.0f},
          {{3.0f, 4.0f}, {-1, 123456789012345}, 0.0f},
          {{5.0f, 6.0f}, {25, std::numeric_limits<int64_t>::min()}, 1.0f}};
}

const Tensor& Get(const Scope& scope, const std::string& name) {
  return scope.FindVar(name)->Get<Tensor>();
}

TEST(FeederTest, WritesDenseIdsAndLabels) {
  Feeder feeder(Spec());
  ASSERT_TRUE(feeder.Validate(Program()).ok());
  Scope scope;
  std::vector<Example> batch = Batch();
  ASSERT_TRUE(feeder.Feed(batch, &scope).ok());

  const Tensor& x = Get(scope, "x");
  EXPECT_EQ(x.dtype(), FLOAT32);
  EXPECT_EQ(x.shape(), (Shape{3, 2}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x.data<float>()[i], i + 1.0f);

  const Tensor& a = Get(scope, "a");
  EXPECT_EQ(a.dtype(), INT64);
  EXPECT_EQ(a.shape(), (Shape{3, 1}));
  // Non-negative modulo 10: 3 -> 3, -1 -> 9, 25 -> 5.
  EXPECT_EQ(a.data<int64_t>()[0], 3);
  EXPECT_EQ(a.data<int64_t>()[1], 9);
  EXPECT_EQ(a.data<int64_t>()[2], 5);

  const Tensor& b = Get(scope, "b");  // distributed: raw ids
  EXPECT_EQ(b.data<int64_t>()[0], -7);
  EXPECT_EQ(b.data<int64_t>()[1], 123456789012345);
  EXPECT_EQ(b.data<int64_t>()[2], std::numeric_limits<int64_t>::min());

  const Tensor& y = Get(scope, "y");
  EXPECT_EQ(y.shape(), (Shape{3, 1}));
  EXPECT_EQ(y.data<float>()[0], 1.0f);
  EXPECT_EQ(y.data<float>()[1], 0.0f);
  EXPECT_EQ(y.data<float>()[2], 1.0f);
}

TEST(FeederTest, ModuloIdIsNonNegative) {
  EXPECT_EQ(ModuloId(-1, 7), 6);
  EXPECT_EQ(ModuloId(-7, 7), 0);
  EXPECT_EQ(ModuloId(15, 7), 1);
  EXPECT_EQ(ModuloId(std::numeric_limits<int64_t>::min(), 10), 2);  // ...808 -> -8 -> 2
}

TEST(FeederTest, FeedsSelectedIndicesAndReusesBuffers) {
  Feeder feeder(Spec());
  Scope scope;
  std::vector<Example> all = Batch();
  ASSERT_TRUE(feeder.Feed(all, &scope).ok());
  const void* x_buffer = Get(scope, "x").raw_data();
  const void* a_buffer = Get(scope, "a").raw_data();
  std::vector<int64_t> indices = {2, 0};
  ASSERT_TRUE(feeder.Feed(all, indices, &scope).ok());
  const Tensor& x = Get(scope, "x");
  EXPECT_EQ(x.shape(), (Shape{2, 2}));
  EXPECT_EQ(x.data<float>()[0], 5.0f);
  EXPECT_EQ(x.data<float>()[3], 2.0f);
  EXPECT_EQ(Get(scope, "a").data<int64_t>()[1], 3);
  EXPECT_EQ(Get(scope, "y").data<float>()[0], 1.0f);
  // A smaller batch reuses the buffers of the larger one.
  EXPECT_EQ(x.raw_data(), x_buffer);
  EXPECT_EQ(Get(scope, "a").raw_data(), a_buffer);
}

// A batch longer than the feed's look-ahead, in a shuffled order with repeats: every example's
// values land in its row, the local slot's ids mapped, the distributed slot's as they are.
TEST(FeederTest, FeedsALongShuffledBatchRowByRow) {
  Feeder feeder(Spec());
  std::vector<Example> all;
  for (int64_t k = 0; k < 300; ++k) {
    all.push_back({{static_cast<float>(k), -static_cast<float>(k)},
                   {k * 7 - 1000, k * 1000003 - (int64_t{1} << 40)},
                   static_cast<float>(k % 2)});
  }
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < 200; ++i) indices.push_back((i * 137 + 11) % 300);
  indices.push_back(indices.front());
  Scope scope;
  ASSERT_TRUE(feeder.Feed(all, indices, &scope).ok());
  const Tensor& x = Get(scope, "x");
  const Tensor& a = Get(scope, "a");
  const Tensor& b = Get(scope, "b");
  const Tensor& y = Get(scope, "y");
  ASSERT_EQ(x.shape(), (Shape{201, 2}));
  ASSERT_EQ(a.shape(), (Shape{201, 1}));
  for (size_t i = 0; i < indices.size(); ++i) {
    const Example& ex = all[static_cast<size_t>(indices[i])];
    SCOPED_TRACE(i);
    EXPECT_EQ(x.data<float>()[2 * i], ex.dense[0]);
    EXPECT_EQ(x.data<float>()[2 * i + 1], ex.dense[1]);
    EXPECT_EQ(a.data<int64_t>()[i], ModuloId(ex.sparse[0], 10));
    EXPECT_EQ(b.data<int64_t>()[i], ex.sparse[1]);
    EXPECT_EQ(y.data<float>()[i], ex.label);
  }
}
TEST(FeederTest, Int64AndFloat64Labels) {
  FeedSpec spec = Spec();
  spec.label_dtype = INT64;
  Feeder feeder(spec);
  ASSERT_TRUE(feeder.Validate(Program(INT64)).ok());
  Scope scope;
  std::vector<Example> batch = Batch();
  batch[1].label = 4;
  ASSERT_TRUE(feeder.Feed(batch, &scope).ok());
  EXPECT_EQ(Get(scope, "y").data<int64_t>()[1], 4);

  batch[1].label = 0.5f;
  absl::Status s = feeder.Feed(batch, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'y'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("example 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("0.5"), std::string::npos) << s;

  spec.label_dtype = FLOAT64;
  Feeder f64(spec);
  batch[1].label = 0.25f;
  ASSERT_TRUE(f64.Feed(batch, &scope).ok());
  EXPECT_EQ(Get(scope, "y").data<double>()[1], 0.25);
}

TEST(FeederTest, BadExamplesNameTheVariableAndTheValue) {
  Feeder feeder(Spec());
  Scope scope;
  std::vector<Example> batch = Batch();
  batch[2].dense.push_back(7.0f);
  absl::Status s = feeder.Feed(batch, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("example 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("3 dense values"), std::string::npos) << s;

  batch = Batch();
  batch[1].sparse.pop_back();
  s = feeder.Feed(batch, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("1 sparse ids"), std::string::npos) << s;

  batch = Batch();
  batch[0].dense[1] = std::nanf("");
  s = feeder.Feed(batch, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nan"), std::string::npos) << s;

  batch = Batch();
  std::vector<int64_t> bad = {0, 3};
  s = feeder.Feed(batch, bad, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("example 3 of a data set of 3"), std::string::npos) << s;

  s = feeder.Feed(absl::Span<const Example>(), &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("empty"), std::string::npos) << s;
}

TEST(FeederTest, ValidateRejectsMismatchedDeclarations) {
  FeedSpec spec = Spec();
  spec.num_dense = 3;
  absl::Status s = Feeder(spec).Validate(Program());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x' is declared as float32[-1, 2]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("float32[-1, 3]"), std::string::npos) << s;

  spec = Spec();
  spec.slots.push_back({"c", 5});
  s = Feeder(spec).Validate(Program());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'c' is not declared"), std::string::npos) << s;

  spec = Spec();
  spec.label_dtype = INT64;
  s = Feeder(spec).Validate(Program(FLOAT32));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("label feed 'y'"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
