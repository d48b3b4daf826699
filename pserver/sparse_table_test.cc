#include "pserver/sparse_table.h"

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "Eigen/Core"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/framework/scope.h"
#include "common/ops/counter_rng.h"
#include "common/ops/ops.h"
#include "common/ops/optimizer_rules.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kE18 = 1000000000000000000;

SparseTableOptions Opts(int64_t dim, const std::string& optimizer = "sgd") {
  SparseTableOptions o;
  o.dim = dim;
  o.optimizer = optimizer;
  o.initializer.min = -0.25;
  o.initializer.max = 0.75;
  o.initializer.seed = 1234;
  return o;
}

std::unique_ptr<SparseTable> MakeTable(const SparseTableOptions& o) {
  absl::StatusOr<std::unique_ptr<SparseTable>> t = SparseTable::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<float> InitRow(const SparseTableOptions& o, int64_t id) {
  std::vector<float> row(o.dim);
  FillCounterUniform<float>(o.initializer.seed, static_cast<uint64_t>(id) * o.dim,
                            o.initializer.min, o.initializer.max, row.data(), o.dim);
  return row;
}

std::vector<float> Row(const SparseTable& t, int64_t id) {
  std::vector<float> row(t.options().dim);
  EXPECT_TRUE(t.PeekRow(id, row.data())) << "no row " << id;
  return row;
}

std::vector<float> State(const SparseTable& t, int64_t id) {
  std::vector<float> values(t.options().dim), state(t.state_width());
  EXPECT_TRUE(t.PeekRow(id, values.data(), state.data())) << "no row " << id;
  return state;
}

std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(Crc32cTest, KnownVectorAndExtension) {
  const std::string s = "123456789";
  EXPECT_EQ(sparse_table_format::Crc32c(s.data(), s.size()), 0xE3069283u);
  const uint32_t head = sparse_table_format::Crc32c(s.data(), 4);
  EXPECT_EQ(sparse_table_format::Crc32c(s.data() + 4, 5, head), 0xE3069283u);
  EXPECT_EQ(sparse_table_format::Crc32c(nullptr, 0), 0u);
}

TEST(SparseTableTest, NegativeRowBudgetIsRefused) {
  SparseTableOptions o = Opts(2);
  o.max_rows = -1;
  auto t = SparseTable::Create(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("max_rows is -1"), std::string::npos) << t.status();
}

TEST(SparseTableTest, RejectsBadOptionsNamingTheValue) {
  auto expect_bad = [](SparseTableOptions o, const std::string& needle) {
    absl::StatusOr<std::unique_ptr<SparseTable>> t = SparseTable::Create(o);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status();
  };
  SparseTableOptions o = Opts(4);
  o.dim = 0;
  expect_bad(o, "dim is 0");
  o = Opts(4, "rmsprop");
  expect_bad(o, "'rmsprop'");
  o = Opts(4);
  o.num_shards = 48;
  expect_bad(o, "num_shards is 48");
  o = Opts(4);
  o.initializer.min = 2;
  expect_bad(o, "min 2");
  o = Opts(4);
  o.evict_after_steps = 3;
  o.evict_after_seconds = 5;
  expect_bad(o, "both set");
  o = Opts(4);
  o.admission_threshold = -1;
  expect_bad(o, "admission_threshold is -1");
  o = Opts(4);
  o.remember_lookups = 65;
  expect_bad(o, "remember_lookups is 65");
}

// Every row of `ids` in `t` and in `want`, values and optimizer state, bit for bit.
void ExpectSameRows(const SparseTable& t, const SparseTable& want,
                    const std::vector<int64_t>& ids) {
  for (int64_t id : ids) {
    EXPECT_EQ(Row(t, id), Row(want, id)) << "id " << id;
    EXPECT_EQ(State(t, id), State(want, id)) << "id " << id;
  }
}

// Lookups and updates through a table that remembers lookups, and the same calls through one
// that does not: the updates that take a remembered lookup's rows change exactly what a plain
// update does.
TEST(SparseTableTest, AnUpdateOfALookedUpBatchTakesItsRowsAndChangesTheSame) {
  for (const char* optimizer : {"sgd", "adagrad", "adam"}) {
    SCOPED_TRACE(optimizer);
    SparseTableOptions o = Opts(5, optimizer);
    o.num_shards = 4;
    auto plain = MakeTable(o);
    o.remember_lookups = 2;
    auto remembering = MakeTable(o);
    std::mt19937_64 rng(7);
    std::vector<std::vector<int64_t>> batches;
    for (int b = 0; b < 6; ++b) {
      std::vector<int64_t> ids(300);
      for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 500) - 250;  // repeats too
      batches.push_back(ids);
    }
    std::vector<float> out(300 * 5), want(300 * 5);
    // As a pserver with one pipelined trainer: batch b + 1 is looked up before b is applied.
    for (SparseTable* t : {plain.get(), remembering.get()}) {
      ASSERT_TRUE(t->Lookup(batches[0], out.data()).ok());
    }
    for (size_t b = 0; b < batches.size(); ++b) {
      if (b + 1 < batches.size()) {
        ASSERT_TRUE(remembering->Lookup(batches[b + 1], out.data()).ok());
        ASSERT_TRUE(plain->Lookup(batches[b + 1], want.data()).ok());
        EXPECT_EQ(out, want);
      }
      const std::vector<float> g = RandomFloats(300 * 5, 100 + b);
      for (SparseTable* t : {plain.get(), remembering.get()}) {
        ASSERT_TRUE(t->ApplyGradients(batches[b], g.data(), 0.1f, b + 1, 0.5f).ok());
      }
    }
    EXPECT_EQ(remembering->Stats().updates_taking_lookups, 6);
    EXPECT_EQ(plain->Stats().updates_taking_lookups, 0);
    std::vector<int64_t> all;
    for (const auto& ids : batches) all.insert(all.end(), ids.begin(), ids.end());
    ExpectSameRows(*remembering, *plain, all);
    // Other ids than any remembered lookup's (a batch's prefix): an ordinary update.
    const std::vector<int64_t> prefix(batches[5].begin(), batches[5].begin() + 100);
    ASSERT_TRUE(remembering->Lookup(batches[5], out.data()).ok());
    const std::vector<float> g = RandomFloats(100 * 5, 99);
    ASSERT_TRUE(remembering->ApplyGradients(prefix, g.data(), 0.1f, 7).ok());
    ASSERT_TRUE(plain->ApplyGradients(prefix, g.data(), 0.1f, 7).ok());
    EXPECT_EQ(remembering->Stats().updates_taking_lookups, 6);
    ExpectSameRows(*remembering, *plain, all);
  }
}

// Rows evicted after a lookup and their slots taken by new ids: the update of the looked-up
// batch must find (here: create again) its own rows, not update the new ids' rows in the
// remembered slots.
TEST(SparseTableTest, ARememberedLookupDoesNotOutliveItsRows) {
  SparseTableOptions o = Opts(4, "adagrad");
  o.num_shards = 1;  // one free list: the new ids take exactly the freed slots
  o.evict_after_steps = 1;
  auto plain = MakeTable(o);
  o.remember_lookups = 4;
  auto remembering = MakeTable(o);
  const std::vector<int64_t> looked_up = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int64_t> later = {101, 102, 103, 104, 105, 106, 107, 108};
  std::vector<float> out(8 * 4);
  const std::vector<float> g = RandomFloats(8 * 4, 5);
  for (SparseTable* t : {plain.get(), remembering.get()}) {
    ASSERT_TRUE(t->Lookup(looked_up, out.data()).ok());
    t->AdvanceStep(3);
    EXPECT_EQ(t->EvictStale(), 8);
    ASSERT_TRUE(t->Lookup(later, out.data()).ok());
    ASSERT_TRUE(t->ApplyGradients(looked_up, g.data(), 0.5f, 3).ok());
  }
  EXPECT_EQ(remembering->Stats().updates_taking_lookups, 1);  // its partition, slots found again
  EXPECT_EQ(remembering->Size(), 16);
  std::vector<int64_t> all = looked_up;
  all.insert(all.end(), later.begin(), later.end());
  ExpectSameRows(*remembering, *plain, all);
  for (int64_t id : later) EXPECT_EQ(Row(*remembering, id), InitRow(o, id)) << id;
}

// A batch looked up ahead of an update and again after it (the pserver's look-ahead, then its
// answer after the step): the second lookup copies the rows the update left, as a plain lookup
// reads them, also where rows were evicted and their slots taken in between.
TEST(SparseTableTest, ALookupRepeatedAfterAnUpdateReadsTheUpdatedRows) {
  SparseTableOptions o = Opts(3, "adagrad");
  o.num_shards = 2;
  o.evict_after_steps = 2;
  auto plain = MakeTable(o);
  o.remember_lookups = 4;
  auto remembering = MakeTable(o);
  const std::vector<int64_t> ahead = {4, 9, 4, 11, 12, 13, 14};
  const std::vector<int64_t> updated = {9, 11, 20};
  const std::vector<int64_t> other = {30, 31, 32, 33};
  std::vector<float> out(7 * 3), want(7 * 3);
  const std::vector<float> g = RandomFloats(3 * 3, 8);
  auto both = [&](const std::function<void(SparseTable*)>& fn) {
    fn(plain.get());
    fn(remembering.get());
  };
  both([&](SparseTable* t) { ASSERT_TRUE(t->Lookup(ahead, out.data()).ok()); });
  both([&](SparseTable* t) { ASSERT_TRUE(t->ApplyGradients(updated, g.data(), 0.5f, 1).ok()); });
  ASSERT_TRUE(remembering->Lookup(ahead, out.data()).ok());
  ASSERT_TRUE(plain->Lookup(ahead, want.data()).ok());
  EXPECT_EQ(out, want);
  EXPECT_EQ(remembering->Stats().repeated_lookups, 1);
  // Rows 12-14 unseen since step 0 are evicted at step 3, and new ids take their slots.
  both([&](SparseTable* t) {
    ASSERT_TRUE(t->ApplyGradients(updated, g.data(), 0.5f, 3).ok());
    ASSERT_TRUE(t->Lookup({4, 9, 11}, out.data()).ok());
    EXPECT_EQ(t->EvictStale(), 3);  // 12, 13 and 14
    ASSERT_TRUE(t->Lookup(other, out.data()).ok());
  });
  ASSERT_TRUE(remembering->Lookup(ahead, out.data()).ok());
  ASSERT_TRUE(plain->Lookup(ahead, want.data()).ok());
  EXPECT_EQ(out, want);
  EXPECT_EQ(remembering->Stats().repeated_lookups, 2);
  std::vector<int64_t> all = ahead;
  all.insert(all.end(), other.begin(), other.end());
  ExpectSameRows(*remembering, *plain, all);
}

// A lookup of over 2^16 ids is not remembered, and the remembered ones hold at most 2^18 ids:
// the oldest are forgotten first, and the memory they hold is counted.
TEST(SparseTableTest, RememberedLookupsAreBoundedInIds) {
  SparseTableOptions o = Opts(1);
  auto plain = MakeTable(o);
  o.remember_lookups = 64;
  auto table = MakeTable(o);
  auto batch = [](int64_t first, size_t n) {
    std::vector<int64_t> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = first + static_cast<int64_t>(i);
    return ids;
  };
  const size_t kMax = size_t{1} << 16;
  std::vector<float> out(kMax + 1), g(kMax + 1, 0.5f);
  const std::vector<int64_t> big = batch(0, kMax + 1);
  for (SparseTable* t : {plain.get(), table.get()}) {
    ASSERT_TRUE(t->Lookup(big, out.data()).ok());
    ASSERT_TRUE(t->ApplyGradients(big, g.data(), 0.1f, 1).ok());
  }
  EXPECT_EQ(table->Stats().updates_taking_lookups, 0);
  EXPECT_EQ(table->MemoryBytes(), plain->MemoryBytes());
  // Five lookups of 2^16 ids: the first is forgotten, the other four (2^18 ids) kept.
  std::vector<std::vector<int64_t>> batches;
  for (int b = 0; b < 5; ++b) {
    batches.push_back(batch(1000000 * (b + 1), kMax));
    for (SparseTable* t : {plain.get(), table.get()}) {
      ASSERT_TRUE(t->Lookup(batches.back(), out.data()).ok());
    }
  }
  // About 50 bytes per id of the four, and a spare.
  const int64_t remembered_bytes = table->MemoryBytes() - plain->MemoryBytes();
  EXPECT_GT(remembered_bytes, static_cast<int64_t>(4 * kMax * 40));
  EXPECT_LT(remembered_bytes, static_cast<int64_t>(6 * kMax * 64));
  ASSERT_TRUE(table->ApplyGradients(batches[0], g.data(), 0.1f, 2).ok());
  EXPECT_EQ(table->Stats().updates_taking_lookups, 0);
  for (int b = 1; b < 5; ++b)
    ASSERT_TRUE(table->ApplyGradients(batches[b], g.data(), 0.1f, 3).ok());
  EXPECT_EQ(table->Stats().updates_taking_lookups, 4);
}

TEST(SparseTableTest, LookupsAreNotRememberedWithAdmission) {
  SparseTableOptions o = Opts(4);
  o.admission_threshold = 2;
  o.remember_lookups = 2;
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> out(3 * 4);
  const std::vector<float> g = RandomFloats(3 * 4, 5);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());  // first sighting: no rows yet
  ASSERT_TRUE(table->Lookup({2}, out.data()).ok());  // admits 2
  ASSERT_TRUE(table->ApplyGradients(ids, g.data(), 0.5f, 1).ok());
  EXPECT_EQ(table->Stats().updates_taking_lookups, 0);
  EXPECT_EQ(table->Size(), 1);
  EXPECT_EQ(table->Stats().dropped_gradients, 2);
}

TEST(SparseTableTest, ExtremeIdsGetTheirOwnRows) {
  const SparseTableOptions o = Opts(6);
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = {0, -1, kMin64, kMax64, kE18};
  std::vector<float> out(ids.size() * o.dim);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  EXPECT_EQ(table->Size(), 5);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(std::vector<float>(out.begin() + i * o.dim, out.begin() + (i + 1) * o.dim),
              InitRow(o, ids[i]))
        << "id " << ids[i];
  }
  // Each row is updated on its own: p -= lr * g.
  const std::vector<float> grads = RandomFloats(ids.size() * o.dim, 5);
  ASSERT_TRUE(table->ApplyGradients(ids, grads.data(), 0.5f, 1).ok());
  EXPECT_EQ(table->Size(), 5);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> expect = InitRow(o, ids[i]);
    for (int64_t j = 0; j < o.dim; ++j) expect[j] -= 0.5f * grads[i * o.dim + j];
    EXPECT_EQ(Row(*table, ids[i]), expect) << "id " << ids[i];
  }
}

TEST(SparseTableTest, ExpectedRowsSizeTheMapsUpFrontAndChangeNoResult) {
  SparseTableOptions o = Opts(9, "adam");
  o.num_shards = 4;
  auto plain = MakeTable(o);
  o.expected_rows = 10000;
  auto sized = MakeTable(o);
  // Each shard's map holds its 2500 rows at a load factor <= 3/4 from the start: 4096 buckets
  // instead of growing from 16 while the rows come.
  EXPECT_GE(sized->MemoryBytes() - plain->MemoryBytes(), 4 * (4096 - 16) * 8);
  // A hint only: more rows than expected fit, and every value is the same as without it.
  std::vector<int64_t> ids(15000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919) - 50000;
  const std::vector<float> grads = RandomFloats(ids.size() * o.dim, 3);
  for (SparseTable* t : {plain.get(), sized.get()}) {
    std::vector<float> out(ids.size() * o.dim);
    ASSERT_TRUE(t->Lookup(ids, out.data()).ok());
    ASSERT_TRUE(t->ApplyGradients(ids, grads.data(), 0.01f, 1).ok());
    EXPECT_EQ(t->Size(), 15000);
  }
  for (int64_t id : {ids[0], ids[7777], ids[14999]}) {
    EXPECT_EQ(Row(*sized, id), Row(*plain, id)) << "id " << id;
    EXPECT_EQ(State(*sized, id), State(*plain, id)) << "id " << id;
  }
  // A vocabulary far beyond the first region sizes the maps for what that region holds only.
  o.expected_rows = int64_t{1} << 40;
  auto huge = MakeTable(o);
  EXPECT_LT(huge->MemoryBytes() - plain->MemoryBytes(), int64_t{1} << 20);
}

TEST(SparseTableTest, BatchOfOneRepeatedIdMergesGradientsBeforeTheOptimizer) {
  SparseTableOptions o = Opts(5, "adagrad");
  auto table = MakeTable(o);
  auto merged = MakeTable(o);
  const int n = 64;
  const std::vector<int64_t> ids(n, 42);
  std::vector<float> out(n * o.dim);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  EXPECT_EQ(table->Size(), 1);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::vector<float>(out.begin() + i * o.dim, out.begin() + (i + 1) * o.dim),
              InitRow(o, 42));
  }
  const std::vector<float> grads = RandomFloats(n * o.dim, 9);
  std::vector<float> sum(grads.begin(), grads.begin() + o.dim);
  for (int i = 1; i < n; ++i) {
    for (int64_t j = 0; j < o.dim; ++j) sum[j] += grads[i * o.dim + j];
  }
  ASSERT_TRUE(table->ApplyGradients(ids, grads.data(), 0.1f, 1).ok());
  const std::vector<int64_t> one = {42};
  ASSERT_TRUE(merged->ApplyGradients(one, sum.data(), 0.1f, 1).ok());
  EXPECT_EQ(Row(*table, 42), Row(*merged, 42));
  EXPECT_EQ(State(*table, 42), State(*merged, 42));
  EXPECT_NE(Row(*table, 42), InitRow(o, 42));
}

TEST(SparseTableTest, ScaledGradientsEqualGradientsScaledBeforehand) {
  // What the pserver passes for 1/N of N trainers' gradients, duplicate ids included: each row
  // is scaled before duplicates are summed, bit for bit as if the caller had scaled them.
  const std::vector<int64_t> ids = {5, -3, 5, kMin64, 5, kE18, -3};
  const std::vector<float> g = RandomFloats(ids.size() * 4, 11);
  std::vector<float> scaled(g.size());
  for (size_t i = 0; i < g.size(); ++i) scaled[i] = g[i] * (1.0f / 3.0f);
  for (const char* opt : {"sgd", "adagrad", "adam"}) {
    auto a = MakeTable(Opts(4, opt));
    auto b = MakeTable(Opts(4, opt));
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE(a->ApplyGradients(ids, g.data(), 0.1f, step, 1.0f / 3.0f).ok());
      ASSERT_TRUE(b->ApplyGradients(ids, scaled.data(), 0.1f, step).ok());
    }
    for (int64_t id : ids) {
      EXPECT_EQ(Row(*a, id), Row(*b, id)) << opt << " id " << id;
      EXPECT_EQ(State(*a, id), State(*b, id)) << opt << " id " << id;
    }
    // And scaling matters: unscaled gradients give other rows.
    auto c = MakeTable(Opts(4, opt));
    ASSERT_TRUE(c->ApplyGradients(ids, g.data(), 0.1f, 1).ok());
    auto d = MakeTable(Opts(4, opt));
    ASSERT_TRUE(d->ApplyGradients(ids, g.data(), 0.1f, 1, 1.0f / 3.0f).ok());
    EXPECT_NE(Row(*c, 5), Row(*d, 5)) << opt;
  }
}

TEST(SparseTableTest, EmptyBatchesAreNoOps) {
  auto table = MakeTable(Opts(4, "adam"));
  EXPECT_TRUE(table->Lookup({}, nullptr).ok());
  EXPECT_TRUE(table->ApplyGradients({}, nullptr, 0.1f, 1).ok());
  EXPECT_EQ(table->Size(), 0);
  const std::string path = TempPath("empty.tbl");
  absl::StatusOr<int64_t> n = table->Export(path, {});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  auto fresh = MakeTable(Opts(4, "adam"));
  n = fresh->Import(path);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  EXPECT_EQ(fresh->Size(), 0);
  // Null buffers with ids are an error, not a crash; adam needs a 1-based step.
  const std::vector<int64_t> ids = {1};
  EXPECT_EQ(table->Lookup(ids, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->ApplyGradients(ids, nullptr, 0.1f, 1).code(),
            absl::StatusCode::kInvalidArgument);
  const float g[4] = {1, 2, 3, 4};
  EXPECT_EQ(table->ApplyGradients(ids, g, 0.1f, 0).code(), absl::StatusCode::kInvalidArgument);
}

// Runs an op on `scope` through the executor.
void RunOp(const Executor& exec, const OpDesc& op, Scope* scope) {
  absl::Status s = exec.RunOp(op, scope);
  ASSERT_TRUE(s.ok()) << s;
}

class InitializerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InitializerTest, RowsEqualTheDenseRandomOpForAnyShardCount) {
  const std::string op_type = GetParam();
  const int64_t vocab = 40, dim = 7;
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;
  OpDesc op = MakeOp(op_type, {}, {{"Out", {"W"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{vocab, dim});
  SetAttr(&op, "seed", int64_t{77});
  SparseTableOptions o = Opts(dim);
  o.initializer.seed = 77;
  if (op_type == "uniform_random") {
    SetAttr(&op, "min", -0.25f);
    SetAttr(&op, "max", 0.75f);
  } else {
    SetAttr(&op, "mean", 0.5f);
    SetAttr(&op, "std", 2.0f);
    o.initializer.kind = SparseTableInitializer::kGaussian;
    o.initializer.mean = 0.5;
    o.initializer.std = 2.0;
  }
  RunOp(exec, op, &scope);
  const Tensor& w = scope.FindVar("W")->Get<Tensor>();
  ASSERT_EQ(w.numel(), vocab * dim);

  std::vector<int64_t> ids(vocab);
  for (int64_t i = 0; i < vocab; ++i) ids[i] = (i * 17 + 5) % vocab;  // a permutation
  for (int shards : {1, 4, 64}) {
    o.num_shards = shards;
    auto table = MakeTable(o);
    // Touch the ids in two batches, in a scrambled order.
    std::vector<float> out(vocab * dim);
    ASSERT_TRUE(table->Lookup(absl::MakeConstSpan(ids).subspan(0, 13), out.data()).ok());
    ASSERT_TRUE(table->Lookup(absl::MakeConstSpan(ids).subspan(13), out.data() + 13 * dim).ok());
    for (int64_t i = 0; i < vocab; ++i) {
      for (int64_t j = 0; j < dim; ++j) {
        ASSERT_EQ(out[i * dim + j], w.data<float>()[ids[i] * dim + j])
            << op_type << " shards " << shards << " id " << ids[i] << " col " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, InitializerTest,
                         ::testing::Values("uniform_random", "gaussian_random"));

TEST(SparseTableTest, ConstantInitializer) {
  SparseTableOptions o = Opts(3);
  o.initializer.kind = SparseTableInitializer::kConstant;
  o.initializer.value = 0.125;
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = {kMin64, 3};
  std::vector<float> out(6);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  EXPECT_EQ(out, std::vector<float>(6, 0.125f));
}

// The sparse table against the dense path: lookup_table_grad (is_sparse) + the optimizer op on a
// [V, dim] parameter created by uniform_random, run through the Executor for a few steps.
struct OptimizerCase {
  std::string optimizer;
  double l2;
};
void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.optimizer << " l2=" << c.l2; }

class OptimizerMatchTest : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerMatchTest, TouchedRowsEqualTheDenseSparseGradientKernel) {
  const OptimizerCase c = GetParam();
  const int64_t vocab = 12, dim = 5, batch = 9;
  const float lr = 0.05f, beta1 = 0.875f, beta2 = 0.9375f;
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;

  OpDesc init = MakeOp("uniform_random", {}, {{"Out", {"W"}}});
  SetAttr(&init, "shape", std::vector<int64_t>{vocab, dim});
  SetAttr(&init, "seed", int64_t{1234});
  SetAttr(&init, "min", -0.25f);
  SetAttr(&init, "max", 0.75f);
  RunOp(exec, init, &scope);
  scope.Var("lr")->GetMutable<Tensor>()->Resize(FLOAT32, {1});
  scope.FindVar("lr")->GetMutable<Tensor>()->data<float>()[0] = lr;

  OpDesc grad =
      MakeOp("lookup_table_grad", {{"W", {"W"}}, {"Ids", {"Ids"}}, {GradVarName("Out"), {"dOut"}}},
             {{GradVarName("W"), {"dW"}}});
  SetAttr(&grad, "is_sparse", true);

  Slots ins = {{"Param", {"W"}}, {"Grad", {"dW"}}, {"LearningRate", {"lr"}}};
  Slots outs = {{"ParamOut", {"W"}}};
  std::vector<std::string> moments;
  auto zeros = [&](const std::string& name, const Shape& shape, float v) {
    Tensor* t = scope.Var(name)->GetMutable<Tensor>();
    t->Resize(FLOAT32, shape);
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = v;
  };
  if (c.optimizer == "adagrad") {
    ins.push_back({"Moment", {"m"}});
    outs.push_back({"MomentOut", {"m"}});
    moments = {"m"};
  } else if (c.optimizer == "adam") {
    ins.insert(
        ins.end(),
        {{"Moment1", {"m1"}}, {"Moment2", {"m2"}}, {"Beta1Pow", {"b1p"}}, {"Beta2Pow", {"b2p"}}});
    outs.insert(outs.end(), {{"Moment1Out", {"m1"}},
                             {"Moment2Out", {"m2"}},
                             {"Beta1PowOut", {"b1p"}},
                             {"Beta2PowOut", {"b2p"}}});
    moments = {"m1", "m2"};
    zeros("b1p", {1}, beta1);
    zeros("b2p", {1}, beta2);
  }
  for (const std::string& m : moments) zeros(m, {vocab, dim}, 0.0f);
  OpDesc opt = MakeOp(c.optimizer, ins, outs);
  SetAttr(&opt, "regularization_coeff", static_cast<float>(c.l2));
  if (c.optimizer == "adam") {
    SetAttr(&opt, "beta1", beta1);
    SetAttr(&opt, "beta2", beta2);
  }

  SparseTableOptions o = Opts(dim, c.optimizer);
  o.l2 = static_cast<float>(c.l2);
  o.adam_beta1 = beta1;
  o.adam_beta2 = beta2;
  o.num_shards = 4;
  auto table = MakeTable(o);

  std::mt19937_64 rng(99);
  absl::flat_hash_map<int64_t, bool> touched;
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<int64_t> ids(batch);
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 6) * 2;  // duplicates, gaps
    const std::vector<float> dout = RandomFloats(batch * dim, 100 + step);
    Tensor* ids_t = scope.Var("Ids")->GetMutable<Tensor>();
    ids_t->Resize(INT64, {batch, 1});
    std::copy(ids.begin(), ids.end(), ids_t->data<int64_t>());
    Tensor* dout_t = scope.Var("dOut")->GetMutable<Tensor>();
    dout_t->Resize(FLOAT32, {batch, dim});
    std::copy(dout.begin(), dout.end(), dout_t->data<float>());

    // The trainer's view: the rows it looks up equal the dense parameter's rows.
    std::vector<float> looked(batch * dim);
    ASSERT_TRUE(table->Lookup(ids, looked.data()).ok());
    const Tensor& w = scope.FindVar("W")->Get<Tensor>();
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t j = 0; j < dim; ++j) {
        ASSERT_EQ(looked[i * dim + j], w.data<float>()[ids[i] * dim + j])
            << "lookup before step " << step << " id " << ids[i];
      }
    }
    RunOp(exec, grad, &scope);
    RunOp(exec, opt, &scope);
    ASSERT_TRUE(table->ApplyGradients(ids, dout.data(), lr, step).ok());
    for (int64_t id : ids) touched[id] = true;

    // Bit-exact: the table runs the kernels' Eigen expressions on the same merged gradients,
    // and the dyadic betas make the beta powers exact in both.
    for (const auto& [id, unused] : touched) {
      const std::vector<float> row = Row(*table, id);
      const std::vector<float> state = State(*table, id);
      for (int64_t j = 0; j < dim; ++j) {
        EXPECT_EQ(row[j], w.data<float>()[id * dim + j])
            << c.optimizer << " step " << step << " id " << id << " col " << j;
        for (size_t m = 0; m < moments.size(); ++m) {
          const Tensor& mt = scope.FindVar(moments[m])->Get<Tensor>();
          EXPECT_EQ(state[m * dim + j], mt.data<float>()[id * dim + j])
              << c.optimizer << " " << moments[m] << " step " << step << " id " << id;
        }
      }
    }
  }
  EXPECT_EQ(table->Size(), static_cast<int64_t>(touched.size()));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerMatchTest,
                         ::testing::Values(OptimizerCase{"sgd", 0.0}, OptimizerCase{"sgd", 0.01},
                                           OptimizerCase{"adagrad", 0.0},
                                           OptimizerCase{"adagrad", 0.01},
                                           OptimizerCase{"adam", 0.0}, OptimizerCase{"adam", 0.01}),
                         [](const ::testing::TestParamInfo<OptimizerCase>& info) {
                           return info.param.optimizer + (info.param.l2 == 0 ? "" : "_l2");
                         });

// Threads hammering overlapping ids end where serial application of the same batches ends.
// SGD from 0 with small integer gradients and lr 1 is exact in float, so any interleaving
// gives the same bits.
TEST(SparseTableTest, ConcurrentUpdatesEqualSerialApplication) {
  SparseTableOptions o = Opts(8);
  o.initializer.kind = SparseTableInitializer::kConstant;
  o.initializer.value = 0;
  o.num_shards = 4;  // few shards: many collisions on the same locks
  auto concurrent = MakeTable(o);
  auto serial = MakeTable(o);
  const int kThreads = 4, kIters = 300, kBatch = 48;

  auto batch_of = [&](int thread, int iter, std::vector<int64_t>* ids, std::vector<float>* g) {
    std::mt19937_64 rng(thread * 100003 + iter);
    ids->resize(kBatch);
    g->resize(kBatch * o.dim);
    for (int i = 0; i < kBatch; ++i) {
      // Mostly a small hot set shared by all threads (repeats within a batch), some spread ids.
      (*ids)[i] =
          rng() % 4 == 0 ? static_cast<int64_t>(rng()) : static_cast<int64_t>(rng() % 20) - 10;
    }
    for (float& x : *g) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  };

  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int64_t> ids;
      std::vector<float> g, out;
      for (int it = 0; it < kIters; ++it) {
        batch_of(t, it, &ids, &g);
        out.resize(ids.size() * o.dim);
        ASSERT_TRUE(concurrent->Lookup(ids, out.data()).ok());
        ASSERT_TRUE(concurrent->ApplyGradients(ids, g.data(), 1.0f, it + 1).ok());
      }
    });
  }
  // Readers and exporters run alongside.
  std::thread reader([&] {
    const std::string path = TempPath("concurrent.tbl");
    while (!done.load()) {
      EXPECT_GE(concurrent->MemoryBytes(), 0);
      EXPECT_TRUE(concurrent->Export(path, {}).ok());
    }
  });
  for (auto& th : threads) th.join();
  done = true;
  reader.join();

  std::vector<int64_t> ids;
  std::vector<float> g;
  absl::flat_hash_map<int64_t, std::vector<float>> sums;
  for (int t = 0; t < kThreads; ++t) {
    for (int it = 0; it < kIters; ++it) {
      batch_of(t, it, &ids, &g);
      ASSERT_TRUE(serial->ApplyGradients(ids, g.data(), 1.0f, it + 1).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        std::vector<float>& s = sums[ids[i]];
        s.resize(o.dim);
        for (int64_t j = 0; j < o.dim; ++j) s[j] += g[i * o.dim + j];
      }
    }
  }
  EXPECT_EQ(concurrent->Size(), static_cast<int64_t>(sums.size()));
  EXPECT_EQ(serial->Size(), static_cast<int64_t>(sums.size()));
  for (const auto& [id, s] : sums) {
    std::vector<float> expect(o.dim);
    for (int64_t j = 0; j < o.dim; ++j) expect[j] = -s[j];
    ASSERT_EQ(Row(*concurrent, id), expect) << "id " << id;
    ASSERT_EQ(Row(*serial, id), expect) << "id " << id;
  }
}

TEST(SparseTableTest, AdmissionCreatesRowsOnlyAtTheKthSighting) {
  SparseTableOptions o = Opts(4);
  o.admission_threshold = 3;
  auto table = MakeTable(o);
  const std::vector<int64_t> seven = {7};
  std::vector<float> out(4);
  const std::vector<float> g = {1, 1, 1, 1};

  ASSERT_TRUE(table->Lookup(seven, out.data()).ok());
  EXPECT_EQ(out, InitRow(o, 7));  // the initial value, not stored
  EXPECT_EQ(table->Size(), 0);
  EXPECT_EQ(table->Stats().pending_ids, 1);
  ASSERT_TRUE(table->ApplyGradients(seven, g.data(), 1.0f, 1).ok());  // dropped
  EXPECT_EQ(table->Stats().dropped_gradients, 1);
  EXPECT_FALSE(table->PeekRow(7, out.data()));

  ASSERT_TRUE(table->Lookup(seven, out.data()).ok());
  EXPECT_EQ(table->Size(), 0);
  ASSERT_TRUE(table->Lookup(seven, out.data()).ok());  // the third sighting
  EXPECT_EQ(table->Size(), 1);
  EXPECT_EQ(table->Stats().pending_ids, 0);
  EXPECT_EQ(Row(*table, 7), InitRow(o, 7));
  ASSERT_TRUE(table->ApplyGradients(seven, g.data(), 1.0f, 2).ok());
  std::vector<float> expect = InitRow(o, 7);
  for (float& x : expect) x -= 1;
  EXPECT_EQ(Row(*table, 7), expect);
  EXPECT_EQ(table->Stats().dropped_gradients, 1);

  // Repeats within one batch count: the third occurrence creates the row.
  const std::vector<int64_t> nines = {9, 9, 9, 9};
  std::vector<float> out4(16);
  ASSERT_TRUE(table->Lookup(nines, out4.data()).ok());
  EXPECT_TRUE(table->PeekRow(9, out.data()));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::vector<float>(out4.begin() + 4 * i, out4.begin() + 4 * i + 4), InitRow(o, 9));
  }
  EXPECT_EQ(table->Size(), 2);
}

TEST(SparseTableTest, RowBudgetRefusesNewIdsAndKeepsEveryHeldRow) {
  SparseTableOptions o = Opts(4, "adagrad");
  o.max_rows = 100;
  o.num_shards = 4;
  auto table = MakeTable(o);
  std::vector<int64_t> first(100);
  for (int64_t i = 0; i < 100; ++i) first[i] = i * 7919 - 300;
  std::vector<float> out(4 * 100);
  ASSERT_TRUE(table->Lookup(first, out.data()).ok());
  EXPECT_EQ(table->Size(), 100);
  const std::vector<float> before = Row(*table, first[5]);

  // A batch with one new id: refused by name of the budget; no held row is dropped.
  std::vector<int64_t> mixed = {first[5], 123456789, first[6]};
  absl::Status s = table->Lookup(mixed, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("budget of 100 rows"), std::string::npos) << s;
  EXPECT_EQ(table->Size(), 100);
  EXPECT_FALSE(table->PeekRow(123456789, out.data()));
  EXPECT_EQ(Row(*table, first[5]), before);
  // Gradients for new ids are refused the same way; held rows still train.
  const std::vector<float> g(4, 1.0f);
  const std::vector<int64_t> fresh = {-42};
  s = table->ApplyGradients(fresh, g.data(), 0.1f, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  const std::vector<int64_t> held = {first[5]};
  ASSERT_TRUE(table->ApplyGradients(held, g.data(), 0.1f, 1).ok());
  EXPECT_NE(Row(*table, first[5]), before);
  EXPECT_EQ(table->Stats().refused_rows, 2);

  // A flood of fresh ids never grows the table past its budget.
  for (int round = 0; round < 50; ++round) {
    std::vector<int64_t> ids(1000);
    for (int i = 0; i < 1000; ++i) ids[i] = int64_t{1} << 40 | (round * 1000 + i);
    std::vector<float> rows(4 * ids.size());
    EXPECT_FALSE(table->Lookup(ids, rows.data()).ok());
  }
  EXPECT_EQ(table->Size(), 100);
  EXPECT_GE(table->Stats().refused_rows, 50);
}

TEST(SparseTableTest, RowBudgetFreedByEvictionAndBoundingAdmissionCounts) {
  SparseTableOptions o = Opts(2);
  o.max_rows = 8;
  o.num_shards = 2;
  o.evict_after_steps = 1;
  auto table = MakeTable(o);
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> out(2 * 8);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  const std::vector<int64_t> nine = {9};
  EXPECT_FALSE(table->Lookup(nine, out.data()).ok());
  table->AdvanceStep(1);
  EXPECT_EQ(table->EvictStale(), 8);  // room again
  EXPECT_TRUE(table->Lookup(nine, out.data()).ok());
  EXPECT_EQ(table->Size(), 1);

  // With admission on, at most max_rows / num_shards ids wait per shard; others get initial
  // values and are not remembered.
  SparseTableOptions a = Opts(2);
  a.max_rows = 8;
  a.num_shards = 2;
  a.admission_threshold = 3;
  auto admitting = MakeTable(a);
  std::vector<int64_t> many(1000);
  for (int i = 0; i < 1000; ++i) many[i] = 1000 + i;
  std::vector<float> rows(2 * many.size());
  ASSERT_TRUE(admitting->Lookup(many, rows.data()).ok());
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(std::vector<float>(rows.begin() + 2 * i, rows.begin() + 2 * i + 2),
              InitRow(a, many[i]));
  }
  EXPECT_LE(admitting->Stats().pending_ids, 8);
  EXPECT_GE(admitting->Stats().refused_rows, 992);
  EXPECT_EQ(admitting->Size(), 0);
}

TEST(SparseTableTest, EvictsRowsUnseenForTSteps) {
  SparseTableOptions o = Opts(4);
  o.evict_after_steps = 2;
  auto table = MakeTable(o);
  const std::vector<float> g(8, 1.0f);
  std::vector<float> out(12);
  const std::vector<int64_t> abc = {1, 2, 3};
  ASSERT_TRUE(table->Lookup(abc, out.data()).ok());  // seen at step 0
  const std::vector<int64_t> a = {1}, ab = {1, 2};
  ASSERT_TRUE(table->ApplyGradients(a, g.data(), 1.0f, 1).ok());
  EXPECT_EQ(table->EvictStale(), 0);  // 3 is 1 step old
  ASSERT_TRUE(table->ApplyGradients(ab, g.data(), 1.0f, 2).ok());
  EXPECT_EQ(table->EvictStale(), 1);  // 3 is 2 steps old
  EXPECT_FALSE(table->PeekRow(3, out.data()));
  EXPECT_EQ(table->Size(), 2);
  EXPECT_EQ(table->Stats().evicted_rows, 1);
  ASSERT_TRUE(table->ApplyGradients(a, g.data(), 1.0f, 3).ok());
  table->AdvanceStep(4);
  EXPECT_EQ(table->EvictStale(), 1);  // 2 last seen at step 2
  EXPECT_FALSE(table->PeekRow(2, out.data()));
  EXPECT_TRUE(table->PeekRow(1, out.data()));
  // An evicted id comes back with its initial value.
  const std::vector<int64_t> b = {2};
  ASSERT_TRUE(table->Lookup(b, out.data()).ok());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), InitRow(o, 2));
}

TEST(SparseTableTest, EvictsRowsUnseenForTSeconds) {
  SparseTableOptions o = Opts(2);
  o.evict_after_seconds = 10;
  absl::Time now = absl::FromUnixSeconds(1000000);
  o.clock = [&now] { return now; };
  auto table = MakeTable(o);
  std::vector<float> out(4);
  const std::vector<int64_t> ab = {10, 20}, a = {10};
  ASSERT_TRUE(table->Lookup(ab, out.data()).ok());
  now += absl::Seconds(5);
  ASSERT_TRUE(table->Lookup(a, out.data()).ok());
  now += absl::Seconds(7);  // 20: 12 s unseen, 10: 7 s
  EXPECT_EQ(table->EvictStale(), 1);
  EXPECT_TRUE(table->PeekRow(10, out.data()));
  EXPECT_FALSE(table->PeekRow(20, out.data()));
}

TEST(SparseTableTest, EvictionForgetsPendingAdmissionCounts) {
  SparseTableOptions o = Opts(2);
  o.admission_threshold = 2;
  o.evict_after_steps = 1;
  auto table = MakeTable(o);
  std::vector<float> out(2);
  const std::vector<int64_t> five = {5};
  ASSERT_TRUE(table->Lookup(five, out.data()).ok());
  EXPECT_EQ(table->Stats().pending_ids, 1);
  table->AdvanceStep(1);
  EXPECT_EQ(table->EvictStale(), 0);
  EXPECT_EQ(table->Stats().pending_ids, 0);
  ASSERT_TRUE(table->Lookup(five, out.data()).ok());  // counts as the first sighting again
  EXPECT_EQ(table->Size(), 0);
  ASSERT_TRUE(table->Lookup(five, out.data()).ok());
  EXPECT_EQ(table->Size(), 1);
}

TEST(SparseTableTest, EvictedSlotsAreReused) {
  SparseTableOptions o = Opts(16);
  o.num_shards = 1;
  o.evict_after_steps = 1;
  auto table = MakeTable(o);
  std::vector<int64_t> ids(10000);
  std::vector<float> out(ids.size() * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  const int64_t bytes = table->MemoryBytes();
  table->AdvanceStep(1);
  EXPECT_EQ(table->EvictStale(), 10000);
  EXPECT_EQ(table->Size(), 0);
  for (int64_t& id : ids) id += 1000000;
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  EXPECT_EQ(table->Size(), 10000);
  EXPECT_EQ(table->MemoryBytes(), bytes);
  // The map still finds every row after backward-shift deletions and reuse.
  for (size_t i = 0; i < ids.size(); i += 97) EXPECT_EQ(Row(*table, ids[i]), InitRow(o, ids[i]));
}

// A table with some updated rows, among them the extreme ids.
std::vector<int64_t> Populate(SparseTable* table, int n) {
  std::vector<int64_t> ids = {0, -1, kMin64, kMax64, kE18};
  for (int i = 1; i <= n; ++i) ids.push_back(i * 7919);
  const int64_t dim = table->options().dim;
  std::vector<float> out(ids.size() * dim);
  EXPECT_TRUE(table->Lookup(ids, out.data()).ok());
  const std::vector<float> g = RandomFloats(ids.size() * dim, 3);
  EXPECT_TRUE(table->ApplyGradients(ids, g.data(), 0.1f, 1).ok());
  EXPECT_TRUE(table->ApplyGradients(ids, g.data(), 0.1f, 2).ok());
  return ids;
}

// An export file's contents.
struct ParsedExport {
  uint32_t flags = 0;
  std::map<int64_t, std::vector<float>> rows;  // values and state
  std::vector<int64_t> tombstones;             // sorted
};

ParsedExport Parse(const std::string& bytes, int64_t dim) {
  ParsedExport p;
  if (bytes.size() < 40) {
    ADD_FAILURE() << "export of " << bytes.size() << " bytes";
    return p;
  }
  uint32_t state_width;
  uint64_t count;
  std::memcpy(&p.flags, bytes.data() + 12, 4);
  std::memcpy(&state_width, bytes.data() + 20, 4);
  std::memcpy(&count, bytes.data() + 24, 8);
  const size_t width = static_cast<size_t>(dim) + state_width;
  const size_t record = 8 + 4 * width + 4;
  size_t at = 40;
  for (uint64_t k = 0; k < count && at + record <= bytes.size(); ++k, at += record) {
    int64_t id;
    std::memcpy(&id, bytes.data() + at, 8);
    std::vector<float>& row = p.rows[id];
    row.resize(width);
    std::memcpy(row.data(), bytes.data() + at + 8, 4 * width);
  }
  EXPECT_EQ(p.rows.size(), count) << "ids must be unique";
  if ((p.flags & sparse_table_format::kFlagTombstones) != 0 && at + 8 <= bytes.size()) {
    uint64_t n;
    std::memcpy(&n, bytes.data() + at, 8);
    for (uint64_t i = 0; i < n && at + 16 + 8 * i <= bytes.size(); ++i) {
      int64_t id;
      std::memcpy(&id, bytes.data() + at + 8 + 8 * i, 8);
      p.tombstones.push_back(id);
    }
    at += 12 + 8 * n;
  }
  EXPECT_EQ(bytes.size(), at);
  std::sort(p.tombstones.begin(), p.tombstones.end());
  return p;
}

std::vector<int64_t> Sorted(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<int64_t> Keys(const ParsedExport& p) {
  std::vector<int64_t> ids;
  for (const auto& [id, unused] : p.rows) ids.push_back(id);
  return ids;
}

// `replica` holds exactly the rows of a full export of `table` (ids, values bit for bit).
void ExpectSameRows(const SparseTable& replica, SparseTable& table, const std::string& when) {
  const int64_t dim = table.options().dim;
  const ParsedExport full = Parse(table.ExportBytes({false, false, /*keep_delta_cut=*/true}), dim);
  EXPECT_EQ(replica.Size(), table.Size()) << when;
  EXPECT_EQ(replica.Size(), static_cast<int64_t>(full.rows.size())) << when;
  std::vector<float> got(dim);
  for (const auto& [id, want] : full.rows) {
    ASSERT_TRUE(replica.PeekRow(id, got.data())) << when << ": no row " << id;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * dim), 0)
        << when << ": id " << id;
  }
}

std::vector<int64_t> Concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<int64_t> IdRange(int64_t first, int64_t last) {
  std::vector<int64_t> ids;
  for (int64_t i = first; i <= last; ++i) ids.push_back(i * 7919);
  return ids;
}

// A base and three deltas, with eviction (of rows in the base, of rows exported in a delta, of
// a row evicted and created again) and checkpoint exports (keep_delta_cut) in between: a
// replica loading the chain in order holds exactly the table's rows after each delta.
TEST(SparseTableTest, BaseAndDeltasWithTombstonesRebuildTheTable) {
  SparseTableOptions o = Opts(4, "adagrad");
  o.num_shards = 4;
  o.evict_after_steps = 2;
  auto table = MakeTable(o);
  auto replica = MakeTable(Opts(4, "adagrad"));
  const std::vector<int64_t> keep = Concat({IdRange(1, 8), {kMin64, kMax64}});  // always trained
  const std::vector<int64_t> old = IdRange(11, 20);   // in the base, then evicted
  const std::vector<int64_t> new1 = IdRange(31, 36);  // new in delta 1, evicted in window 2
  const std::vector<int64_t> new2 = IdRange(41, 44);  // new in delta 2, evicted in window 3
  const int64_t r = -5;  // in the base, evicted in window 1, created again in window 2
  const int64_t x = -6;  // in the base, changed in delta 1, evicted in window 2
  const int64_t z = -7;  // new in delta 1, evicted and created again in window 2, evicted in 3
  auto train = [&](const std::vector<int64_t>& ids, int64_t step) {
    const std::vector<float> g = RandomFloats(ids.size() * 4, 1000 + step);
    ASSERT_TRUE(table->ApplyGradients(ids, g.data(), 0.1f, step).ok());
  };
  auto load = [&](const std::string& bytes, const std::string& name) {
    absl::StatusOr<int64_t> n = replica->ImportBytes(bytes, name);
    ASSERT_TRUE(n.ok()) << n.status();
  };

  train(Concat({keep, old, {r, x}}), 1);
  const std::string base = table->ExportBytes({});
  EXPECT_EQ(Parse(base, 4).flags, 0u);
  load(base, "base");
  ExpectSameRows(*replica, *table, "base");

  // Window 1.
  train(Concat({keep, new1, {x, z}}), 2);
  table->ExportBytes({false, true, /*keep_delta_cut=*/true});  // a checkpoint
  table->AdvanceStep(3);
  EXPECT_EQ(table->EvictStale(), static_cast<int64_t>(old.size()) + 1);  // old and r
  const std::string delta1 = table->ExportBytes({/*only_changed=*/true, false});
  ParsedExport d1 = Parse(delta1, 4);
  EXPECT_EQ(d1.flags, sparse_table_format::kFlagOnlyChanged | sparse_table_format::kFlagTombstones);
  EXPECT_EQ(Keys(d1), Sorted(Concat({keep, new1, {x, z}})));
  EXPECT_EQ(d1.tombstones, Sorted(Concat({old, {r}})));
  load(delta1, "delta1");
  ExpectSameRows(*replica, *table, "delta 1");

  // Window 2.
  train(Concat({keep, new2, {r}}), 4);
  EXPECT_EQ(table->EvictStale(), static_cast<int64_t>(new1.size()) + 2);  // new1, x and z
  std::vector<float> out(4);
  const std::vector<int64_t> zs = {z};
  ASSERT_TRUE(table->Lookup(zs, out.data()).ok());  // created again: a record, no tombstone
  // A checkpoint's only_changed export lists what the next delta will.
  const std::string peek = table->ExportBytes({true, false, /*keep_delta_cut=*/true});
  const std::string path2 = TempPath("delta2.tbl");
  absl::StatusOr<int64_t> n = table->Export(path2, {true, false});
  ASSERT_TRUE(n.ok()) << n.status();
  const std::string delta2 = ReadFile(path2);
  EXPECT_EQ(peek, delta2);
  ParsedExport d2 = Parse(delta2, 4);
  EXPECT_EQ(*n, static_cast<int64_t>(d2.rows.size()));
  EXPECT_EQ(Keys(d2), Sorted(Concat({keep, new2, {r, z}})));
  EXPECT_EQ(d2.tombstones, Sorted(Concat({new1, {x}})));
  EXPECT_EQ(delta2.size(), 40 + d2.rows.size() * (8 + 4 * 4 + 4) + 12 + 8 * d2.tombstones.size());
  n = replica->Import(path2);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(d2.rows.size()));
  ExpectSameRows(*replica, *table, "delta 2");

  // Window 3.
  train(Concat({keep, {r}}), 5);
  table->AdvanceStep(6);
  EXPECT_EQ(table->EvictStale(), static_cast<int64_t>(new2.size()) + 1);  // new2 and z
  table->ExportBytes({false, true, /*keep_delta_cut=*/true});             // a checkpoint
  const std::string delta3 = table->ExportBytes({true, false});
  ParsedExport d3 = Parse(delta3, 4);
  EXPECT_EQ(Keys(d3), Sorted(Concat({keep, {r}})));
  EXPECT_EQ(d3.tombstones, Sorted(Concat({new2, {z}})));
  load(delta3, "delta3");
  ExpectSameRows(*replica, *table, "delta 3");
  EXPECT_EQ(replica->Size(), static_cast<int64_t>(keep.size()) + 1);
  // Tombstones removed by an import are not evictions of the replica.
  EXPECT_EQ(replica->Stats().evicted_rows, 0);

  // Passed tombstones are dropped: nothing changed, nothing evicted since delta 3.
  const ParsedExport empty = Parse(table->ExportBytes({true, false}), 4);
  EXPECT_TRUE(empty.rows.empty());
  EXPECT_TRUE(empty.tombstones.empty());
}

// A table with some rows in a base export, then a delta with tombstones.
struct DeltaFixture {
  std::unique_ptr<SparseTable> table;
  std::string base, delta;
  std::vector<int64_t> changed, evicted;
};

DeltaFixture MakeDelta() {
  DeltaFixture f;
  SparseTableOptions o = Opts(4);
  o.evict_after_steps = 1;
  f.table = MakeTable(o);
  const std::vector<int64_t> all = IdRange(1, 20);
  std::vector<float> g = RandomFloats(all.size() * 4, 7);
  EXPECT_TRUE(f.table->ApplyGradients(all, g.data(), 0.1f, 1).ok());
  f.base = f.table->ExportBytes({});
  f.changed = IdRange(1, 10);
  g = RandomFloats(f.changed.size() * 4, 8);
  EXPECT_TRUE(f.table->ApplyGradients(f.changed, g.data(), 0.1f, 2).ok());
  f.evicted = IdRange(11, 20);
  EXPECT_EQ(f.table->EvictStale(), static_cast<int64_t>(f.evicted.size()));
  f.delta = f.table->ExportBytes({true, false});
  return f;
}

TEST(SparseTableTest, ImportRefusesACorruptTombstoneTrailerAndChangesNothing) {
  DeltaFixture f = MakeDelta();
  const size_t record = 8 + 4 * 4 + 4;
  const size_t trailer = 40 + f.changed.size() * record;
  ASSERT_EQ(f.delta.size(), trailer + 12 + 8 * f.evicted.size());
  std::string flipped = f.delta;
  flipped[trailer + 8 + 8 * 3 + 2] ^= 0x10;  // a byte of the fourth id
  const std::string truncated = f.delta.substr(0, f.delta.size() - 4);
  for (const auto& [bytes, needle] :
       {std::make_pair(flipped, std::string("checksum mismatch")),
        std::make_pair(flipped, absl::StrCat("offset ", trailer + 8 + 8 * f.evicted.size())),
        std::make_pair(truncated, absl::StrCat("offset ", trailer))}) {
    auto replica = MakeTable(Opts(4));
    ASSERT_TRUE(replica->ImportBytes(f.base, "base").ok());
    const std::string before = replica->ExportBytes({false, false, true});
    absl::StatusOr<int64_t> n = replica->ImportBytes(bytes, "ckpt/delta.tbl");
    EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
    EXPECT_NE(n.status().message().find("ckpt/delta.tbl"), std::string::npos) << n.status();
    EXPECT_NE(n.status().message().find(needle), std::string::npos) << n.status();
    // From a file: the same refusal, naming it.
    const std::string path = TempPath("bad_delta.tbl");
    WriteFile(path, bytes);
    n = replica->Import(path);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kDataLoss) << n.status();
    EXPECT_NE(n.status().message().find(path), std::string::npos) << n.status();
    EXPECT_NE(n.status().message().find(needle), std::string::npos) << n.status();
    // Neither a record nor a tombstone was applied.
    EXPECT_EQ(replica->ExportBytes({false, false, true}), before);
    EXPECT_EQ(replica->Size(), 20);
  }
  // The intact delta applies.
  auto replica = MakeTable(Opts(4));
  ASSERT_TRUE(replica->ImportBytes(f.base, "base").ok());
  ASSERT_TRUE(replica->ImportBytes(f.delta, "delta").ok());
  ExpectSameRows(*replica, *f.table, "intact delta");
}

TEST(SparseTableTest, ImportWithAFilterAppliesOnlyThePassingIds) {
  DeltaFixture f = MakeDelta();
  auto even = [](int64_t id) { return (id & 1) == 0; };  // ids i * 7919: even for even i
  // The base: only the even ids become rows.
  auto replica = MakeTable(Opts(4));
  absl::StatusOr<int64_t> n = replica->ImportBytes(f.base, "base", even);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 10);
  EXPECT_EQ(replica->Size(), 10);
  for (int64_t id : IdRange(1, 20)) EXPECT_EQ(replica->PeekRow(id, nullptr), even(id)) << id;

  // The delta: even records overwrite, even tombstones remove; odd ones are left alone.
  auto full = MakeTable(Opts(4));
  ASSERT_TRUE(full->ImportBytes(f.base, "base").ok());
  const std::string path = TempPath("filtered_delta.tbl");
  WriteFile(path, f.delta);
  n = full->Import(path, even);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 5);
  EXPECT_EQ(full->Size(), 20 - 5);
  auto base_only = MakeTable(Opts(4));
  ASSERT_TRUE(base_only->ImportBytes(f.base, "base").ok());
  for (int64_t id : f.changed) {
    EXPECT_EQ(Row(*full, id), even(id) ? Row(*f.table, id) : Row(*base_only, id)) << id;
  }
  for (int64_t id : f.evicted) EXPECT_EQ(full->PeekRow(id, nullptr), !even(id)) << id;
}

TEST(SparseTableTest, LookupReadOnlyCreatesAndTouchesNothing) {
  SparseTableOptions o = Opts(4, "adagrad");
  o.admission_threshold = 2;
  o.evict_after_steps = 2;
  auto table = MakeTable(o);
  const std::vector<int64_t> held = IdRange(1, 30);
  std::vector<float> out(held.size() * 4);
  ASSERT_TRUE(table->Lookup(held, out.data()).ok());
  ASSERT_TRUE(table->Lookup(held, out.data()).ok());  // admitted
  const std::vector<float> g = RandomFloats(held.size() * 4, 5);
  ASSERT_TRUE(table->ApplyGradients(held, g.data(), 0.1f, 1).ok());
  ASSERT_EQ(table->Size(), 30);
  const SparseTableStats before = table->Stats();
  table->AdvanceStep(2);  // a lookup now would mark rows seen at step 2

  // Held rows, unseen ids (the extremes among them) and repeats of both.
  const std::vector<int64_t> ids = {held[3], -77, held[0], kMin64, held[3], -77, kMax64, held[29]};
  std::vector<float> got(ids.size() * 4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(table->LookupReadOnly(ids, got.data()).ok());
  auto fresh = MakeTable(Opts(4, "adagrad"));  // what a Lookup gives an id it never saw
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> want(4);
    if (!table->PeekRow(ids[i], want.data())) {
      const std::vector<int64_t> one = {ids[i]};
      ASSERT_TRUE(fresh->Lookup(one, want.data()).ok());
    }
    EXPECT_EQ(std::memcmp(got.data() + 4 * i, want.data(), sizeof(float) * 4), 0) << ids[i];
  }
  // The held rows' values are what Lookup returns.
  const std::vector<int64_t> some = {held[3], held[0]};
  std::vector<float> looked(8);
  ASSERT_TRUE(table->Lookup(some, looked.data()).ok());
  EXPECT_EQ(std::memcmp(looked.data(), got.data(), sizeof(float) * 4), 0);
  EXPECT_EQ(std::memcmp(looked.data() + 4, got.data() + 8, sizeof(float) * 4), 0);

  const SparseTableStats after = table->Stats();
  EXPECT_EQ(table->Size(), 30);
  EXPECT_EQ(after.created_rows, before.created_rows);
  EXPECT_EQ(after.pending_ids, before.pending_ids);  // unseen ids not counted for admission
  EXPECT_EQ(after.refused_rows, before.refused_rows);
  // Nothing was marked seen (all rows were last seen at step 1): at step 3 every row that only
  // LookupReadOnly saw ages out, and the two that Lookup saw at step 2 stay.
  table->AdvanceStep(3);
  EXPECT_EQ(table->EvictStale(), 28);
  EXPECT_TRUE(table->LookupReadOnly({}, nullptr).ok());
  EXPECT_EQ(table->LookupReadOnly(some, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Serving reads beside training, imports and eviction: every row read is whole (each row's
// values are all equal here, whatever happened to it).
TEST(SparseTableTest, LookupReadOnlyRunsBesideWritersAndReadsWholeRows) {
  SparseTableOptions o = Opts(8);
  o.initializer.kind = SparseTableInitializer::kConstant;
  o.initializer.value = 0;
  o.num_shards = 4;
  o.evict_after_steps = 3;
  auto table = MakeTable(o);
  std::vector<int64_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = i * 7919 - 500;
  auto grads = [&](float v, size_t rows) {
    std::vector<float> g(rows * 8);
    for (size_t i = 0; i < rows; ++i)
      std::fill_n(g.begin() + i * 8, 8, v + static_cast<float>(i % 3));
    return g;
  };
  auto source = MakeTable(o);
  const std::vector<float> five = grads(-5, ids.size());
  ASSERT_TRUE(source->ApplyGradients(ids, five.data(), 1.0f, 1).ok());
  const std::string rows = source->ExportBytes({});

  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int step = 1; step <= 300; ++step) {
      const size_t n = 50 + step % 150;
      const std::vector<float> g = grads(static_cast<float>(step % 7), n);
      EXPECT_TRUE(
          table->ApplyGradients(absl::MakeConstSpan(ids).subspan(0, n), g.data(), 1.0f, step).ok());
      if (step % 10 == 0) EXPECT_TRUE(table->ImportBytes(rows, "rows").ok());
      if (step % 5 == 0) table->EvictStale();
    }
    done = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      std::vector<float> out(ids.size() * 8);
      while (!done.load()) {
        ASSERT_TRUE(table->LookupReadOnly(ids, out.data()).ok());
        for (size_t i = 0; i < ids.size(); ++i) {
          for (int j = 1; j < 8; ++j) ASSERT_EQ(out[i * 8 + j], out[i * 8]) << "id " << ids[i];
        }
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
}

TEST(SparseTableTest, ExportRoundTripsIntoAFreshTable) {
  SparseTableOptions o = Opts(4, "adagrad");
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = Populate(table.get(), 100);
  const std::string path = TempPath("full.tbl");

  absl::StatusOr<int64_t> n = table->Export(path, {false, /*with_optimizer_state=*/true});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(ids.size()));
  o.num_shards = 8;  // the shard count does not matter
  auto fresh = MakeTable(o);
  n = fresh->Import(path);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(fresh->Size(), table->Size());
  for (int64_t id : ids) {
    EXPECT_EQ(Row(*fresh, id), Row(*table, id)) << id;
    EXPECT_EQ(State(*fresh, id), State(*table, id)) << id;
  }

  // Values only (for serving): the state starts at zero.
  n = table->Export(path, {});
  ASSERT_TRUE(n.ok()) << n.status();
  auto serving = MakeTable(o);
  ASSERT_TRUE(serving->Import(path).ok());
  for (int64_t id : ids) {
    EXPECT_EQ(Row(*serving, id), Row(*table, id)) << id;
    EXPECT_EQ(State(*serving, id), std::vector<float>(4, 0.0f)) << id;
  }
  // No temp files are left beside the export.
  DIR* dir = opendir(TempPath("").c_str());
  ASSERT_NE(dir, nullptr);
  while (dirent* e = readdir(dir)) {
    EXPECT_EQ(std::string(e->d_name).find(".tmp."), std::string::npos) << e->d_name;
  }
  closedir(dir);
}

TEST(SparseTableTest, OnlyChangedExportHoldsExactlyTheChangedRows) {
  SparseTableOptions o = Opts(3, "adam");
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = Populate(table.get(), 50);
  const std::string full = TempPath("base.tbl"), delta = TempPath("delta.tbl");
  ASSERT_TRUE(table->Export(full, {}).ok());

  // Change three rows, create one; a lookup of an existing row is not a change.
  const std::vector<int64_t> changed = {-1, 7919 * 3, kMax64};
  const std::vector<float> g = RandomFloats(changed.size() * 3, 11);
  ASSERT_TRUE(table->ApplyGradients(changed, g.data(), 0.1f, 3).ok());
  std::vector<float> out(6);
  const std::vector<int64_t> looked = {4242, 7919};
  ASSERT_TRUE(table->Lookup(looked, out.data()).ok());

  absl::StatusOr<int64_t> n = table->Export(delta, {/*only_changed=*/true, false});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4);
  auto only = MakeTable(o);
  ASSERT_TRUE(only->Import(delta).ok());
  EXPECT_EQ(only->Size(), 4);
  for (int64_t id : {int64_t{-1}, int64_t{7919 * 3}, kMax64, int64_t{4242}}) {
    EXPECT_EQ(Row(*only, id), Row(*table, id)) << id;
  }
  // base + delta == the table now.
  auto replica = MakeTable(o);
  ASSERT_TRUE(replica->Import(full).ok());
  ASSERT_TRUE(replica->Import(delta).ok());
  EXPECT_EQ(replica->Size(), table->Size());
  for (int64_t id : ids) EXPECT_EQ(Row(*replica, id), Row(*table, id)) << id;

  // Nothing changed since: an empty delta.
  n = table->Export(delta, {true, false});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);

  // A failed export does not count as an export: its changes stay in the next delta.
  const std::vector<int64_t> one = {0};
  ASSERT_TRUE(table->ApplyGradients(one, g.data(), 0.1f, 4).ok());
  n = table->Export(TempPath("no/such/dir/x.tbl"), {true, false});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("no/such/dir/x.tbl"), std::string::npos) << n.status();
  n = table->Export(delta, {true, false});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);

  // Imported rows do not count as changed.
  n = replica->Export(delta, {true, false});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
}

TEST(SparseTableTest, ExportBytesAreTheExportFileAndImportBack) {
  SparseTableOptions o = Opts(4, "adam");
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = Populate(table.get(), 50);
  const std::string path = TempPath("bytes.tbl");
  ASSERT_TRUE(table->Export(path, {false, true}).ok());
  const std::string bytes = table->ExportBytes({false, true});
  EXPECT_EQ(bytes, ReadFile(path));
  auto fresh = MakeTable(o);
  absl::StatusOr<int64_t> n = fresh->ImportBytes(bytes, "in-memory");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(ids.size()));
  for (int64_t id : ids) {
    EXPECT_EQ(Row(*fresh, id), Row(*table, id)) << id;
    EXPECT_EQ(State(*fresh, id), State(*table, id)) << id;
  }
  // ExportBytes is an export for only_changed: nothing changed since (an empty delta: the header
  // and an empty tombstone trailer).
  EXPECT_EQ(table->ExportBytes({/*only_changed=*/true, false}).size(), 40u + 12u);
  // One with keep_delta_cut (a checkpoint's) is not: the change stays in the next delta.
  const std::vector<int64_t> one = {ids[3]};
  const std::vector<float> g = RandomFloats(4, 21);
  ASSERT_TRUE(table->ApplyGradients(one, g.data(), 0.1f, 3).ok());
  auto count_of = [](const std::string& b) { return Parse(b, 4).rows.size(); };
  EXPECT_EQ(count_of(table->ExportBytes({false, true, /*keep_delta_cut=*/true})), ids.size());
  EXPECT_EQ(count_of(table->ExportBytes({true, false, /*keep_delta_cut=*/true})), 1u);
  EXPECT_EQ(count_of(table->ExportBytes({true, false})), 1u);
  EXPECT_EQ(count_of(table->ExportBytes({true, false})), 0u);
}

TEST(SparseTableTest, ImportRejectsCorruptFilesNamingFileAndOffset) {
  SparseTableOptions o = Opts(4);
  auto table = MakeTable(o);
  Populate(table.get(), 10);
  const std::string path = TempPath("good.tbl"), bad = TempPath("bad.tbl");
  absl::StatusOr<int64_t> count = table->Export(path, {});
  ASSERT_TRUE(count.ok());
  const std::string bytes = ReadFile(path);
  const size_t record = 8 + 4 * 4 + 4;
  ASSERT_EQ(bytes.size(), 40 + *count * record);

  auto expect_error = [&](const std::string& content, const std::string& needle,
                          const SparseTableOptions& opts) {
    WriteFile(bad, content);
    auto fresh = MakeTable(opts);
    absl::StatusOr<int64_t> n = fresh->Import(bad);
    ASSERT_FALSE(n.ok()) << needle;
    EXPECT_NE(n.status().message().find(bad), std::string::npos) << n.status();
    EXPECT_NE(n.status().message().find(needle), std::string::npos) << n.status();
    EXPECT_EQ(fresh->Size(), 0) << "a bad file must not be half imported";
    // The same bytes in memory: the same refusal, naming what the caller calls them.
    auto in_memory = MakeTable(opts);
    n = in_memory->ImportBytes(content, "ckpt/" + needle);
    ASSERT_FALSE(n.ok()) << needle;
    EXPECT_NE(n.status().message().find("ckpt/" + needle), std::string::npos) << n.status();
    EXPECT_NE(n.status().message().find(needle), std::string::npos) << n.status();
    EXPECT_EQ(in_memory->Size(), 0);
  };
  expect_error(bytes.substr(0, bytes.size() - 10),
               absl::StrCat("offset ", 40 + (*count - 1) * record), o);
  std::string flipped = bytes;
  flipped[40 + 2 * record + 12] ^= 0x20;  // a value byte of record 2
  expect_error(flipped, absl::StrCat("record 2 (id "), o);
  expect_error(flipped, absl::StrCat("offset ", 40 + 2 * record), o);
  std::string last = bytes;
  last[bytes.size() - 1] ^= 1;  // the last record's checksum
  expect_error(last, absl::StrCat("offset ", 40 + (*count - 1) * record), o);
  expect_error("XXXXXXXX" + bytes.substr(8), "offset 0", o);
  expect_error(bytes.substr(0, 20), "truncated header", o);
  expect_error(bytes + "junk", absl::StrCat("offset ", bytes.size()), o);
  std::string header = bytes;
  header[24] ^= 1;  // count, caught by the header checksum
  expect_error(header, "offset 36", o);
  expect_error(bytes, "offset 16", Opts(5));  // dim mismatch

  auto fresh = MakeTable(o);
  absl::StatusOr<int64_t> n = fresh->Import(TempPath("missing.tbl"));
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("missing.tbl"), std::string::npos);
}

TEST(SparseTableTest, ImportAdmitsRowsAndOverwrites) {
  SparseTableOptions o = Opts(4);
  auto table = MakeTable(o);
  const std::vector<int64_t> ids = Populate(table.get(), 5);
  const std::string path = TempPath("admit.tbl");
  ASSERT_TRUE(table->Export(path, {}).ok());
  SparseTableOptions gated = o;
  gated.admission_threshold = 5;
  auto other = MakeTable(gated);
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(other->Lookup(ids, out.data()).ok());  // pending only
  EXPECT_EQ(other->Size(), 0);
  ASSERT_TRUE(other->Import(path).ok());
  EXPECT_EQ(other->Size(), static_cast<int64_t>(ids.size()));
  EXPECT_EQ(other->Stats().pending_ids, 0);
  for (int64_t id : ids) EXPECT_EQ(Row(*other, id), Row(*table, id));
}

TEST(SparseTableTest, MemoryBytesTracksRows) {
  SparseTableOptions o = Opts(16, "adagrad");
  o.num_shards = 1;
  auto table = MakeTable(o);
  const int64_t empty = table->MemoryBytes();
  std::vector<int64_t> ids(50000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 1000003;
  std::vector<float> out(ids.size() * 16);
  ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
  const int64_t per_row = (table->MemoryBytes() - empty) / 50000;
  EXPECT_GE(per_row, 144);  // the slot: 16 header + 16 values + 16 moments
  EXPECT_LE(per_row, 240);  // + map and partly filled chunks
}

// Every touched row (values and state) equals the rules of common/ops/optimizer_rules.h applied
// to the row's summed gradient (duplicate ids summed in their order of appearance), with Adam's
// lr_t from the beta powers of `step`, bit for bit: random batches, non-dyadic hyper-parameters.
class RulesMatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RulesMatchTest, RowsEqualTheRulesOnTheSummedGradients) {
  using ArrayMap = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, 1>>;
  using ConstArrayMap = Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>>;
  const std::string opt = GetParam();
  const int64_t dim = 13;
  const float lr = 0.05f;
  SparseTableOptions o = Opts(dim, opt);
  o.l2 = 0.01;
  o.adagrad_epsilon = 1e-3;
  o.adam_epsilon = 1e-3;
  o.num_shards = 4;
  auto table = MakeTable(o);
  const int64_t k = table->state_width() / dim;
  const float c = static_cast<float>(o.l2);
  std::map<int64_t, std::vector<float>> want;  // id -> values, then k * dim state
  std::mt19937_64 rng(17);
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<int64_t> ids(20);
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 12) - 6;
    const std::vector<float> grads = RandomFloats(ids.size() * dim, 300 + step);
    std::map<int64_t, std::vector<float>> sums;
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* g = grads.data() + i * dim;
      auto [it, fresh] = sums.try_emplace(ids[i], g, g + dim);
      if (!fresh) {
        for (int64_t j = 0; j < dim; ++j) it->second[j] += g[j];
      }
    }
    const float lr_t = static_cast<float>(
        optimizer_rules::AdamBiasCorrectedLr(lr, std::pow(o.adam_beta1, static_cast<double>(step)),
                                             std::pow(o.adam_beta2, static_cast<double>(step))));
    for (const auto& [id, sum] : sums) {
      std::vector<float>& row = want[id];
      if (row.empty()) {
        row = InitRow(o, id);
        row.resize((1 + k) * dim, 0.0f);
      }
      ArrayMap P(row.data(), dim), S1(row.data() + dim, dim), S2(row.data() + 2 * dim, dim);
      ConstArrayMap G(sum.data(), dim);
      if (opt == "sgd") {
        optimizer_rules::SgdUpdate(P, G, lr, c);
      } else if (opt == "adagrad") {
        optimizer_rules::AdagradUpdate(P, S1, G, lr, static_cast<float>(o.adagrad_epsilon), c);
      } else {
        optimizer_rules::AdamUpdate(P, S1, S2, G, lr_t, static_cast<float>(o.adam_beta1),
                                    static_cast<float>(o.adam_beta2),
                                    static_cast<float>(o.adam_epsilon), c);
      }
    }
    ASSERT_TRUE(table->ApplyGradients(ids, grads.data(), lr, step).ok());
    for (const auto& [id, row] : want) {
      std::vector<float> got = Row(*table, id);
      const std::vector<float> state = State(*table, id);
      got.insert(got.end(), state.begin(), state.end());
      ASSERT_EQ(got.size(), row.size());
      EXPECT_EQ(std::memcmp(got.data(), row.data(), sizeof(float) * row.size()), 0)
          << opt << " step " << step << " id " << id;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, RulesMatchTest, ::testing::Values("sgd", "adagrad", "adam"));

// Row chunks come from the table's growing arena regions (2 MiB, then 4, 8, 16 ... MiB with
// huge pages): 200k rows of 144 bytes span several regions. Every row keeps the initial values
// of its id and its own optimizer state however many chunks were carved after it, in any shard
// count (chunks of different shards never overlap).
TEST(SparseTableTest, RowsSpanningManyArenaRegionsKeepTheirValues) {
  constexpr int64_t kRows = 200000;
  std::vector<int64_t> ids(kRows);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = i * 7919 - 1000000;
  const std::vector<float> grads = RandomFloats(static_cast<size_t>(kRows) * 16, 99);
  for (int shards : {1, 64}) {
    SparseTableOptions o = Opts(16, "adagrad");
    o.num_shards = shards;
    auto table = MakeTable(o);
    ASSERT_NE(table, nullptr);
    std::vector<float> out(static_cast<size_t>(kRows) * 16);
    ASSERT_TRUE(table->Lookup(ids, out.data()).ok());
    ASSERT_TRUE(table->ApplyGradients(ids, grads.data(), 0.5f, 1).ok());
    EXPECT_EQ(table->Size(), kRows);
    for (int64_t i = 0; i < kRows; i += 997) {
      const std::vector<float> init = InitRow(o, ids[i]);
      const std::vector<float> row = Row(*table, ids[i]);
      const std::vector<float> state = State(*table, ids[i]);
      for (int j = 0; j < 16; ++j) {
        ASSERT_EQ(out[i * 16 + j], init[j]) << "id " << ids[i] << " shards " << shards;
        const float g = grads[i * 16 + j];
        // Adagrad from a zero moment: m = g^2, p -= lr * g / (sqrt(m) + eps). (Not compared
        // bit for bit: Eigen's result can differ in the last bit with the row's alignment.)
        EXPECT_NEAR(state[j], g * g, 1e-6) << "id " << ids[i];
        EXPECT_NEAR(row[j], init[j] - 0.5f * g / (std::sqrt(g * g) + 1e-6f), 1e-6)
            << "id " << ids[i] << " shards " << shards;
      }
    }
  }
}

// Where a row lands in memory (which shard, which slot) depends on the shard count and on
// arrival order; its values must not: resharding a checkpoint and "row init independent of the
// number of pservers" rely on every row being updated by bit-identical arithmetic.
// Member tables: one table holding a slot's tables side by side behaves, member by member,
// exactly as the tables held apart: initial values, updates (with duplicates and every
// optimizer), exports with state, deltas under one cut, and imports of one member's file.
class MemberTableTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MemberTableTest, EachMemberIsTheTableHeldAlone) {
  SparseTableOptions a = Opts(3, GetParam());
  SparseTableOptions b = Opts(2, GetParam());
  b.initializer.kind = SparseTableInitializer::kGaussian;
  b.initializer.mean = 0.5;
  b.initializer.std = 0.1;
  b.initializer.seed = 99;
  SparseTableOptions f = Opts(5, GetParam());
  f.members = {{"a", 3, a.initializer}, {"b", 2, b.initializer}};
  for (SparseTableOptions* o : {&a, &b, &f}) o->num_shards = 4;
  auto ta = MakeTable(a), tb = MakeTable(b), tf = MakeTable(f);
  ASSERT_TRUE(ta && tb && tf);
  ASSERT_EQ(tf->num_members(), 2);
  EXPECT_EQ(tf->MemberOptions(1).dim, 2);
  EXPECT_EQ(tf->MemberOptions(1).initializer.seed, 99u);

  // The rows of `ids` of the fused table equal the member tables' rows side by side.
  auto expect_side_by_side = [&](const std::vector<int64_t>& ids) {
    std::vector<float> ra(ids.size() * 3), rb(ids.size() * 2), rf(ids.size() * 5);
    ASSERT_TRUE(ta->Lookup(ids, ra.data()).ok());
    ASSERT_TRUE(tb->Lookup(ids, rb.data()).ok());
    ASSERT_TRUE(tf->Lookup(ids, rf.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 3; ++j) ASSERT_EQ(rf[i * 5 + j], ra[i * 3 + j]) << ids[i] << " " << j;
      for (int j = 0; j < 2; ++j) ASSERT_EQ(rf[i * 5 + 3 + j], rb[i * 2 + j]) << ids[i] << " " << j;
    }
  };
  const std::vector<int64_t> ids = {7, -3, kE18, 7, 42, 0, -3, 7};
  expect_side_by_side(ids);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> ga(ids.size() * 3), gb(ids.size() * 2), gf(ids.size() * 5);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 5; ++j) {
        const float g = u(rng);
        gf[i * 5 + j] = g;
        (j < 3 ? ga[i * 3 + j] : gb[i * 2 + j - 3]) = g;
      }
    }
    ASSERT_TRUE(ta->ApplyGradients(ids, ga.data(), 0.1f, step, 0.5f).ok());
    ASSERT_TRUE(tb->ApplyGradients(ids, gb.data(), 0.1f, step, 0.5f).ok());
    ASSERT_TRUE(tf->ApplyGradients(ids, gf.data(), 0.1f, step, 0.5f).ok());
  }
  expect_side_by_side({7, -3, kE18, 42, 0, 12345});

  // Exports with optimizer state: each member's file is its table's, byte for byte.
  SparseTableExportOptions ckpt;
  ckpt.with_optimizer_state = true;
  ckpt.keep_delta_cut = true;
  std::vector<std::string> files = tf->ExportMembersBytes(ckpt);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], ta->ExportBytes(ckpt));
  EXPECT_EQ(files[1], tb->ExportBytes(ckpt));

  // Imported member by member into a fresh fused table: the same table again.
  auto tf2 = MakeTable(f);
  ASSERT_TRUE(tf2->ImportBytes(files[1], "b.tbl", nullptr, 1).ok());
  ASSERT_TRUE(tf2->ImportBytes(files[0], "a.tbl", nullptr, 0).ok());
  EXPECT_EQ(tf2->ExportMembersBytes(ckpt), files);
  // One member alone: the other's columns of a new row are its initial values.
  auto tf3 = MakeTable(f);
  ASSERT_TRUE(tf3->ImportBytes(files[1], "b.tbl", nullptr, 1).ok());
  auto fresh_a = MakeTable(a);
  std::vector<float> row(5), init(3);
  ASSERT_TRUE(tf3->PeekRow(42, row.data()));
  ASSERT_TRUE(fresh_a->Lookup({42}, init.data()).ok());
  EXPECT_EQ(std::vector<float>(row.begin(), row.begin() + 3), init);
  // A file of the wrong member, or a member that does not exist, is refused.
  absl::StatusOr<int64_t> wrong = tf3->ImportBytes(files[0], "a.tbl", nullptr, 1);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss) << wrong.status();
  EXPECT_NE(wrong.status().message().find("dim 3 does not match the table's dim 2"),
            std::string::npos)
      << wrong.status();
  EXPECT_EQ(tf3->ImportBytes(files[0], "a.tbl", nullptr, 2).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Serving exports: a full export of every member moves the delta cut once, so the next
  // only_changed export of each member lists the rows changed since, as its table's does.
  SparseTableExportOptions full;
  std::vector<std::string> base = tf->ExportMembersBytes(full);
  EXPECT_EQ(base[0], ta->ExportBytes(full));
  EXPECT_EQ(base[1], tb->ExportBytes(full));
  const std::vector<int64_t> changed = {42, 5};
  std::vector<float> ga(6, 0.25f), gb(4, -0.5f), gf(10);
  for (int i = 0; i < 2; ++i) {
    std::copy(ga.begin() + i * 3, ga.begin() + i * 3 + 3, gf.begin() + i * 5);
    std::copy(gb.begin() + i * 2, gb.begin() + i * 2 + 2, gf.begin() + i * 5 + 3);
  }
  ASSERT_TRUE(ta->ApplyGradients(changed, ga.data(), 0.1f, 4).ok());
  ASSERT_TRUE(tb->ApplyGradients(changed, gb.data(), 0.1f, 4).ok());
  ASSERT_TRUE(tf->ApplyGradients(changed, gf.data(), 0.1f, 4).ok());
  SparseTableExportOptions delta;
  delta.only_changed = true;
  std::vector<std::string> deltas = tf->ExportMembersBytes(delta);
  EXPECT_EQ(deltas[0], ta->ExportBytes(delta));
  EXPECT_EQ(deltas[1], tb->ExportBytes(delta));
  EXPECT_EQ(deltas[0].size(), sparse_table_format::kHeaderBytes + 2 * (8 + 4 * 3 + 4) +
                                  sparse_table_format::kTrailerFixedBytes);
}

TEST_P(MemberTableTest, ExportMembersWritesOneFilePerMember) {
  SparseTableOptions f = Opts(3, GetParam());
  f.members = {{"a", 1, f.initializer}, {"b", 2, f.initializer}};
  SparseTableOptions b = Opts(2, GetParam());
  auto tf = MakeTable(f);
  auto tb = MakeTable(b);
  ASSERT_TRUE(tf && tb);
  ASSERT_TRUE(tf->Lookup({1, 2, 3}, std::vector<float>(9).data()).ok());
  ASSERT_TRUE(tb->Lookup({1, 2, 3}, std::vector<float>(6).data()).ok());
  const std::string dir = ::testing::TempDir();
  const std::vector<std::string> paths = {dir + "/member_a.tbl", dir + "/member_b.tbl"};
  absl::StatusOr<int64_t> n = tf->ExportMembers(paths, SparseTableExportOptions());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 6);  // 3 rows in each of the 2 files
  auto back = MakeTable(b);
  ASSERT_TRUE(back->Import(paths[1]).ok());
  EXPECT_EQ(back->ExportBytes(SparseTableExportOptions()),
            tb->ExportBytes(SparseTableExportOptions()));
  EXPECT_EQ(tf->ExportMembers({paths[0]}, SparseTableExportOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SparseTableTest, MemberDimsMustSumToTheTableDim) {
  SparseTableOptions f = Opts(4);
  f.members = {{"a", 1, f.initializer}, {"b", 2, f.initializer}};
  absl::StatusOr<std::unique_ptr<SparseTable>> t = SparseTable::Create(f);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("members' dims sum to 3, not to dim 4"), std::string::npos)
      << t.status();
  f.members[1].dim = 3;
  f.members[0].initializer.max = -2;  // below min
  t = SparseTable::Create(f);
  EXPECT_NE(t.status().message().find("members[0] (a) initializer min"), std::string::npos)
      << t.status();
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MemberTableTest, ::testing::Values("sgd", "adagrad", "adam"));

class PlacementIndependenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PlacementIndependenceTest, UpdatesAreBitIdenticalForAnyShardCount) {
  const int64_t dim = 16;
  std::vector<std::unique_ptr<SparseTable>> tables;
  for (int shards : {1, 4, 64}) {
    SparseTableOptions o = Opts(dim, GetParam());
    o.num_shards = shards;
    o.l2 = 1e-3;
    tables.push_back(MakeTable(o));
  }
  {
    // The last table first sees every id once in another order: its rows get other slots (and
    // other alignments) than the same rows in the other tables.
    std::vector<int64_t> warm(3000);
    for (int64_t i = 0; i < 3000; ++i) warm[i] = 1499 - ((i * 7919) % 3000);
    std::vector<float> rows(warm.size() * dim);
    ASSERT_TRUE(tables.back()->Lookup(warm, rows.data()).ok());
  }
  std::mt19937_64 rng(5);
  std::vector<int64_t> all_ids;
  for (int step = 1; step <= 6; ++step) {
    std::vector<int64_t> ids(700);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 3000) - 1500;
    std::vector<float> grads(ids.size() * dim);
    for (auto& g : grads) g = std::ldexp(static_cast<float>(rng() % 20001) - 10000.0f, -13);
    for (size_t t = 0; t < tables.size(); ++t) {
      std::vector<float> rows(ids.size() * dim);
      ASSERT_TRUE(tables[t]->Lookup(ids, rows.data()).ok());
      ASSERT_TRUE(tables[t]->ApplyGradients(ids, grads.data(), 0.05f, step).ok());
    }
    all_ids.insert(all_ids.end(), ids.begin(), ids.end());
  }
  int64_t differing = 0;
  for (int64_t id : all_ids) {
    std::vector<float> want(dim), got(dim);
    ASSERT_TRUE(tables[0]->PeekRow(id, want.data()));
    for (size_t t = 1; t < tables.size(); ++t) {
      ASSERT_TRUE(tables[t]->PeekRow(id, got.data()));
      differing += std::memcmp(want.data(), got.data(), sizeof(float) * dim) != 0;
    }
  }
  EXPECT_EQ(differing, 0);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PlacementIndependenceTest,
                         ::testing::Values("sgd", "adagrad", "adam"));

}  // namespace
}  // namespace tessera
