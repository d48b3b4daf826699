#include "common/ops/dist_ops.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/ops/ops.h"
#include "common/ops/selected_rows_util.h"
#include "common/ops/sharding.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(DistOpsTest, SplitSelectedRowsRebasesRowsPerSection) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;
  SelectedRows* x = scope.Var("g")->GetMutable<SelectedRows>();
  x->height = 10;
  x->rows = {9, 0, 4, 4, 5};
  x->value.Resize(FLOAT32, {5, 2});
  for (int i = 0; i < 10; ++i) x->value.data<float>()[i] = i;
  OpDesc op = MakeOp("split_selected_rows", {{"X", {"g"}}}, {{"Out", {"a", "b"}}});
  SetAttr(&op, "height_sections", std::vector<int64_t>{5, 5});
  absl::Status s = exec.RunOp(op, &scope);
  ASSERT_TRUE(s.ok()) << s;
  const SelectedRows& a = scope.FindVar("a")->Get<SelectedRows>();
  const SelectedRows& b = scope.FindVar("b")->Get<SelectedRows>();
  EXPECT_EQ(a.rows, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(b.rows, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(a.height, 5);
  EXPECT_EQ(a.value.data<float>()[0], 2.0f);  // row 0 came from input position 1
  EXPECT_EQ(a.value.data<float>()[2], 4.0f);  // first row 4 from input position 2
  EXPECT_EQ(b.value.data<float>()[0], 0.0f);  // row 9 -> 4, input position 0
  EXPECT_EQ(b.value.data<float>()[3], 9.0f);  // row 5 -> 0, input position 4

  SetAttr(&op, "height_sections", std::vector<int64_t>{5, 4});
  s = exec.RunOp(op, &scope);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("height 10"), std::string::npos) << s;
}

// split_by_shard merges repeated ids without sorting: each shard's rows come in order of first
// appearance, and each id's rows are summed in their order of appearance, bit for bit the sums
// MergeRows makes (sync training compares against a single machine bit for bit).
TEST(DistOpsTest, SplitByShardMergesDuplicatesInOrderOfFirstAppearance) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  for (int shards : {1, 3}) {
    Scope scope;
    SelectedRows* x = scope.Var("g")->GetMutable<SelectedRows>();
    x->height = 1000;
    // Many repeats (3 of id 7, 2 of id -5 and 2 of 40000000000) and values whose sum depends on
    // the order of addition.
    x->rows = {7, 40000000000, 7, -5, 3, 7, -5, 999, 40000000000};
    const int n = static_cast<int>(x->rows.size());
    x->value.Resize(FLOAT32, {n, 2});
    const float v[] = {1e8f, 1.0f, 1.0f, 0.1f, 2.5f, -1e8f, 0.3f, 7.0f, 0.7f};
    for (int i = 0; i < n; ++i) {
      x->value.data<float>()[2 * i] = v[i];
      x->value.data<float>()[2 * i + 1] = static_cast<float>(i);
    }
    SelectedRows want = MergeRows(*x);  // sorted by id
    std::vector<std::string> outs;
    for (int k = 0; k < shards; ++k) outs.push_back("out" + std::to_string(k));
    OpDesc op = MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", outs}});
    absl::Status s = exec.RunOp(op, &scope);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<int64_t> first_appearance = {7, 40000000000, -5, 3, 999};
    size_t total = 0;
    for (int k = 0; k < shards; ++k) {
      const SelectedRows& out = scope.FindVar(outs[k])->Get<SelectedRows>();
      EXPECT_EQ(out.height, 1000);
      std::vector<int64_t> expect_rows;
      for (int64_t id : first_appearance) {
        if (ShardOf(id, shards, ShardMethod::kHash) == k) expect_rows.push_back(id);
      }
      EXPECT_EQ(out.rows, expect_rows) << "shard " << k << " of " << shards;
      ASSERT_EQ(out.value.dim(0), static_cast<int64_t>(out.rows.size()));
      for (size_t r = 0; r < out.rows.size(); ++r) {
        const size_t w = static_cast<size_t>(
            std::find(want.rows.begin(), want.rows.end(), out.rows[r]) - want.rows.begin());
        ASSERT_LT(w, want.rows.size());
        for (int j = 0; j < 2; ++j) {
          EXPECT_EQ(out.value.data<float>()[2 * r + j], want.value.data<float>()[2 * w + j])
              << "id " << out.rows[r] << " column " << j;
        }
      }
      total += out.rows.size();
    }
    EXPECT_EQ(total, first_appearance.size());
  }
  // id 7: (1e8 + 1) + -1e8 in float32 is 0 (1e8 + 1 rounds to 1e8), not 1.
  Scope scope;
  SelectedRows* x = scope.Var("g")->GetMutable<SelectedRows>();
  x->height = 10;
  x->rows = {7, 7, 7};
  x->value.Resize(FLOAT32, {3, 1});
  x->value.data<float>()[0] = 1e8f;
  x->value.data<float>()[1] = 1.0f;
  x->value.data<float>()[2] = -1e8f;
  OpDesc op = MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", {"out"}}});
  ASSERT_TRUE(exec.RunOp(op, &scope).ok());
  const SelectedRows& out = scope.FindVar("out")->Get<SelectedRows>();
  ASSERT_EQ(out.rows, (std::vector<int64_t>{7}));
  EXPECT_EQ(out.value.data<float>()[0], 0.0f);
}

// Consecutive splits of gradients over the same ids (a slot's deep and wide tables) reuse the
// first one's merge plan: each still sums its own values; a different id list (same length, one
// id changed) gets its own plan.
TEST(DistOpsTest, SplitByShardReusesThePlanOfTheSameIdsOnly) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  for (int shards : {1, 2}) {
    Scope scope;
    auto fill = [&](const std::string& name, std::vector<int64_t> rows, int width, float scale) {
      SelectedRows* x = scope.Var(name)->GetMutable<SelectedRows>();
      x->height = 100;
      x->rows = std::move(rows);
      x->value.Resize(FLOAT32, {static_cast<int64_t>(x->rows.size()), width});
      for (int64_t i = 0; i < x->value.numel(); ++i) x->value.data<float>()[i] = scale * (i + 1);
    };
    fill("deep", {5, 9, 5, 2, 9, 5}, 3, 1.0f);
    fill("wide", {5, 9, 5, 2, 9, 5}, 1, 10.0f);
    fill("other", {5, 9, 5, 2, 9, 4}, 1, 10.0f);
    for (const std::string g : {"deep", "wide", "other"}) {
      std::vector<std::string> outs;
      for (int k = 0; k < shards; ++k) outs.push_back(g + ".shard" + std::to_string(k));
      OpDesc op = MakeOp("split_by_shard", {{"X", {g}}}, {{"Out", outs}});
      absl::Status s = exec.RunOp(op, &scope);
      ASSERT_TRUE(s.ok()) << s;
      const SelectedRows want = MergeRows(scope.FindVar(g)->Get<SelectedRows>());
      size_t total = 0;
      for (const std::string& o : outs) {
        const SelectedRows& out = scope.FindVar(o)->Get<SelectedRows>();
        const int64_t width = want.value.dim(1);
        for (size_t r = 0; r < out.rows.size(); ++r) {
          const size_t w = static_cast<size_t>(
              std::find(want.rows.begin(), want.rows.end(), out.rows[r]) - want.rows.begin());
          ASSERT_LT(w, want.rows.size()) << g << " id " << out.rows[r];
          for (int64_t j = 0; j < width; ++j) {
            EXPECT_EQ(out.value.data<float>()[r * width + j],
                      want.value.data<float>()[w * width + j])
                << g << " id " << out.rows[r] << " column " << j;
          }
        }
        total += out.rows.size();
      }
      EXPECT_EQ(total, want.rows.size()) << g;
    }
  }
}

// An output may be X itself (merged in place): the outputs hold what a split into other
// variables gives (rows, values and shape; X of rank 3), with one output and with several.
TEST(DistOpsTest, SplitByShardIntoItsOwnInput) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  for (int shards : {1, 2, 3}) {
    Scope scope;
    for (const std::string g : {"g", "ref"}) {
      SelectedRows* x = scope.Var(g)->GetMutable<SelectedRows>();
      x->height = 100;
      x->rows = {4, 8, 4, 15, 16, 8, 4, 23, 42};
      x->value.Resize(FLOAT32, {9, 1, 2});
      for (int64_t i = 0; i < 18; ++i) x->value.data<float>()[i] = 0.5f * static_cast<float>(i);
    }
    std::vector<std::string> outs = {"g"}, ref_outs;
    for (int k = 1; k < shards; ++k) outs.push_back("g.shard" + std::to_string(k));
    for (int k = 0; k < shards; ++k) ref_outs.push_back("ref.shard" + std::to_string(k));
    ASSERT_TRUE(exec.RunOp(MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", outs}}), &scope).ok());
    ASSERT_TRUE(
        exec.RunOp(MakeOp("split_by_shard", {{"X", {"ref"}}}, {{"Out", ref_outs}}), &scope).ok());
    for (int k = 0; k < shards; ++k) {
      const SelectedRows& got = scope.FindVar(outs[k])->Get<SelectedRows>();
      const SelectedRows& want = scope.FindVar(ref_outs[k])->Get<SelectedRows>();
      EXPECT_EQ(got.rows, want.rows) << "shard " << k << " of " << shards;
      ASSERT_EQ(got.value.shape(), want.value.shape()) << "shard " << k << " of " << shards;
      for (int64_t i = 0; i < got.value.numel(); ++i) {
        EXPECT_EQ(got.value.data<float>()[i], want.value.data<float>()[i])
            << "shard " << k << " of " << shards << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
