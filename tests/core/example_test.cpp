#include "ferry/example.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Example, HoldsTheFourFieldKindsInInsertionOrder) {
  Example ex{{"image", torch::ones({2, 3})}, {"label", 7}, {"weight", 0.5f}, {"path", "a.jpg"}};
  ASSERT_EQ(ex.size(), 4u);
  EXPECT_TRUE(ex["image"].is_tensor());
  EXPECT_EQ(ex["label"].to_int(), 7);
  EXPECT_TRUE(ex["weight"].is_double());
  EXPECT_DOUBLE_EQ(ex["weight"].to_double(), 0.5);
  EXPECT_EQ(ex["path"].str(), "a.jpg");
  std::vector<std::string> names;
  for (const auto& [name, field] : ex) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"image", "label", "weight", "path"}));
}

TEST(Example, IntegersOfAnyWidthBecomeInt64) {
  Example ex{{"a", std::uint8_t{200}}, {"b", -3L}, {"c", true}};
  EXPECT_EQ(ex["a"].to_int(), 200);
  EXPECT_EQ(ex["b"].to_int(), -3);
  EXPECT_EQ(ex["c"].to_int(), 1);
  EXPECT_DOUBLE_EQ(ex["a"].to_double(), 200.0);  // ints read as numbers too
}

TEST(Example, SetReplacesAFieldOfTheSameName) {
  Example ex;
  ex.set("x", 1).set("y", 2).set("x", "three");
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex["x"].str(), "three");
  EXPECT_EQ(ex.begin()->first, "x");
}

TEST(Example, MissingFieldNamesTheFieldsPresent) {
  Example ex{{"image", torch::zeros({1})}, {"label", 1}};
  ex.set_index(12);
  EXPECT_THAT([&] { (void)ex["lable"]; },
              ThrowsMessage<Error>(HasSubstr("sample 12 has no field 'lable'; its fields are: "
                                             "image, label")));
}

TEST(Example, WrongKindAccessNamesTheKindHeld) {
  Example ex{{"label", 1}};
  EXPECT_THAT([&] { (void)ex["label"].tensor(); },
              ThrowsMessage<Error>(HasSubstr("holds a int, not a tensor")));
  EXPECT_THAT([&] { (void)ex["label"].str(); }, ThrowsMessage<Error>(HasSubstr("not a string")));
}

}  // namespace
}  // namespace ferry
