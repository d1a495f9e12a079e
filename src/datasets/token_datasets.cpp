// The token datasets of ferry/tokens.h: npy, indexed, gpt and token_windows.

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "ferry/error.h"
#include "ferry/registry.h"
#include "ferry/tokens.h"

#include "core/hash.h"
#include "datasets/gpt_indices.h"
#include "datasets/token_files.h"

namespace ferry {

namespace {

using detail::str;
using tokens::Element;

int split_index_of(const std::string& name) {
  if (name == "train") return 0;
  if (name == "valid" || name == "validation") return 1;
  if (name == "test") return 2;
  throw ConfigError(str("gpt: split_name='", name, "' is not train, valid or test"));
}

}  // namespace

// ---- npy ----

NpyDataset::NpyDataset(std::string path, Options options)
    : array_(std::make_shared<const tokens::NpyArray>(tokens::NpyArray::open(path))),
      options_(std::move(options)) {
  if (array_->shape().empty()) {
    throw DataError(str(array_->path(), ": a 0-d array has no first axis to index samples by"));
  }
  (void)tokens::delivered_dtype(array_->element(), options_.dtype);  // checks dtype=int32/64
}

std::size_t NpyDataset::size() const { return static_cast<std::size_t>(array_->shape()[0]); }

Example NpyDataset::get(std::size_t index, SampleContext&) const {
  FERRY_CHECK(index < size(), "npy: index ", index, " out of range (", size(), " samples)");
  const std::vector<std::int64_t> sizes(array_->shape().begin() + 1, array_->shape().end());
  const std::size_t per_sample = size() == 0 ? 0 : array_->count() / size();
  const std::byte* first =
      array_->data() + index * per_sample * tokens::element_size(array_->element());
  return {
      {options_.field, tokens::tensor_of(first, array_->element(), sizes,
                                         tokens::delivered_dtype(array_->element(), options_.dtype),
                                         array_->file())},
      {"index", static_cast<std::int64_t>(index)}};
}

// ---- indexed ----

IndexedDataset::IndexedDataset(std::string prefix, Options options)
    : file_(std::make_shared<const tokens::IndexedFile>(tokens::IndexedFile::open(prefix))),
      options_(options) {
  (void)tokens::delivered_dtype(file_->element(), options_.dtype);
}

std::size_t IndexedDataset::size() const { return file_->sequences(); }

Example IndexedDataset::get(std::size_t index, SampleContext& ctx) const {
  FERRY_CHECK(index < size(), "indexed: index ", index, " out of range (", size(), " sequences)");
  const torch::ScalarType dtype = tokens::delivered_dtype(file_->element(), options_.dtype);
  const std::int64_t length = file_->length(index);
  torch::Tensor out = ctx.output("tokens", {length}, dtype);
  tokens::convert(file_->tokens(index), file_->element(), static_cast<std::size_t>(length),
                  out.data_ptr(), dtype);
  return {{"tokens", out}, {"index", static_cast<std::int64_t>(index)}};
}

// ---- gpt ----

GptDataset::GptDataset(std::string prefix, Options options)
    : file_(std::make_shared<const tokens::IndexedFile>(tokens::IndexedFile::open(prefix))),
      options_(std::move(options)),
      prefix_(std::move(prefix)) {
  FERRY_CHECK(options_.seq_length > 0, "gpt: seq_length must be positive");
  FERRY_CHECK(tokens::is_integer(file_->element()), "gpt: ", prefix_, " holds ",
              tokens::element_name(file_->element()), ", not tokens");
  FERRY_CHECK(!(options_.num_samples && *options_.num_samples == 0),
              "gpt: num_samples must be positive, or unset for one epoch");
  FERRY_CHECK(options_.eod_token || !(options_.eod_mask_loss || options_.reset_position_ids ||
                                      options_.reset_attention_mask),
              "gpt: eod_mask_loss, reset_position_ids and reset_attention_mask need eod_token");
  const torch::ScalarType delivered = tokens::delivered_dtype(file_->element(), options_.dtype);
  if (options_.labels && !options_.add_extra_token) {
    // The last label is pad_token, in the labels' dtype: a value it cannot hold would wrap.
    std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
    std::int64_t highest = std::numeric_limits<std::int64_t>::max();
    if (delivered == torch::kInt32) {
      lowest = std::numeric_limits<std::int32_t>::min();
      highest = std::numeric_limits<std::int32_t>::max();
    } else if (c10::elementSize(delivered) < 8 && !c10::isSignedType(delivered)) {
      lowest = 0;
      highest = (std::int64_t{1} << (8 * c10::elementSize(delivered))) - 1;
    }
    FERRY_CHECK(options_.pad_token >= lowest && options_.pad_token <= highest,
                "gpt: pad_token=", options_.pad_token, " does not fit the labels' dtype (",
                c10::toString(delivered), ", from ", prefix_,
                "); use a token id in range, or dtype: int64");
  }
  tokens::GptSpec spec;
  spec.split = options_.split;
  spec.split_index = split_index_of(options_.split_name);
  spec.seed = options_.seed;
  spec.seq_length = options_.seq_length;
  spec.num_samples = options_.num_samples;
  spec.add_extra_token = options_.add_extra_token;
  std::optional<tokens::GptIndices> indices;
  std::string own_hash;  // the digest reads every length: once
  if (!options_.cache.empty()) {
    spec.files = tokens::files_digest(*file_);
    own_hash = hash_of_cache(spec.files);
    indices = tokens::read_gpt_indices(
        options_.cache, options_.cache_hash.empty() ? own_hash : options_.cache_hash, *file_, spec);
  }
  if (!indices) {
    indices = tokens::build_gpt_indices(*file_, spec);
    if (!options_.cache.empty()) {
      tokens::write_gpt_indices(options_.cache, own_hash, prefix_, spec, *indices);
    }
  }
  indices_ = std::make_shared<const tokens::GptIndices>(std::move(*indices));
}

std::size_t GptDataset::size() const { return indices_->samples(); }

std::string GptDataset::cache_hash() const { return hash_of_cache(tokens::files_digest(*file_)); }

std::string GptDataset::hash_of_cache(const std::string& files_digest) const {
  // Not Megatron's hash (an MD5 of its configuration's JSON, tokenizer included): ferry's own
  // files carry this one; Megatron's are read whatever their hash.
  std::string text =
      str(prefix_, '\n', files_digest, '\n', options_.seq_length, '\n',
          options_.num_samples ? std::to_string(*options_.num_samples) : "-", '\n', options_.seed,
          '\n', options_.split, '\n', options_.split_name, '\n', options_.add_extra_token);
  return "ferry" + detail::hex64(detail::fnv1a(text)).substr(0, 16) + std::string(11, '0');
}

// The runs of tokens sample `index`'s window is made of, in order: `visit(source, count, at)` for
// `count` tokens at `source` in .bin that go to window position `at`. Every index is checked
// (the indices may come from a cache folder).
template <class Visit>
void GptDataset::for_each_run(std::size_t index, Visit&& visit) const {
  FERRY_CHECK(index < size(), "gpt: index ", index, " out of range (", size(), " samples)");
  const std::size_t extra = options_.add_extra_token ? 1 : 0;
  const std::size_t wanted = options_.seq_length + extra;
  const tokens::GptIndices& x = *indices_;
  auto bad = [&](const std::string& what) {
    return DataError(str("gpt: sample ", index, " of ", prefix_, ": ", what,
                         options_.cache.empty()
                             ? std::string()
                             : str(" (are the indices in ", options_.cache, " this dataset's?)")));
  };
  const std::int64_t i = x.shuffle_index[index];
  if (i < 0 || static_cast<std::size_t>(i) >= size() ||
      2 * static_cast<std::size_t>(i) + 3 >= x.sample_index.size()) {
    throw bad(str("the shuffle index gives ", i, ", outside the sample index"));
  }
  const auto row = static_cast<std::size_t>(i);
  const std::int64_t first = x.sample_index[2 * row];
  const std::int64_t first_offset = x.sample_index[2 * row + 1];
  const std::int64_t last = x.sample_index[2 * row + 2];
  const std::int64_t last_offset = x.sample_index[2 * row + 3];
  if (first < 0 || last < first || static_cast<std::size_t>(last) >= x.document_index.size()) {
    throw bad(str("the sample index spans document positions ", first, " to ", last,
                  ", outside the document index (", x.document_index.size(), ")"));
  }
  std::size_t filled = 0;
  for (std::int64_t p = first; p <= last; ++p) {
    const std::int64_t sequence = x.document_index[static_cast<std::size_t>(p)];
    if (sequence < 0 || static_cast<std::size_t>(sequence) >= file_->sequences()) {
      throw bad(str("the document index names sequence ", sequence, " of ", file_->sequences()));
    }
    const auto seq = static_cast<std::size_t>(sequence);
    const std::int64_t length = file_->length(seq);
    const std::int64_t from = p == first ? first_offset : 0;
    if (p == last && (last_offset < 0 || last_offset > length)) {
      throw bad(str("its window ends at token ", last_offset, " of sequence ", seq, " (", length,
                    " tokens)"));
    }
    const std::int64_t to = p == last ? last_offset + static_cast<std::int64_t>(extra) : length;
    if (from < 0 || to < from || to > length ||
        filled + static_cast<std::size_t>(to - from) > wanted) {
      throw bad(str("its window runs past sequence ", seq, " (tokens ", from, " to ", to, " of ",
                    length, ") or past ", wanted, " tokens"));
    }
    visit(file_->tokens(seq, static_cast<std::size_t>(from)), static_cast<std::size_t>(to - from),
          filled);
    filled += static_cast<std::size_t>(to - from);
  }
  if (filled != wanted) throw bad(str("its window holds ", filled, " tokens, not ", wanted));
}

std::vector<std::int64_t> GptDataset::window(std::size_t index) const {
  std::vector<std::int64_t> out(options_.seq_length + (options_.add_extra_token ? 1 : 0));
  for_each_run(index, [&](const std::byte* source, std::size_t count, std::size_t at) {
    tokens::convert(source, file_->element(), count, out.data() + at, torch::kInt64);
  });
  return out;
}

Example GptDataset::get(std::size_t index, SampleContext& ctx) const {
  const std::size_t L = options_.seq_length;
  const auto n = static_cast<std::int64_t>(L);
  const bool extra = options_.add_extra_token;
  const torch::ScalarType dtype = tokens::delivered_dtype(file_->element(), options_.dtype);
  const std::size_t item = c10::elementSize(dtype);
  const Element element = file_->element();
  const std::size_t stored = tokens::element_size(element);
  // Straight from the mapping into the batch: tokens are window positions [0, L), labels
  // [1, L + 1) (without the extra token, [1, L) and the pad token last).
  torch::Tensor tokens = ctx.output("tokens", {n}, dtype);
  torch::Tensor labels;
  if (options_.labels) labels = ctx.output("labels", {n}, dtype);
  auto* t = static_cast<std::byte*>(tokens.data_ptr());
  auto* l = options_.labels ? static_cast<std::byte*>(labels.data_ptr()) : nullptr;
  for_each_run(index, [&](const std::byte* source, std::size_t count, std::size_t at) {
    if (at < L) {
      const std::size_t k = std::min(count, L - at);
      tokens::convert(source, element, k, t + at * item, dtype);
    }
    if (l != nullptr) {
      const std::size_t skip = at == 0 ? 1 : 0;  // label position = window position - 1
      if (count > skip) {
        const std::size_t begin = at + skip - 1;
        const std::size_t k = std::min(count - skip, L - std::min(L, begin));
        if (begin < L) tokens::convert(source + skip * stored, element, k, l + begin * item, dtype);
      }
    }
  });
  if (l != nullptr && !extra) {
    labels[n - 1].fill_(options_.pad_token);
  }
  Example out{{"tokens", tokens}};
  if (options_.labels) out.set("labels", labels);
  // Megatron's masks and positions (gpt_dataset.py _get_ltor_masks_and_position_ids).
  const bool eod = options_.eod_token.has_value();
  std::vector<std::size_t> ends;  // positions of end-of-document tokens
  if (eod &&
      (options_.eod_mask_loss || options_.reset_position_ids || options_.reset_attention_mask)) {
    const torch::Tensor values = tokens.to(torch::kInt64);
    const std::int64_t* v = values.data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < L; ++k) {
      if (v[k] == *options_.eod_token) ends.push_back(k);
    }
  }
  if (options_.loss_mask) {
    torch::Tensor mask = ctx.output("loss_mask", {n}, torch::kFloat32);
    float* m = mask.data_ptr<float>();
    std::fill(m, m + L, 1.0f);
    if (options_.eod_mask_loss) {
      for (const std::size_t e : ends) m[e] = 0.0f;
    }
    if (!extra) m[L - 1] = 0.0f;  // its label is padding
    out.set("loss_mask", mask);
  }
  if (options_.position_ids) {
    torch::Tensor p = ctx.output("position_ids", {n}, torch::kInt64);
    std::int64_t* positions = p.data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < L; ++k) positions[k] = static_cast<std::int64_t>(k);
    if (options_.reset_position_ids) {
      std::size_t previous = 0;
      for (const std::size_t e : ends) {
        for (std::size_t k = e + 1; k < L; ++k) {
          positions[k] -= static_cast<std::int64_t>(e + 1 - previous);
        }
        previous = e + 1;
      }
    }
    out.set("position_ids", p);
  }
  if (options_.attention_mask) {
    torch::Tensor mask = ctx.output("attention_mask", {1, n, n}, torch::kBool);
    bool* m = mask.data_ptr<bool>();
    // Causal: masked (true) above the diagonal; with reset_attention_mask also every query after
    // an end of document, at the keys up to it.
    for (std::size_t q = 0; q < L; ++q) {
      for (std::size_t k = 0; k < L; ++k) m[q * L + k] = k > q;
    }
    if (options_.reset_attention_mask) {
      for (const std::size_t e : ends) {
        for (std::size_t q = e + 1; q < L; ++q) {
          for (std::size_t k = 0; k <= e; ++k) m[q * L + k] = true;
        }
      }
    }
    out.set("attention_mask", mask);
  }
  out.set("index", static_cast<std::int64_t>(index));
  return out;
}

// ---- token_windows ----

TokenWindows::TokenWindows(std::string path, Options options) : options_(std::move(options)) {
  const auto element = tokens::element_from_name(options_.element);
  FERRY_CHECK(element.has_value(), "token_windows: element='", options_.element,
              "' is not a dtype name (uint16, uint32)");
  file_ = std::make_shared<const tokens::TokenFile>(
      tokens::TokenFile::open(path, options_.format, *element));
  FERRY_CHECK(options_.block_size > 0, "token_windows: block_size must be positive");
  if (file_->count() < options_.block_size + 1) {
    throw DataError(str(file_->path(), ": ", file_->count(), " tokens, fewer than one window of ",
                        options_.block_size, " + 1"));
  }
  (void)tokens::delivered_dtype(file_->element(), options_.dtype);
  epoch_length_ =
      options_.epoch_length > 0 ? options_.epoch_length : file_->count() / options_.block_size;
}

Example TokenWindows::get(std::size_t index, SampleContext& ctx) const {
  FERRY_CHECK(index < size(), "token_windows: index ", index, " out of range (", size(), ")");
  // nanoGPT's get_batch: an offset in [0, len(data) - block_size), drawn for this sample alone.
  const auto block = static_cast<std::int64_t>(options_.block_size);
  const std::int64_t offset = ctx.randint(0, static_cast<std::int64_t>(file_->count()) - block);
  const torch::ScalarType dtype = tokens::delivered_dtype(file_->element(), options_.dtype);
  const std::size_t item = tokens::element_size(file_->element());
  const std::byte* at = file_->data() + static_cast<std::size_t>(offset) * item;
  torch::Tensor x = ctx.output("x", {block}, dtype);
  torch::Tensor y = ctx.output("y", {block}, dtype);
  tokens::convert(at, file_->element(), options_.block_size, x.data_ptr(), dtype);
  tokens::convert(at + item, file_->element(), options_.block_size, y.data_ptr(), dtype);
  return {{"x", x}, {"y", y}, {"index", static_cast<std::int64_t>(index)}};
}

// ---- the registry ----

namespace {

KeySpec dtype_key() {
  return {.name = "dtype",
          .default_value = "auto",
          .help =
              "tokens as stored where LibTorch has the dtype (uint16 on LibTorch 2.3+; on 1.13 "
              "uint16 travels as int32, uint32 as int64), or int32 / int64",
          .choices = {"auto", "int32", "int64"}};
}

TokenDtype dtype_of(const Args& a) {
  return *tokens::token_dtype_from_name(a.get<std::string>("dtype"));
}

}  // namespace

void register_token_types(Registry& r) {
  if (!r.claim_group("ferry.tokens")) return;
  r.add_dataset(
      {.name = "npy",
       .summary = "a NumPy .npy array (memory-mapped), sample i = array[i]",
       .keys = {{.name = "path", .required = true, .help = "the .npy file", .is_path = true},
                {.name = "field", .default_value = "data", .help = "the sample's field name"},
                dtype_key()},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<NpyDataset>(
            a.get<std::string>("path"),
            NpyDataset::Options{.field = a.get<std::string>("field"), .dtype = dtype_of(a)});
      });
  r.add_dataset(
      {.name = "indexed",
       .summary = "Megatron-LM's or fairseq's indexed dataset (PREFIX.idx + PREFIX.bin, "
                  "memory-mapped): sample i = sequence i in 'tokens' (variable length: use the "
                  "pad or pack collate)",
       .keys = {{.name = "prefix",
                 .required = true,
                 .help = "the path without .idx / .bin",
                 .is_path = true},
                dtype_key()},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<IndexedDataset>(a.get<std::string>("prefix"),
                                                IndexedDataset::Options{.dtype = dtype_of(a)});
      });
  r.add_dataset(
      {.name = "gpt",
       .summary = "Megatron-LM's GPTDataset: windows of seq_length + 1 tokens of an indexed "
                  "dataset in Megatron's order for the same seed, length, samples and split; "
                  "'tokens' and 'labels'",
       .keys = {{.name = "prefix",
                 .required = true,
                 .help = "the indexed dataset (path without .idx / .bin)",
                 .is_path = true},
                {.name = "seq_length",
                 .type = ValueType::kInt,
                 .required = true,
                 .help = "tokens per sample",
                 .min = 1},
                {.name = "num_samples",
                 .type = ValueType::kInt,
                 .help = "samples wanted (Megatron's train_samples); default: one epoch",
                 .min = 1},
                {.name = "seed",
                 .type = ValueType::kInt,
                 .default_value = 1234,
                 .help = "Megatron's --seed",
                 .min = 0,
                 .max = 4294967295.0},
                {.name = "split",
                 .default_value = "969,30,1",
                 .help = "Megatron's --split: the weights of train, valid and test"},
                {.name = "split_name",
                 .default_value = "train",
                 .help = "which split",
                 .choices = {"train", "valid", "test"}},
                {.name = "add_extra_token",
                 .type = ValueType::kBool,
                 .default_value = true,
                 .help = "windows of seq_length + 1 tokens, labels their last seq_length"},
                {.name = "labels",
                 .type = ValueType::kBool,
                 .default_value = true,
                 .help = "a 'labels' field: the tokens shifted by one"},
                {.name = "loss_mask",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "a float32 'loss_mask' field"},
                {.name = "position_ids",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "an int64 'position_ids' field"},
                {.name = "attention_mask",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "a bool [1, L, L] 'attention_mask' field (true: masked out)"},
                {.name = "eod_token",
                 .type = ValueType::kInt,
                 .help = "the end-of-document token, for the three options below"},
                {.name = "eod_mask_loss",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "no loss on end-of-document tokens"},
                {.name = "reset_position_ids",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "position ids restart after each end of document"},
                {.name = "reset_attention_mask",
                 .type = ValueType::kBool,
                 .default_value = false,
                 .help = "no attention across an end of document"},
                {.name = "pad_token",
                 .type = ValueType::kInt,
                 .default_value = 0,
                 .help = "the last label without add_extra_token"},
                dtype_key(),
                {.name = "cache",
                 .default_value = "",
                 .help = "a folder of index .npy files: read when there (Megatron's or "
                         "ferry's), else written",
                 .is_path = true},
                {.name = "cache_hash",
                 .default_value = "",
                 .help = "which files of the cache folder, when it holds several"}},
       .builtin = true},
      [](const Args& a) {
        GptDataset::Options o;
        o.seq_length = a.get<std::size_t>("seq_length");
        if (a.has("num_samples")) o.num_samples = a.get<std::size_t>("num_samples");
        o.seed = static_cast<std::uint32_t>(a.get<std::int64_t>("seed"));
        o.split = a.get<std::string>("split");
        o.split_name = a.get<std::string>("split_name");
        o.add_extra_token = a.get<bool>("add_extra_token");
        o.labels = a.get<bool>("labels");
        o.loss_mask = a.get<bool>("loss_mask");
        o.position_ids = a.get<bool>("position_ids");
        o.attention_mask = a.get<bool>("attention_mask");
        if (a.has("eod_token")) o.eod_token = a.get<std::int64_t>("eod_token");
        o.eod_mask_loss = a.get<bool>("eod_mask_loss");
        o.reset_position_ids = a.get<bool>("reset_position_ids");
        o.reset_attention_mask = a.get<bool>("reset_attention_mask");
        o.pad_token = a.get<std::int64_t>("pad_token");
        o.dtype = dtype_of(a);
        o.cache = a.get<std::string>("cache");
        o.cache_hash = a.get<std::string>("cache_hash");
        return std::make_shared<GptDataset>(a.get<std::string>("prefix"), std::move(o));
      });
  r.add_dataset(
      {.name = "token_windows",
       .summary = "nanoGPT's sampling: windows 'x' (block_size tokens) and 'y' (shifted by one) at "
                  "random offsets of one token file, each sample's offset seeded by (seed, "
                  "epoch, index)",
       .keys = {{.name = "path",
                 .required = true,
                 .help = "nanoGPT .bin, llm.c shard or 1-D .npy",
                 .is_path = true},
                {.name = "block_size",
                 .type = ValueType::kInt,
                 .required = true,
                 .help = "tokens per sample",
                 .min = 1},
                {.name = "epoch_length",
                 .type = ValueType::kInt,
                 .default_value = 0,
                 .help = "samples per epoch (0: the file's tokens / block_size)",
                 .min = 0},
                {.name = "format",
                 .default_value = "auto",
                 .help = "auto, bin (raw), llmc or npy",
                 .choices = {"auto", "bin", "llmc", "npy"}},
                {.name = "element",
                 .default_value = "uint16",
                 .help = "a raw .bin's tokens",
                 .choices = {"uint16", "uint32"}},
                dtype_key()},
       .builtin = true},
      [](const Args& a) {
        return std::make_shared<TokenWindows>(
            a.get<std::string>("path"),
            TokenWindows::Options{.block_size = a.get<std::size_t>("block_size"),
                                  .epoch_length = a.get<std::size_t>("epoch_length"),
                                  .format = a.get<std::string>("format"),
                                  .element = a.get<std::string>("element"),
                                  .dtype = dtype_of(a)});
      });
  r.add_collate(
      {.name = "pad",
       .summary = "variable-length 1-D fields padded on the right to the longest in the batch; "
                  "adds attention_mask and lengths",
       .keys =
           {{.name = "value", .type = ValueType::kInt, .default_value = 0, .help = "the padding"},
            {.name = "label_value",
             .type = ValueType::kInt,
             .default_value = -100,
             .help = "the padding of a field named labels"},
            {.name = "multiple_of",
             .type = ValueType::kInt,
             .default_value = 1,
             .help = "pad to a multiple of this",
             .min = 1},
            {.name = "field",
             .default_value = "tokens",
             .help = "whose lengths give attention_mask and lengths"}},
       .builtin = true},
      [](const Args& a) {
        return pad_collate({.value = a.get<std::int64_t>("value"),
                            .label_value = a.get<std::int64_t>("label_value"),
                            .multiple_of = a.get<std::size_t>("multiple_of"),
                            .field = a.get<std::string>("field")});
      });
  r.add_collate(
      {.name = "pack",
       .summary = "documents packed into rows of row_length, with position_ids, cu_seqlens and "
                  "max_seqlen for FlashAttention's variable-length kernels",
       .keys = {{.name = "row_length",
                 .type = ValueType::kInt,
                 .required = true,
                 .help = "tokens per row",
                 .min = 1},
                {.name = "value",
                 .type = ValueType::kInt,
                 .default_value = 0,
                 .help = "the padding after a row's last document"},
                {.name = "field", .default_value = "tokens", .help = "the field packed"}},
       .builtin = true},
      [](const Args& a) {
        return pack_collate({.row_length = a.get<std::size_t>("row_length"),
                             .value = a.get<std::int64_t>("value"),
                             .field = a.get<std::string>("field")});
      });
}

}  // namespace ferry
