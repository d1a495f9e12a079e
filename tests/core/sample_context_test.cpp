#include "ferry/sample_context.h"

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"

namespace ferry {
namespace {

TEST(SampleContext, SeedDependsOnSeedEpochAndIndexOnly) {
  SampleContext a(1, 2, 3, /*worker_id=*/0, /*num_workers=*/1);
  SampleContext b(1, 2, 3, /*worker_id=*/5, /*num_workers=*/8);
  EXPECT_EQ(a.seed(), b.seed());
  EXPECT_EQ(a.uniform(), b.uniform());
  EXPECT_TRUE(torch::rand({4}, a.generator()).equal(torch::rand({4}, b.generator())));
  std::set<std::uint64_t> seeds;
  for (std::uint64_t seed : {0u, 1u}) {
    for (std::uint64_t epoch : {0u, 1u}) {
      for (std::int64_t index : {0, 1, 2})
        seeds.insert(SampleContext::mix_seed(seed, epoch, index));
    }
  }
  EXPECT_EQ(seeds.size(), 12u);
}

TEST(SampleContext, DrawsStayInRange) {
  SampleContext ctx(9, 0, 0);
  int heads = 0;
  for (int i = 0; i < 2000; ++i) {
    const double u = ctx.uniform(2.0, 3.0);
    ASSERT_GE(u, 2.0);
    ASSERT_LT(u, 3.0);
    const auto r = ctx.randint(-2, 3);
    ASSERT_GE(r, -2);
    ASSERT_LT(r, 3);
    heads += ctx.bernoulli(0.25) ? 1 : 0;
  }
  EXPECT_NEAR(heads / 2000.0, 0.25, 0.05);
  EXPECT_THROW(ctx.randint(3, 3), ConfigError);
}

TEST(SampleContext, StreamsOfDifferentWorkersDiffer) {
  const auto w0 = SampleContext::for_stream(1, 0, 5, 0, 2);
  const auto w1 = SampleContext::for_stream(1, 0, 5, 1, 2);
  EXPECT_NE(w0.seed(), w1.seed());
  EXPECT_EQ(w0.seed(), SampleContext::for_stream(1, 0, 5, 0, 2).seed());
  EXPECT_EQ(w1.worker_id(), 1u);
  EXPECT_EQ(w1.num_workers(), 2u);
  EXPECT_EQ(w1.index(), 5);
}

}  // namespace
}  // namespace ferry
