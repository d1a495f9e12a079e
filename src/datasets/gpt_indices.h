#pragma once

// Megatron-LM's GPTDataset indices, built as megatron/core/datasets/gpt_dataset.py and
// helpers.cpp build them, so that sample k here is Megatron's sample k token for token: the
// document index (the split's sequences repeated for each epoch and shuffled), the sample index
// (where each window of seq_length + 1 tokens starts: a position in the document index and an
// offset), and the shuffle index (the order samples are served in), with NumPy's legacy
// RandomState (MT19937) doing the shuffles in Megatron's order. Or the same three arrays read
// from the .npy files Megatron caches them in, or written there.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "datasets/token_files.h"

namespace ferry::tokens {

/// numpy.random.RandomState(seed) for shuffles: MT19937 seeded by init_genrand (as std::mt19937
/// is), bounded draws by mask and rejection (numpy's random_interval), and RandomState.shuffle's
/// Fisher-Yates from the last element down.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(std::uint32_t seed) : engine_(seed) {}
  /// A uniform integer in [0, max], as numpy's random_interval draws it.
  std::uint64_t interval(std::uint64_t max);
  /// numpy.random.RandomState.shuffle of a 1-D array.
  template <class T>
  void shuffle(T* data, std::size_t n) {
    for (std::size_t i = n; i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(interval(i - 1));
      std::swap(data[i - 1], data[j]);
    }
  }

 private:
  std::mt19937 engine_;
};

/// An array of integers in one of the stored widths (an .npy file Megatron wrote, or one built
/// here), read by position.
class IntArray {
 public:
  IntArray() = default;
  /// Owns `values` (int32, uint32 or int64).
  template <class T>
  static IntArray owning(std::vector<T> values) {
    static_assert(std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::uint32_t> ||
                  std::is_same_v<T, std::int64_t>);
    auto held = std::make_shared<std::vector<T>>(std::move(values));
    IntArray a;
    a.data_ = held->data();
    a.size_ = held->size();
    a.element_ = std::is_same_v<T, std::int32_t>    ? Element::kInt32
                 : std::is_same_v<T, std::uint32_t> ? Element::kUInt32
                                                    : Element::kInt64;
    a.keep_ = std::move(held);
    return a;
  }
  static IntArray of(NpyArray array);  // mapped
  std::size_t size() const noexcept { return size_; }
  std::int64_t operator[](std::size_t i) const noexcept;
  Element element() const noexcept { return element_; }
  const void* data() const noexcept { return data_; }

 private:
  std::shared_ptr<const void> keep_;
  const void* data_ = nullptr;
  Element element_ = Element::kInt64;
  std::size_t size_ = 0;
};

struct GptSpec {
  std::string split = "969,30,1";  // Megatron's --split: the weights of train, valid, test
  int split_index = 0;             // 0 train, 1 valid, 2 test
  std::uint32_t seed = 1234;       // Megatron's --seed
  std::size_t seq_length = 0;
  std::optional<std::size_t> num_samples;  // none: one epoch
  bool add_extra_token = true;             // windows of seq_length + 1 tokens
  // files_digest() of the files, where indices are cached: ferry's description of its own cached
  // indices records it, and a set whose record differs was built from other files.
  std::string files;
};

// A digest of what the indices depend on in the files: every sequence's length and the .bin's
// size (a corpus tokenized again keeps its count of sequences, not their lengths). Reads the
// whole length array.
std::string files_digest(const IndexedFile& file);

struct GptIndices {
  IntArray document_index;  // sequence ids, int32
  IntArray sample_index;    // (samples + 1) x 2: position in document_index, token offset
  IntArray shuffle_index;   // samples
  std::size_t num_epochs = 0;
  bool separate_final_epoch = false;
  std::size_t samples() const noexcept { return shuffle_index.size(); }
};

/// The split's sequences: [round(lo x N), round(hi x N)) of the index's N sequences, the bounds
/// from the normalised split weights as Megatron computes them (Python's round: half to even).
std::pair<std::size_t, std::size_t> split_range(const std::string& split,
                                                int split_index,
                                                std::size_t sequences);

/// The indices Megatron-LM builds for `spec` over `file`.
GptIndices build_gpt_indices(const IndexedFile& file, const GptSpec& spec);

/// The split names Megatron's cache files use.
const char* split_name(int split_index);

/// The three arrays from `folder`, as Megatron-LM caches them (or write_gpt_indices writes them):
/// `<hash>-GPTDataset-<split>-{document,sample,shuffle}_index.npy`. A set whose
/// `-description.txt` (Megatron's JSON, where there is one) names another split, seed, sequence
/// length, number of samples or dataset is left alone; of the rest, the one of `hash` (ferry's
/// own for this dataset, or the one asked for), else the only one Megatron wrote; nullopt when
/// none fits (build, then write). The arrays' shapes are checked here; their values when read.
std::optional<GptIndices> read_gpt_indices(const std::filesystem::path& folder,
                                           const std::string& hash,
                                           const IndexedFile& file,
                                           const GptSpec& spec);
/// Writes the three arrays in Megatron's names and dtypes under `hash`, and a description in
/// Megatron's form.
void write_gpt_indices(const std::filesystem::path& folder,
                       const std::string& hash,
                       const std::string& prefix,
                       const GptSpec& spec,
                       const GptIndices& indices);

}  // namespace ferry::tokens
