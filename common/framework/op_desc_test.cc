#include "common/framework/op_desc.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// SameName agrees with == for every length class it compares differently (0, 1-3, 4-7, 8-16,
// longer) and for a difference at every position.
TEST(OpDescTest, SameNameIsEquality) {
  const std::string base = "Out@GRAD.block0.and.more";  // 24 characters
  for (size_t n = 0; n <= base.size(); ++n) {
    const std::string a = base.substr(0, n);
    EXPECT_TRUE(SameName(a, std::string(a))) << a;
    for (size_t i = 0; i < n; ++i) {
      std::string b = a;
      b[i] = b[i] == 'x' ? 'y' : 'x';
      EXPECT_FALSE(SameName(a, b)) << a << " vs " << b;
    }
    if (n > 0) EXPECT_FALSE(SameName(a, base.substr(0, n - 1))) << a;
  }
  EXPECT_TRUE(SameName("X", "X"));
  EXPECT_FALSE(SameName("X", "Y"));
  EXPECT_FALSE(SameName("Out", "Out@GRAD"));
}

// Attributes are found by name among others of the same length.
TEST(OpDescTest, FindAttrByName) {
  OpDesc op;
  SetAttr(&op, "x_num_col_dims", 2);
  SetAttr(&op, "y_num_col_dims", 3);
  EXPECT_EQ(GetIntAttr(op, "x_num_col_dims", 1), 2);
  EXPECT_EQ(GetIntAttr(op, "y_num_col_dims", 1), 3);
  EXPECT_EQ(GetIntAttr(op, "z_num_col_dims", 1), 1);
}

}  // namespace
}  // namespace tessera
