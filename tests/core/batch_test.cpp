#include "ferry/batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

Batch make() {
  Batch b(2);
  b.set("image", torch::arange(6).view({2, 3}));
  b.set("path", std::vector<std::string>{"a", "b"});
  return b;
}

TEST(Batch, TensorAndStringFields) {
  const Batch b = make();
  EXPECT_EQ(b.size(), 2u);
  EXPECT_TRUE(b["image"].equal(torch::arange(6).view({2, 3})));
  EXPECT_EQ(b.strings("path"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(b.contains("path"));
  EXPECT_FALSE(b.contains("label"));
  EXPECT_TRUE(b.is_tensor("image"));
  EXPECT_FALSE(b.is_tensor("path"));
}

TEST(Batch, IteratesOverFieldNamesInOrder) {
  std::vector<std::string> names;
  for (const std::string& name : make()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"image", "path"}));
}

TEST(Batch, ErrorsPointAtTheRightAccessor) {
  const Batch b = make();
  EXPECT_THAT([&] { (void)b["path"]; },
              ThrowsMessage<Error>(HasSubstr("read it with batch.strings(\"path\")")));
  EXPECT_THAT([&] { (void)b.strings("image"); },
              ThrowsMessage<Error>(HasSubstr("read it with batch[\"image\"]")));
  EXPECT_THAT([&] { (void)b["label"]; },
              ThrowsMessage<Error>(HasSubstr("no field 'label'; its fields are: image, path")));
}

TEST(Batch, ToCpuKeepsValuesAndStrings) {
  const Batch moved = make().to(torch::kCPU);
  EXPECT_TRUE(moved["image"].equal(make()["image"]));
  EXPECT_EQ(moved.strings("path").size(), 2u);
}

}  // namespace
}  // namespace ferry
