#include "collate/buffer_pool.h"

#include <gtest/gtest.h>

#include "ferry/data_loader.h"

#include "support/datasets.h"

namespace ferry::collate {
namespace {

TEST(BufferPool, ReusesAReleasedBufferThatIsLargeEnough) {
  auto pool = std::make_shared<BufferPool>();
  void* first = nullptr;
  {
    auto a = pool->acquire(1 << 20);
    first = a.get();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
  }
  auto b = pool->acquire(1000);  // smaller: the released buffer fits
  EXPECT_EQ(b.get(), first);
  auto c = pool->acquire(1 << 20);  // b is taken: a new one
  EXPECT_NE(c.get(), first);
}

TEST(BufferPool, BuffersOutliveThePool) {
  std::shared_ptr<void> kept;
  {
    auto pool = std::make_shared<BufferPool>();
    kept = pool->acquire(4096);
    std::memset(kept.get(), 7, 4096);
  }
  EXPECT_EQ(static_cast<unsigned char*>(kept.get())[4095], 7);  // freed later, by its deleter
}

TEST(BufferPool, InProcessBatchesHeldByTheUserAreNeverOverwritten) {
  DataLoader loader(std::make_shared<testing::RangeDataset>(64), {.batch_size = 4});
  std::vector<Batch> kept;
  for (auto& batch : loader) kept.push_back(batch);
  for (std::size_t k = 0; k < kept.size(); ++k) {
    const auto first = static_cast<float>(k * 4);
    EXPECT_EQ(kept[k]["x"][0][0].item<float>(), first) << "batch " << k;
  }
}

}  // namespace
}  // namespace ferry::collate
