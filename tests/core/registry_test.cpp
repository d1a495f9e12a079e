#include "ferry/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"
#include "ferry/init.h"
#include "ferry/synthetic_dataset.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

class Constant : public Dataset {
 public:
  Constant(std::size_t n, double value) : n_(n), value_(value) {}
  std::size_t size() const override { return n_; }
  Example get(std::size_t i, SampleContext&) const override {
    return {{"x", torch::full({2}, value_)}, {"i", i}};
  }

 private:
  std::size_t n_;
  double value_;
};

class Negate : public Transform {
 public:
  Example operator()(Example e, SampleContext&) const override {
    e.set("x", -e["x"].tensor());
    return e;
  }
};

Registry make_registry() {
  Registry r;
  register_core_types(r);
  r.add_dataset({.name = "constant",
                 .summary = "a constant",
                 .keys = {{.name = "size", .type = ValueType::kInt, .required = true, .min = 0},
                          {.name = "value",
                           .type = ValueType::kFloat,
                           .default_value = 1.0,
                           .min = -10,
                           .max = 10},
                          {.name = "mode", .default_value = "fast", .choices = {"fast", "slow"}},
                          {.name = "tags", .type = ValueType::kStringList}}},
                [](const Args& a) {
                  if (a.get<std::size_t>("size") == 13) a.fail("size", "13 is unlucky");
                  return std::make_shared<Constant>(a.get<std::size_t>("size"),
                                                    a.get<double>("value"));
                });
  r.add_transform({.name = "negate"}, [](const Args&) { return std::make_shared<Negate>(); });
  return r;
}

TEST(Registry, ResolveFillsDefaultsInTheTypesKeyOrder) {
  const Registry r = make_registry();
  const Config resolved =
      r.resolve(ComponentKind::kDataset, Config::map({{"size", 3}, {"type", "constant"}}), "d");
  EXPECT_EQ(resolved.to_text(), R"({"type":"constant","size":"3","value":"1","mode":"fast"})");
  // A type name alone is a node too.
  EXPECT_EQ(r.resolve(ComponentKind::kSampler, Config("sequential"), "s").to_text(),
            R"({"type":"sequential"})");
}

TEST(Registry, OneValueStandsForAListOfOne) {
  const Registry r = make_registry();
  // As torchvision's size=224 for size=[224].
  const Config c = r.resolve(ComponentKind::kDataset,
                             Config::map({{"type", "constant"}, {"size", 1}, {"tags", "a"}}), "d");
  const Config* tags = c.find("tags");
  ASSERT_NE(tags, nullptr);
  ASSERT_TRUE(tags->is_list());
  ASSERT_EQ(tags->items().size(), 1u);
  EXPECT_EQ(tags->items()[0].scalar(), "a");
}

TEST(Registry, EveryBadNodeIsAConfigErrorNamingPathKeyAndFix) {
  const Registry r = make_registry();
  auto resolve = [&](Config node) { (void)r.resolve(ComponentKind::kDataset, node, "dataset"); };
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constnat"}, {"size", 1}}));
      },
      ThrowsMessage<ConfigError>(
          AllOf(HasSubstr("dataset.type: unknown dataset type "
                          "'constnat'; did you mean 'constant'?"),
                HasSubstr("Registered: constant, gpt, indexed, npy, synthetic, token_windows."))));
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constant"}, {"size", 1}, {"vlaue", 2}}));
      },
      ThrowsMessage<ConfigError>(
          HasSubstr("dataset.vlaue: unknown key for dataset 'constant'; did you mean "
                    "'value'?")));
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constant"}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("dataset.size: missing")));
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constant"}, {"size", "many"}}));
      },
      ThrowsMessage<ConfigError>(
          HasSubstr("dataset.size: expected an integer >= 0, found 'many'")));
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constant"}, {"size", 1}, {"value", 11}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("expected a number in [-10, 10], found '11'")));
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", "constant"}, {"size", 1}, {"mode", "warp"}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("expected one of fast, slow, found 'warp'")));
  EXPECT_THAT(
      [&] {
        resolve(
            Config::map({{"type", "constant"}, {"size", 1}, {"tags", Config::map({{"a", 1}})}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("expected list of string (or one string), found")));
  EXPECT_THAT([&] { resolve(Config::list({1})); },
              ThrowsMessage<ConfigError>(HasSubstr("a map with a 'type' key")));
  Config marked("constnat");
  marked.set_mark({"train.yaml", 4, 9});
  EXPECT_THAT(
      [&] {
        resolve(Config::map({{"type", marked}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("train.yaml:4:9: dataset.type: unknown")));
}

TEST(Registry, AFactorysOwnRejectionNamesTheKey) {
  const Registry r = make_registry();
  EXPECT_THAT(
      [&] {
        r.make_dataset(Config::map({{"type", "constant"}, {"size", 13}}));
      },
      ThrowsMessage<ConfigError>(HasSubstr("dataset.size: 13 is unlucky")));
}

TEST(Registry, DatasetsRecordTheirSpecAndApplyTransforms) {
  const Registry r = make_registry();
  auto d = r.make_dataset(
      Config::map({{"type", "constant"},
                   {"size", 4},
                   {"value", 2},
                   {"transforms", Config::list({Config::map({{"type", "negate"}})})}}));
  ASSERT_NE(d->spec(), nullptr);
  EXPECT_EQ(d->spec()->config.to_text(),
            R"({"type":"constant","size":"4","value":"2","mode":"fast","transforms":)"
            R"([{"type":"negate"}]})");
  EXPECT_EQ(d->spec()->hash, d->spec()->config.hash());
  EXPECT_FALSE(d->spec()->builtin);
  SampleContext ctx(0, 0, 0);
  EXPECT_TRUE(torch::equal(d->get(1, ctx)["x"].tensor(), torch::full({2}, -2.0)));
  // Built again from its own spec: the same spec.
  EXPECT_EQ(r.make_dataset(d->spec()->config)->spec()->hash, d->spec()->hash);
}

TEST(Registry, BuiltinsBuildAndAreMarkedBuiltin) {
  const Registry r = make_registry();
  auto d = r.make_dataset(
      Config::map({{"type", "synthetic"}, {"size", 5}, {"shape", Config::list({2, 3})}}));
  EXPECT_TRUE(d->spec()->builtin);
  SampleContext ctx(0, 0, 0);
  const Example e = d->get(4, ctx);
  EXPECT_EQ(e["data"].tensor().sizes(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(e["label"].to_int(), 4);
  EXPECT_TRUE(torch::equal(e["data"].tensor(), d->get(4, ctx)["data"].tensor()));
  auto s = r.make_sampler(Config::map({{"type", "random"}}), {.dataset_size = 10, .seed = 3});
  EXPECT_EQ(s->indices(0), RandomSampler(10, 3).indices(0));
  auto c = r.make_collate(Config("default"));
  ASSERT_NE(collate_spec(c), nullptr);
  EXPECT_EQ(collate_spec(c)->config.to_text(), R"({"type":"default"})");
  EXPECT_EQ(collate_spec(CollateFn(default_collate)), nullptr);
  EXPECT_THAT(
      [&] {
        r.make_sampler(Config::map({{"type", "weighted_random"},
                                    {"weights", Config::list({1, 2})},
                                    {"num_samples", 3}}),
                       {.dataset_size = 3});
      },
      ThrowsMessage<ConfigError>(HasSubstr("sampler.weights: has 2 weights for a dataset of 3")));
}

TEST(Registry, NamesAreUniquePerKindAndRegistrationGroupsRunOnce) {
  Registry r = make_registry();
  EXPECT_THAT(
      [&] {
        r.add_transform({.name = "negate"}, [](const Args&) { return std::make_shared<Negate>(); });
      },
      ThrowsMessage<ConfigError>(HasSubstr("already registered")));
  const auto before = r.types(ComponentKind::kSampler).size();
  register_builtins(r);  // idempotent
  EXPECT_EQ(r.types(ComponentKind::kSampler).size(), before);
  EXPECT_EQ(nearest("batchsize", {"batch_size", "shuffle"}), "batch_size");
  EXPECT_EQ(nearest("zzzzzz", {"batch_size", "shuffle"}), std::nullopt);
}

}  // namespace
}  // namespace ferry
