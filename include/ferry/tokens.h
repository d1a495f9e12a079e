#pragma once

// Token datasets for language-model training, read in place from memory-mapped files (never
// read whole, nothing copied between processes: every worker maps the same file and the page
// cache holds one copy): NumPy's .npy arrays, Megatron-LM's and fairseq's indexed datasets
// (PREFIX.idx + PREFIX.bin), nanoGPT's raw .bin files and llm.c's shards. Samples are views of
// the mapping, or built straight into the batch's shared memory, so each token is copied once
// on its way to the training loop.
//
// Tokens keep the dtype they are stored in (uint16 stays two bytes through shared memory) where
// LibTorch has it: LibTorch 2.3 and later. LibTorch 1.13 has no uint16 or uint32, so there they
// travel as the narrowest signed type that holds every value (uint16 as int32, uint32 as int64).
// `dtype = kInt64` (or int32) converts in the worker instead; device_transforms'
// ToDtype(torch::kInt64, false) widens them on the GPU.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/collate.h"
#include "ferry/dataset.h"

namespace ferry {

namespace tokens {
class IndexedFile;
class NpyArray;
class TokenFile;
struct GptIndices;
}  // namespace tokens

/// How token datasets deliver tokens: as stored (where LibTorch has the dtype), or converted.
enum class TokenDtype : std::uint8_t { kAuto, kInt32, kInt64 };

/// An .npy array (format 1.0 to 3.0; little-endian; C order; bool, integers, floats) as a
/// dataset over its first axis: sample i is `array[i]` in field `field` (and its `index`).
/// Registered as `npy`.
class NpyDataset : public Dataset {
 public:
  struct Options {
    std::string field = "data";
    TokenDtype dtype = TokenDtype::kAuto;
  };
  /// Throws ferry::DataError naming the file and the header field for a file it cannot read.
  explicit NpyDataset(std::string path, Options options);
  explicit NpyDataset(std::string path) : NpyDataset(std::move(path), Options{}) {}
  std::size_t size() const override;
  Example get(std::size_t index, SampleContext& ctx) const override;

 private:
  std::shared_ptr<const tokens::NpyArray> array_;
  Options options_;
};

/// Megatron-LM's indexed dataset (PREFIX.idx + PREFIX.bin, `tools/preprocess_data.py`'s output)
/// or fairseq's MMapIndexedDataset: sample i is sequence i, of its own length, in field `tokens`
/// (and `index`). Variable lengths: batch them with `pad_collate` or `pack_collate`. Registered
/// as `indexed`.
class IndexedDataset : public Dataset {
 public:
  struct Options {
    TokenDtype dtype = TokenDtype::kAuto;
  };
  explicit IndexedDataset(std::string prefix, Options options);
  explicit IndexedDataset(std::string prefix) : IndexedDataset(std::move(prefix), Options{}) {}
  std::size_t size() const override;
  Example get(std::size_t index, SampleContext& ctx) const override;

 private:
  std::shared_ptr<const tokens::IndexedFile> file_;
  Options options_;
};

/// Megatron-LM's GPTDataset over an indexed dataset: windows of seq_length + 1 tokens across
/// document boundaries, in the order Megatron-LM serves them for the same seed, sequence length,
/// number of samples and split (its document, sample and shuffle indices, built here as its
/// gpt_dataset.py and helpers.cpp build them, NumPy's RandomState included), so sample k is
/// Megatron's sample k token for token. Fields: `tokens` (the first seq_length) and `labels` (the
/// same shifted by one), and on request Megatron's `loss_mask`, `position_ids` and
/// `attention_mask`. Registered as `gpt`.
class GptDataset : public Dataset {
 public:
  struct Options {
    std::size_t seq_length = 2048;
    /// Samples wanted (Megatron's train_samples); the indices cover as many epochs of the split
    /// as that takes. Unset: one epoch.
    std::optional<std::size_t> num_samples;
    std::uint32_t seed = 1234;         // Megatron's --seed
    std::string split = "969,30,1";    // Megatron's --split: train, valid, test weights
    std::string split_name = "train";  // which of them
    /// Windows of seq_length + 1 tokens (Megatron's add_extra_token_to_sequence); false: of
    /// seq_length, the last label padded with `pad_token` and masked out of the loss.
    bool add_extra_token = true;
    bool labels = true;
    bool loss_mask = false;
    bool position_ids = false;
    bool attention_mask = false;  // [1, L, L] bool, true where masked out: O(L^2) a sample
    std::optional<std::int64_t> eod_token;  // for the options below
    bool eod_mask_loss = false;             // no loss on end-of-document tokens
    bool reset_position_ids = false;        // position ids restart after each end of document
    bool reset_attention_mask = false;      // no attention across an end of document
    std::int64_t pad_token = 0;
    TokenDtype dtype = TokenDtype::kAuto;
    /// A folder of index files (`<hash>-GPTDataset-<split>-{document,sample,shuffle}_index.npy`,
    /// as Megatron-LM caches them): read from there when present (Megatron's own, or ferry's),
    /// else built and written there. Empty: built in memory each time (in every spawned worker).
    std::string cache;
    /// Which hash's files to read when the cache folder holds several.
    std::string cache_hash;
  };
  explicit GptDataset(std::string prefix, Options options);
  std::size_t size() const override;
  Example get(std::size_t index, SampleContext& ctx) const override;
  /// The window of sample `index` as Megatron's GPTDataset reads it (seq_length + 1 tokens, or
  /// seq_length without the extra token), as int64.
  std::vector<std::int64_t> window(std::size_t index) const;
  /// The three indices, as Megatron-LM builds them (or read from the cache).
  const tokens::GptIndices& indices() const noexcept { return *indices_; }
  /// The hash ferry names its own cache files with: of the prefix, every sequence's length, the
  /// .bin's size and the options that decide the indices.
  std::string cache_hash() const;

 private:
  template <class Visit>
  void for_each_run(std::size_t index, Visit&& visit) const;
  std::string hash_of_cache(const std::string& files_digest) const;
  std::shared_ptr<const tokens::IndexedFile> file_;
  std::shared_ptr<const tokens::GptIndices> indices_;
  Options options_;
  std::string prefix_;
};

/// nanoGPT's sampling: windows at random offsets of one long token file, `x` of `block_size`
/// tokens and `y` the same shifted by one. The offset of sample i is drawn from its own
/// generator, seeded by (seed, epoch, i), so an epoch is the same whatever the workers; an epoch
/// is `epoch_length` samples. The file: nanoGPT's .bin (raw little-endian uint16, or uint32), an
/// llm.c shard (its header says which), or a 1-D integer .npy. Registered as `token_windows`.
class TokenWindows : public Dataset {
 public:
  struct Options {
    std::size_t block_size = 1024;
    std::size_t epoch_length = 0;    // 0: the file's tokens / block_size
    std::string format = "auto";     // auto | bin | llmc | npy
    std::string element = "uint16";  // a raw .bin's tokens: uint16 or uint32
    TokenDtype dtype = TokenDtype::kAuto;
  };
  explicit TokenWindows(std::string path, Options options);
  std::size_t size() const override { return epoch_length_; }
  Example get(std::size_t index, SampleContext& ctx) const override;

 private:
  std::shared_ptr<const tokens::TokenFile> file_;
  Options options_;
  std::size_t epoch_length_ = 0;
};

/// Batches variable-length samples: every 1-D tensor field whose lengths differ is padded on the
/// right to the longest in the batch (rounded up to a multiple of `multiple_of`) with `value`
/// (`label_value` for a field named `labels`), and `attention_mask` (bool [B, L], true on real
/// tokens) and `lengths` (int64 [B]) are added; other fields are collated as default_collate
/// does. Registered as `pad`.
struct PadOptions {
  std::int64_t value = 0;
  std::int64_t label_value = -100;  // PyTorch's cross_entropy ignore_index
  std::size_t multiple_of = 1;
  std::string field = "tokens";  // whose lengths give attention_mask and lengths
};
CollateFn pad_collate(PadOptions options = {});

/// Packs documents into rows of `row_length` for FlashAttention's variable-length kernels: the
/// samples' `field` tensors (1-D) laid end to end in order, a document that does not fit in
/// what is left of a row starting the next row, one longer than a row cut into pieces of
/// `row_length`. Fields: `field` [R, row_length] (`value` after the last document of a row),
/// `position_ids` (int64, restarting at 0 with each document or piece; 0 on padding),
/// `cu_seqlens` (int32, every sequence's start in the flattened rows and the end, a row's
/// padding counted as a sequence of its own so that they cover every position), `max_seqlen`
/// (int64, 0-d) and `document_ids` (int32 [R, row_length]: the sample's position in the batch,
/// -1 on padding). Registered as `pack`.
struct PackOptions {
  std::size_t row_length = 2048;
  std::int64_t value = 0;
  std::string field = "tokens";
};
CollateFn pack_collate(PackOptions options);

class Registry;
/// Registers npy, indexed, gpt, token_windows, and the pad and pack collates (register_core_types
/// calls it). Idempotent.
void register_token_types(Registry& registry);

}  // namespace ferry
