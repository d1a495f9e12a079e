// The main process's handling of what a worker sends, fed random and mutated messages: decoding
// (ipc::decode_data) and turning a "batch ready" message into tensors over its segment
// (detail::open_batch). Nothing a worker sends may crash the training process or make it read
// outside the segment: every outcome is a batch that lies inside it, or a ferry::Error.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/error.h"

#include "collate/batch_layout.h"
#include "ipc/protocol.h"
#include "loader/batch_message.h"

namespace ferry {
namespace {

constexpr std::size_t kSegmentBytes = 64 * 1024;

// A well-formed message of four fields (float [8,3], int64 [8], bool [8,2], strings) laid out
// in a segment of kSegmentBytes, as a worker sends it.
ipc::BatchReadyMessage valid_message() {
  ipc::BatchReadyMessage m;
  m.epoch = 1;
  m.sequence = 5;
  m.segment_id = 3;
  m.segment_size = kSegmentBytes;
  m.num_samples = 8;
  auto tensor = [](std::string name, c10::ScalarType dtype, std::vector<std::int64_t> sizes,
                   std::uint64_t offset) {
    ipc::FieldMeta f;
    f.name = std::move(name);
    f.kind = static_cast<std::uint8_t>(collate::FieldKind::kTensor);
    f.dtype = static_cast<std::int8_t>(dtype);
    std::uint64_t numel = 1;
    for (auto s : sizes) numel *= static_cast<std::uint64_t>(s);
    f.nbytes = numel * c10::elementSize(dtype);
    f.sizes = std::move(sizes);
    f.offset = offset;
    return f;
  };
  m.fields.push_back(tensor("x", c10::ScalarType::Float, {8, 3}, 0));
  m.fields.push_back(tensor("i", c10::ScalarType::Long, {8}, 128));
  m.fields.push_back(tensor("mask", c10::ScalarType::Bool, {8, 2}, 192));
  ipc::FieldMeta s;
  s.name = "path";
  s.kind = static_cast<std::uint8_t>(collate::FieldKind::kString);
  s.strings = {"a", "b", "c", "d", "e", "f", "g", "h"};
  m.fields.push_back(std::move(s));
  for (std::int64_t i = 0; i < 8; ++i) m.indices.push_back(i * 3);
  return m;
}

// Reads every byte of every tensor of `batch`; a tensor outside the segment is a failure here
// (and a report under a sanitizer).
void touch_every_byte(const Batch& batch, const std::byte* base) {
  for (const auto& name : batch.names()) {
    if (!batch.is_tensor(name)) continue;
    const at::Tensor& t = batch[name];
    const auto* p = static_cast<const std::byte*>(t.data_ptr());
    const std::size_t n = t.numel() * t.element_size();
    if (n == 0) continue;
    ASSERT_GE(p, base) << name;
    ASSERT_LE(p + n, base + kSegmentBytes) << name;
    volatile unsigned sum = 0;
    for (std::size_t k = 0; k < n; ++k) sum = sum + static_cast<unsigned>(p[k]);
  }
}

// Decodes `bytes` and opens the batch as the main process does. Returns whether it opened.
bool handle(std::span<const std::byte> bytes, std::byte* base, std::size_t size) {
  ipc::DataMessage message;
  try {
    message = ipc::decode_data(bytes);
  } catch (const Error&) {
    return false;
  }
  auto* m = std::get_if<ipc::BatchReadyMessage>(&message);
  if (m == nullptr) return false;
  try {
    const Batch batch = detail::open_batch(*m, base, size, nullptr, "worker 0 (pid 1)");
    touch_every_byte(batch, base);
    return true;
  } catch (const Error&) {
    return false;
  }
}

struct Segment {
  Segment() : data(static_cast<std::byte*>(std::aligned_alloc(64, kSegmentBytes))) {
    std::memset(data.get(), 0x5A, kSegmentBytes);
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
};

TEST(MessageFuzz, AValidMessageOpensAsTheBatchItDescribes) {
  Segment segment;
  ipc::BatchReadyMessage m = valid_message();
  const Batch batch = detail::open_batch(m, segment.data.get(), kSegmentBytes, nullptr, "w");
  EXPECT_EQ(batch["x"].sizes(), (std::vector<std::int64_t>{8, 3}));
  EXPECT_EQ(batch["mask"].scalar_type(), at::kBool);
  EXPECT_EQ(batch.strings("path").size(), 8u);
  EXPECT_EQ(batch.indices()[7], 21);
}

TEST(MessageFuzz, EachKindOfLieIsAnErrorNamingTheWorkerAndTheField) {
  Segment segment;
  auto expect_error = [&](auto mutate, const char* says) {
    ipc::BatchReadyMessage m = valid_message();
    mutate(m);
    try {
      (void)detail::open_batch(m, segment.data.get(), kSegmentBytes, nullptr, "worker 2 (pid 9)");
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("worker 2 (pid 9)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error([](auto& m) { m.fields[0].offset = kSegmentBytes - 8; }, "outside its segment");
  expect_error([](auto& m) { m.fields[0].offset = ~std::uint64_t{0} - 4; }, "outside");
  expect_error([](auto& m) { m.fields[1].nbytes = 8; }, "sizes and dtype make 64");
  expect_error([](auto& m) { m.fields[0].sizes = {1LL << 40, 1LL << 40}; }, "overflows");
  expect_error([](auto& m) { m.fields[0].sizes = {-1, 3}; }, "with size -1");
  expect_error([](auto& m) { m.fields[0].dtype = 99; }, "dtype code 99");
  expect_error([](auto& m) { m.fields[0].dtype = -1; }, "dtype code -1");
  expect_error([](auto& m) { m.fields[0].kind = 7; }, "no field kind");
  expect_error([](auto& m) { m.fields[1].offset = 129; }, "not aligned");
  expect_error([](auto& m) { m.fields[2].name = "x"; }, "twice");
  expect_error([](auto& m) { m.fields[3].nbytes = 16; }, "tensor's extent");
}

TEST(MessageFuzz, AHundredThousandRandomAndMutatedMessagesNeverCrash) {
  Segment segment;
  const std::vector<std::byte> valid = ipc::encode(ipc::DataMessage(valid_message()));
  ASSERT_TRUE(handle(valid, segment.data.get(), kSegmentBytes));
  std::mt19937_64 rng(20261122);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::size_t opened = 0;
  constexpr int kRuns = 100'000;
  for (int run = 0; run < kRuns; ++run) {
    std::vector<std::byte> bytes;
    switch (run % 5) {
      case 0: {  // random bytes behind a valid header
        bytes.assign(valid.begin(), valid.begin() + 8);
        const std::size_t n = pick(512);
        for (std::size_t k = 0; k < n; ++k) bytes.push_back(static_cast<std::byte>(rng()));
        break;
      }
      case 1:  // truncated
        bytes.assign(valid.begin(),
                     valid.begin() + static_cast<std::ptrdiff_t>(pick(valid.size())));
        break;
      case 2: {  // a few bytes flipped
        bytes = valid;
        for (std::size_t k = 1 + pick(4); k > 0; --k) {
          bytes[pick(bytes.size())] ^= static_cast<std::byte>(1u << pick(8));
        }
        break;
      }
      case 3: {  // an aligned 32- or 64-bit word overwritten with an extreme value
        bytes = valid;
        static constexpr std::uint64_t kExtremes[] = {0,
                                                      1,
                                                      0x7F,
                                                      0xFF,
                                                      0x7FFFFFFF,
                                                      0xFFFFFFFF,
                                                      0x7FFFFFFFFFFFFFFF,
                                                      0xFFFFFFFFFFFFFFFF,
                                                      kSegmentBytes,
                                                      kSegmentBytes - 1};
        const std::uint64_t v = kExtremes[pick(std::size(kExtremes))];
        const std::size_t width = pick(2) == 0 ? 4 : 8;
        const std::size_t at = pick(bytes.size() - width + 1);
        std::memcpy(bytes.data() + at, &v, width);
        break;
      }
      default: {  // a structured lie in one field of the message itself
        ipc::BatchReadyMessage m = valid_message();
        ipc::FieldMeta& f = m.fields[pick(m.fields.size())];
        switch (pick(6)) {
          case 0:
            f.offset = rng() % (2 * kSegmentBytes);
            break;
          case 1:
            f.nbytes = rng() % (2 * kSegmentBytes);
            break;
          case 2:
            f.dtype = static_cast<std::int8_t>(rng());
            break;
          case 3:
            f.kind = static_cast<std::uint8_t>(rng());
            break;
          case 4:
            if (!f.sizes.empty()) f.sizes[pick(f.sizes.size())] = static_cast<std::int64_t>(rng());
            break;
          default:
            f.sizes.push_back(static_cast<std::int64_t>(pick(5)));
            break;
        }
        bytes = ipc::encode(ipc::DataMessage(std::move(m)));
        break;
      }
    }
    opened += handle(bytes, segment.data.get(), kSegmentBytes) ? 1 : 0;
    if (HasFatalFailure()) FAIL() << "run " << run;
  }
  // Some mutations leave a valid batch (a flipped bit in a string, say); most do not.
  EXPECT_GT(opened, 0u);
  EXPECT_LT(opened, static_cast<std::size_t>(kRuns));
}

}  // namespace
}  // namespace ferry
