#include "common/rpc/request_checks.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(ResolveByteRangeTest, AcceptsRangesInside) {
  auto whole = ResolveByteRange("w", 0, 0, 64);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->offset, 0);
  EXPECT_EQ(whole->length, 64);
  auto tail = ResolveByteRange("w", 48, 0, 64);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->length, 16);
  auto chunk = ResolveByteRange("w", 16, 48, 64);
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->offset, 16);
  EXPECT_EQ(chunk->length, 48);
  // The empty tail of a variable and an empty variable are empty ranges, not errors.
  EXPECT_EQ(ResolveByteRange("w", 64, 0, 64)->length, 0);
  EXPECT_EQ(ResolveByteRange("w", 0, 0, 0)->length, 0);
}

TEST(ResolveByteRangeTest, RefusesOverflowingAndOutsideRanges) {
  struct Case {
    int64_t offset, length, total;
  };
  // The first is the crafted request that crashed a TLS pserver: offset + length wrapped.
  for (Case c : {Case{kMax, 16, 64}, Case{kMax, 0, 64}, Case{kMax, kMax, 64}, Case{16, kMax, 64},
                 Case{1, kMax, kMax}, Case{kMax - 8, 16, kMax}, Case{-1, 16, 64},
                 Case{kMin, 16, 64}, Case{0, -1, 64}, Case{0, kMin, 64}, Case{65, 0, 64},
                 Case{60, 8, 64}, Case{0, 65, 64}, Case{0, 1, 0}}) {
    auto r = ResolveByteRange("hidden.w", c.offset, c.length, c.total);
    ASSERT_FALSE(r.ok()) << c.offset << " +" << c.length << " of " << c.total;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("hidden.w"), absl::string_view::npos);
    EXPECT_NE(r.status().message().find(std::to_string(c.offset)), absl::string_view::npos);
  }
}

TEST(ResolveByteRangeTest, EveryAcceptedRangeLiesInside) {
  const int64_t values[] = {kMin, -1, 0, 1, 7, 8, 63, 64, 65, kMax - 1, kMax};
  for (int64_t total : {int64_t{0}, int64_t{1}, int64_t{64}, kMax}) {
    for (int64_t offset : values) {
      for (int64_t length : values) {
        auto r = ResolveByteRange("v", offset, length, total);
        if (!r.ok()) continue;
        EXPECT_GE(r->offset, 0);
        EXPECT_GE(r->length, 0);
        EXPECT_LE(r->offset, total);
        EXPECT_LE(r->length, total - r->offset);
      }
    }
  }
}

TEST(RequestChecksTest, RequestMetaAndNames) {
  EXPECT_TRUE(CheckRequestMeta(RequestMeta{"job", 0, 0}).ok());
  EXPECT_FALSE(CheckRequestMeta(RequestMeta{"jo\nb", 0, 0}).ok());
  auto negative = CheckRequestMeta(RequestMeta{"job", -3, 0});
  EXPECT_NE(negative.message().find("trainer_id -3"), absl::string_view::npos);
  EXPECT_NE(CheckRequestMeta(RequestMeta{"job", 0, kMin}).message().find("step"),
            absl::string_view::npos);
  EXPECT_TRUE(CheckRequestName("table name", "emb").ok());
  EXPECT_FALSE(CheckRequestName("table name", "").ok());
  EXPECT_FALSE(CheckRequestName("table name", "e\x01").ok());
  EXPECT_TRUE(CheckPrefetchIds("emb", 16).ok());
  EXPECT_NE(CheckPrefetchIds("emb", 12).message().find("12 bytes"), absl::string_view::npos);
  // A name with a control character is echoed escaped: every refusal stays one line.
  EXPECT_EQ(CheckPrefetchIds("e\nmb", 12).message().find('\n'), absl::string_view::npos);
  // ids_of_table: 0, or an earlier table's 1-based index with no ids of its own.
  EXPECT_TRUE(CheckIdsOfTable("wide", 1, 0, 16).ok());
  EXPECT_TRUE(CheckIdsOfTable("wide", 1, 1, 0).ok());
  EXPECT_TRUE(CheckIdsOfTable("wide", 3, 2, 0).ok());
  for (int32_t bad : {-1, 2, 5}) {
    absl::Status s = CheckIdsOfTable("wide", 1, bad, 0);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(absl::StrCat("ids_of_table ", bad)), absl::string_view::npos) << s;
  }
  EXPECT_FALSE(CheckIdsOfTable("wide", 1, 1, 8).ok());  // ids of its own as well
  EXPECT_EQ(ResolveByteRange("w\n", 9, 0, 8).status().message().find('\n'),
            absl::string_view::npos);
}

TEST(RequestChecksTest, AbortReason) {
  EXPECT_TRUE(CheckAbortReason("").ok());
  EXPECT_TRUE(CheckAbortReason("pserver 10.0.0.2:6170 SendBatch: Deadline Exceeded").ok());
  EXPECT_TRUE(CheckAbortReason(std::string(kMaxAbortReasonBytes, 'a')).ok());
  absl::Status long_reason = CheckAbortReason(std::string(kMaxAbortReasonBytes + 1, 'a'));
  EXPECT_EQ(long_reason.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_reason.message().find("1025 bytes"), absl::string_view::npos) << long_reason;
  absl::Status forged = CheckAbortReason("ok\npserver 0: all fine");
  EXPECT_EQ(forged.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forged.message().find('\n'), absl::string_view::npos);
}

TEST(RequestChecksTest, JobHandshakeFields) {
  EXPECT_TRUE(CheckJobFields({{"trainers", "2"}, {"pservers", "a:1,b:2"}, {"model", ""}}).ok());
  EXPECT_NE(CheckJobFields({{"", "2"}}).message().find("is empty"), absl::string_view::npos);
  const absl::Status control = CheckJobFields({{"seed", "1\n2"}});
  EXPECT_FALSE(control.ok());
  EXPECT_EQ(control.message().find('\n'), absl::string_view::npos);
  EXPECT_NE(CheckJobFields({{"x", std::string(2000, 'a')}}).message().find("over 1024 bytes"),
            absl::string_view::npos);
  JobFields many(65, {"f", "v"});
  EXPECT_NE(CheckJobFields(many).message().find("65 fields"), absl::string_view::npos);
}

}  // namespace
}  // namespace tessera
