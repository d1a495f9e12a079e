#include "ferry/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(Config, ScalarsKeepTheirTextAndMapsTheirOrder) {
  Config c = Config::map({{"b", 2}, {"a", 1.5}, {"flag", true}, {"name", "x"}});
  EXPECT_EQ(c.find("b")->scalar(), "2");
  EXPECT_EQ(c.find("a")->scalar(), "1.5");
  EXPECT_EQ(c.find("flag")->scalar(), "true");
  EXPECT_EQ(c.entries()[0].first, "b");
  EXPECT_EQ(c.find("missing"), nullptr);
  c.set("b", 3);
  EXPECT_EQ(c.entries()[0].second.scalar(), "3");
  EXPECT_EQ(c.size(), 4u);
}

TEST(Config, TextRoundTripsEveryKindAndAwkwardCharacters) {
  Config c = Config::map({{"s", "quote \" backslash \\ newline \n tab \t bell \a"},
                          {"list", Config::list({1, "two", Config(), Config::map()})},
                          {"empty", Config::list()},
                          {"null", Config()}});
  const std::string text = c.to_text();
  EXPECT_EQ(Config::parse_text(text), c);
  EXPECT_EQ(Config::parse_text(text).to_text(), text);
  EXPECT_EQ(Config::parse_text(text).hash(), c.hash());
}

TEST(Config, TheHashIdentifiesTheContent) {
  const Config a = Config::map({{"size", 10}});
  EXPECT_EQ(a.hash(), Config::map({{"size", "10"}}).hash());
  EXPECT_NE(a.hash(), Config::map({{"size", 11}}).hash());
  EXPECT_NE(a.hash(), Config::map({{"sizE", 10}}).hash());
  EXPECT_EQ(hash_string(0x1234), "0x0000000000001234");
}

TEST(Config, MalformedTextIsAConfigErrorWithTheOffset) {
  EXPECT_THAT([] { Config::parse_text("{\"a\":\"1\""); },
              ThrowsMessage<ConfigError>(HasSubstr("offset 8")));
  EXPECT_THAT([] { Config::parse_text("[\"a\"] x"); },
              ThrowsMessage<ConfigError>(HasSubstr("unexpected text")));
}

TEST(Config, WrongKindAccessIsAConfigError) {
  EXPECT_THAT([] { (void)Config::list().scalar(); },
              ThrowsMessage<ConfigError>(HasSubstr("expected a scalar, found a list")));
  EXPECT_THAT([] { Config("x").push_back(1); }, ThrowsMessage<ConfigError>(HasSubstr("append")));
}

TEST(Config, MarksNameFileLineAndColumn) {
  Config c("v");
  EXPECT_EQ(c.mark().str(), "");
  c.set_mark({"train.yaml", 3, 7});
  EXPECT_EQ(c.mark().str(), "train.yaml:3:7");
}

}  // namespace
}  // namespace ferry
