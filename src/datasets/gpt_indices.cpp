#include "datasets/gpt_indices.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <set>

#include "ferry/error.h"

#include "core/hash.h"
#include "ipc/files.h"

namespace ferry::tokens {

namespace {

using detail::str;

// build_sample_idx of megatron/core/datasets/helpers.cpp, drop_last: for each window of
// seq_length + extra tokens, where it starts (position in the document index, token offset);
// consecutive windows share `extra` tokens.
template <class T>
std::vector<T> sample_index_of(const IndexedFile& file,
                               const std::vector<std::int32_t>& documents,
                               std::int64_t seq_length,
                               std::int64_t extra,
                               std::int64_t num_epochs,
                               std::int64_t tokens_per_epoch) {
  const std::int64_t samples = (num_epochs * tokens_per_epoch - extra) / seq_length;
  std::vector<T> out(2 * static_cast<std::size_t>(samples + 1));
  std::size_t position = 0;  // in the document index
  std::int64_t offset = 0;   // in that document
  out[0] = 0;
  out[1] = 0;
  for (std::int64_t s = 1; s <= samples; ++s) {
    std::int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const std::int64_t left = file.length(static_cast<std::size_t>(documents[position])) - offset;
      remaining -= left;
      if (remaining <= 0) {
        offset += remaining + left - extra;
        remaining = 0;
      } else {
        // drop_last: the windows were counted to end inside the last document.
        FERRY_ASSERT(position + 1 < documents.size(), "GPT sample index ran past the documents");
        ++position;
        offset = 0;
      }
    }
    out[2 * static_cast<std::size_t>(s)] = static_cast<T>(position);
    out[2 * static_cast<std::size_t>(s) + 1] = static_cast<T>(offset);
  }
  return out;
}

template <class T>
std::vector<T> shuffle_index_of(NumpyRandomState& random, std::size_t first, std::size_t total) {
  std::vector<T> out(total);
  std::iota(out.begin(), out.end(), T{0});
  random.shuffle(out.data(), first);
  if (first != total) random.shuffle(out.data() + first, total - first);
  return out;
}

std::string index_file(const std::string& hash, int split_index, const char* kind) {
  return str(hash, "-GPTDataset-", split_name(split_index), "-", kind, "_index.npy");
}

std::string description_file(const std::string& hash, int split_index) {
  return str(hash, "-GPTDataset-", split_name(split_index), "-description.txt");
}

// What Megatron-LM writes beside its cached indices (megatron_dataset.py's unique_description:
// a JSON object), for the keys that decide the indices.
nlohmann::json description_of(const std::string& prefix, const GptSpec& spec) {
  nlohmann::json d;
  d["class"] = "GPTDataset";
  d["dataset_path"] = prefix;
  d["index_split"] = split_name(spec.split_index);
  d["split"] = spec.split;
  d["num_samples"] = spec.num_samples ? nlohmann::json(*spec.num_samples) : nlohmann::json();
  d["random_seed"] = spec.seed;
  d["sequence_length"] = spec.seq_length;
  d["add_extra_token_to_sequence"] = spec.add_extra_token;
  if (!spec.files.empty()) d["ferry_files"] = spec.files;  // not Megatron's: ferry's own sets
  return d;
}

// Why the description beside a set of cached indices says they were built for something else,
// or empty (no description, or nothing in it contradicts `spec`).
std::string contradiction(const std::filesystem::path& file,
                          const std::string& prefix,
                          const GptSpec& spec) {
  std::error_code error;
  if (!std::filesystem::exists(file, error)) return "";
  nlohmann::json d;
  try {
    d = nlohmann::json::parse(ipc::read_file(file, "gpt cache:"));
  } catch (const std::exception& e) {
    return str(file.string(), " is not a JSON description (", e.what(), ")");
  }
  if (!d.is_object()) return str(file.string(), " is not a JSON object");
  const nlohmann::json mine = description_of(prefix, spec);
  for (const char* key : {"index_split", "split", "num_samples", "random_seed", "sequence_length",
                          "add_extra_token_to_sequence", "ferry_files"}) {
    if (d.contains(key) && d[key] != mine[key]) {
      return str(key, " is ", d[key].dump(), " there, ", mine[key].dump(), " here");
    }
  }
  // Paths differ between machines: the file's name must match.
  if (d.contains("dataset_path") && d["dataset_path"].is_string() &&
      std::filesystem::path(d["dataset_path"].get<std::string>()).filename() !=
          std::filesystem::path(prefix).filename()) {
    return str("dataset_path is ", d["dataset_path"].dump(), " there, ", prefix, " here");
  }
  return "";
}

}  // namespace

std::string files_digest(const IndexedFile& file) {
  // FNV-1a over the lengths, a length at a time (a byte at a time is 8x the work, for nothing).
  std::uint64_t h = detail::kFnvOffset;
  for (std::size_t s = 0; s < file.sequences(); ++s) {
    h = (h ^ static_cast<std::uint64_t>(file.length(s))) * detail::kFnvPrime;
  }
  return str(file.sequences(), ":", file.bin() ? file.bin()->size() : 0, ":", h);
}

std::uint64_t NumpyRandomState::interval(std::uint64_t max) {
  if (max == 0) return 0;
  std::uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  std::uint64_t value = 0;
  if (max <= 0xffffffffULL) {
    while ((value = (engine_() & mask)) > max) {
    }
  } else {
    // numpy's next64: the high word drawn first.
    auto next64 = [&] {
      const std::uint64_t high = engine_();
      return (high << 32) | engine_();
    };
    while ((value = (next64() & mask)) > max) {
    }
  }
  return value;
}

IntArray IntArray::of(NpyArray array) {
  FERRY_CHECK(is_integer(array.element()), array.path(), ": an index array holds integers, not ",
              element_name(array.element()));
  FERRY_CHECK(reinterpret_cast<std::uintptr_t>(array.data()) % element_size(array.element()) == 0,
              array.path(), ": its data starts at an offset not aligned for ",
              element_name(array.element()), " (a header length NumPy would not write)");
  IntArray a;
  a.data_ = array.data();
  a.size_ = array.count();
  a.element_ = array.element();
  a.keep_ = array.file();
  return a;
}

std::int64_t IntArray::operator[](std::size_t i) const noexcept {
  switch (element_) {
    case Element::kInt32:
      return static_cast<const std::int32_t*>(data_)[i];
    case Element::kUInt32:
      return static_cast<const std::uint32_t*>(data_)[i];
    case Element::kInt16:
      return static_cast<const std::int16_t*>(data_)[i];
    case Element::kUInt16:
      return static_cast<const std::uint16_t*>(data_)[i];
    case Element::kUInt64:
      return static_cast<std::int64_t>(static_cast<const std::uint64_t*>(data_)[i]);
    case Element::kInt8:
      return static_cast<const std::int8_t*>(data_)[i];
    case Element::kUInt8:
      return static_cast<const std::uint8_t*>(data_)[i];
    default:
      return static_cast<const std::int64_t*>(data_)[i];
  }
}

const char* split_name(int split_index) {
  static constexpr const char* kNames[] = {"train", "valid", "test"};
  return split_index >= 0 && split_index < 3 ? kNames[split_index] : "train";
}

std::pair<std::size_t, std::size_t> split_range(const std::string& split,
                                                int split_index,
                                                std::size_t sequences) {
  // megatron/core/datasets/utils.py and blended_megatron_dataset_config.py: the numbers of the
  // string as floats, normalised by their sum, then cumulative bounds.
  std::vector<double> weights;
  const std::regex number("[.0-9]+");
  for (auto it = std::sregex_iterator(split.begin(), split.end(), number);
       it != std::sregex_iterator(); ++it) {
    // As Python's float() of the match: the whole of it, whatever the locale.
    const std::string text = it->str();
    double w = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), w);
    if (error != std::errc() || end != text.data() + text.size()) {
      throw ConfigError(str("split='", split, "': '", text,
                            "' is not a number; write the weights as 969,30,1 or 0.9,0.05,0.05"));
    }
    weights.push_back(w);
  }
  FERRY_CHECK(!weights.empty() && weights.size() <= 3, "split='", split,
              "': expected up to three weights for train, valid and test, such as 969,30,1");
  weights.resize(3, 0.0);
  double sum = 0;
  for (const double w : weights) sum += w;
  FERRY_CHECK(sum > 0, "split='", split, "': the weights add up to 0");
  FERRY_CHECK(split_index >= 0 && split_index < 3, "split index ", split_index,
              " is not 0 (train), 1 (valid) or 2 (test)");
  for (double& w : weights) w /= sum;
  double low = 0;
  for (int i = 0; i < split_index; ++i) low += weights[static_cast<std::size_t>(i)];
  const double high = low + weights[static_cast<std::size_t>(split_index)];
  const double n = static_cast<double>(sequences);
  // Python's round(): halves to even, as nearbyint in the default rounding mode.
  const auto begin = split_index == 0 ? 0 : static_cast<std::size_t>(std::nearbyint(low * n));
  const auto end = static_cast<std::size_t>(std::nearbyint(high * n));
  return {begin, std::min(end, sequences)};
}

GptIndices build_gpt_indices(const IndexedFile& file, const GptSpec& spec) {
  FERRY_CHECK(spec.seq_length > 0, "gpt: seq_length must be positive");
  const auto [begin, end] = split_range(spec.split, spec.split_index, file.sequences());
  FERRY_CHECK(end > begin, "gpt: split '", spec.split, "' gives the ", split_name(spec.split_index),
              " split no sequence of ", file.prefix(), "'s ", file.sequences());
  FERRY_CHECK(end <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
              "gpt: more sequences than Megatron's int32 document index holds");
  std::vector<std::int32_t> split_documents(end - begin);
  std::iota(split_documents.begin(), split_documents.end(), static_cast<std::int32_t>(begin));
  std::int64_t tokens_per_epoch = 0;
  for (const std::int32_t d : split_documents) {
    tokens_per_epoch += file.length(static_cast<std::size_t>(d));
  }
  const auto L = static_cast<std::int64_t>(spec.seq_length);
  const std::int64_t X = spec.add_extra_token ? 1 : 0;
  FERRY_CHECK(tokens_per_epoch >= L + X, "gpt: the ", split_name(spec.split_index), " split of ",
              file.prefix(), " holds ", tokens_per_epoch, " tokens, fewer than one window of ",
              L + X);
  // The epochs needed for num_samples windows, and whether the last one is shuffled apart (it is
  // when less than 80% of it is used).
  std::int64_t epochs = 1;
  if (spec.num_samples) {
    FERRY_CHECK(*spec.num_samples <=
                    static_cast<std::size_t>((std::numeric_limits<std::int64_t>::max() - X) / L),
                "gpt: num_samples=", *spec.num_samples, " windows of ", L,
                " tokens are more tokens than an int64 counts");
    const auto wanted = static_cast<std::int64_t>(*spec.num_samples) * L + X;
    for (std::int64_t tokens = tokens_per_epoch; tokens < wanted; tokens += tokens_per_epoch) {
      ++epochs;
    }
  }
  bool separate = false;
  std::int64_t before_last = 0;  // samples that end before the last epoch
  if (epochs > 1) {
    before_last = ((epochs - 1) * tokens_per_epoch - X) / L;
    const std::int64_t from_last = static_cast<std::int64_t>(*spec.num_samples) - before_last;
    const std::int64_t per_epoch = (tokens_per_epoch - X) / L;
    FERRY_ASSERT(from_last >= 0 && from_last <= per_epoch + 1, "gpt: epochs miscounted");
    separate = from_last < static_cast<std::int64_t>(0.80 * static_cast<double>(per_epoch));
  }

  NumpyRandomState random(spec.seed);
  std::vector<std::int32_t> documents;
  documents.reserve(split_documents.size() * static_cast<std::size_t>(epochs));
  auto repeat_and_shuffle = [&](std::int64_t times) {
    const std::size_t from = documents.size();
    for (std::int64_t e = 0; e < times; ++e) {
      documents.insert(documents.end(), split_documents.begin(), split_documents.end());
    }
    random.shuffle(documents.data() + from, documents.size() - from);
  };
  if (!separate) {
    repeat_and_shuffle(epochs);
  } else {
    repeat_and_shuffle(epochs - 1);
    repeat_and_shuffle(1);
  }

  GptIndices out;
  out.num_epochs = static_cast<std::size_t>(epochs);
  out.separate_final_epoch = separate;
  std::int64_t longest = 0;
  for (const std::int32_t d : split_documents) {
    longest = std::max(longest, file.length(static_cast<std::size_t>(d)));
  }
  const bool wide = std::max<std::int64_t>(static_cast<std::int64_t>(documents.size()), longest) >
                    std::numeric_limits<std::int32_t>::max();
  std::size_t samples = 0;
  if (wide) {
    auto index = sample_index_of<std::int64_t>(file, documents, L, X, epochs, tokens_per_epoch);
    samples = index.size() / 2 - 1;
    out.sample_index = IntArray::owning(std::move(index));
  } else {
    auto index = sample_index_of<std::int32_t>(file, documents, L, X, epochs, tokens_per_epoch);
    samples = index.size() / 2 - 1;
    out.sample_index = IntArray::owning(std::move(index));
  }
  const std::size_t first = separate ? static_cast<std::size_t>(before_last) : samples;
  if (samples >= 0xffffffffULL - 1) {
    out.shuffle_index = IntArray::owning(shuffle_index_of<std::int64_t>(random, first, samples));
  } else {
    out.shuffle_index = IntArray::owning(shuffle_index_of<std::uint32_t>(random, first, samples));
  }
  out.document_index = IntArray::owning(std::move(documents));
  return out;
}

std::optional<GptIndices> read_gpt_indices(const std::filesystem::path& folder,
                                           const std::string& hash,
                                           const IndexedFile& file,
                                           const GptSpec& spec) {
  std::error_code error;
  const auto entries = ipc::list_directory(folder, error);
  if (error) return std::nullopt;                      // no cache yet
  std::map<std::string, std::set<std::string>> found;  // hash -> kinds present
  const std::string marker = str("-GPTDataset-", split_name(spec.split_index), "-");
  for (const auto& entry : entries) {
    const std::size_t at = entry.name.find(marker);
    if (at == std::string::npos || entry.name.size() < 10 ||
        entry.name.compare(entry.name.size() - 10, 10, "_index.npy") != 0) {
      continue;
    }
    found[entry.name.substr(0, at)].insert(
        entry.name.substr(at + marker.size(), entry.name.size() - 10 - at - marker.size()));
  }
  // Complete sets whose description (where there is one) does not contradict this dataset.
  std::vector<std::string> candidates;
  std::vector<std::string> refused;
  for (const auto& [h, kinds] : found) {
    if (!(kinds.count("document") && kinds.count("sample") && kinds.count("shuffle"))) continue;
    const std::string why =
        contradiction(folder / description_file(h, spec.split_index), file.prefix(), spec);
    if (why.empty()) {
      candidates.push_back(h);
    } else {
      refused.push_back(str(h, " (", why, ")"));
    }
  }
  for (const std::string& r : refused) {
    if (r.rfind(hash + " (", 0) == 0) {  // the set asked for (or ferry's own) does not fit
      throw ConfigError(str("gpt: the cached indices ", r, " in ", folder.string(),
                            " are not this dataset's; remove them, or give another cache"));
    }
  }
  std::string chosen;
  if (std::find(candidates.begin(), candidates.end(), hash) != candidates.end()) {
    chosen = hash;  // ferry's own, or the one asked for
  } else if (candidates.size() == 1 && candidates.front().rfind("ferry", 0) != 0) {
    chosen = candidates.front();  // Megatron's (ferry's own of another configuration are not)
  } else if (candidates.size() > 1) {
    throw ConfigError(str("gpt: ", folder.string(), " holds the indices of ", candidates.size(),
                          " datasets that may be this one (", detail::join(candidates),
                          "); give one with cache_hash, or a folder of its own"));
  } else {
    return std::nullopt;  // built here, and written under this dataset's own hash
  }
  GptIndices out;
  const NpyArray documents =
      NpyArray::open(folder / index_file(chosen, spec.split_index, "document"));
  const NpyArray samples = NpyArray::open(folder / index_file(chosen, spec.split_index, "sample"));
  const NpyArray shuffle = NpyArray::open(folder / index_file(chosen, spec.split_index, "shuffle"));
  if (samples.shape().size() != 2 || samples.shape()[1] != 2 || samples.shape()[0] < 1) {
    throw DataError(str(samples.path(), ": a sample index has shape (samples + 1, 2), not ",
                        samples.shape().size(), " dimensions"));
  }
  if (shuffle.shape().size() != 1 ||
      shuffle.count() != static_cast<std::size_t>(samples.shape()[0] - 1)) {
    throw DataError(str(shuffle.path(), ": the shuffle index must hold one entry per sample (",
                        samples.shape()[0] - 1, "), not ", shuffle.count()));
  }
  if (documents.shape().size() != 1) {
    throw DataError(str(documents.path(), ": the document index must be 1-D"));
  }
  out.document_index = IntArray::of(documents);
  out.sample_index = IntArray::of(samples);
  out.shuffle_index = IntArray::of(shuffle);
  if (spec.num_samples && out.samples() < *spec.num_samples) {
    throw DataError(str(shuffle.path(), ": the cached indices hold ", out.samples(),
                        " samples, fewer than num_samples=", *spec.num_samples,
                        "; they belong to another configuration"));
  }
  // The indices must fit the .idx as it is now: the document index repeats the split's sequences
  // a whole number of times, and the samples are the windows those epochs' tokens make. A cache
  // of the same name built from other files (another tokenizer's) fails here, at open, rather
  // than serving its windows from these files.
  const auto [begin, end] = split_range(spec.split, spec.split_index, file.sequences());
  const std::size_t split_sequences = end > begin ? end - begin : 0;
  std::int64_t tokens_per_epoch = 0;
  for (std::size_t d = begin; d < end; ++d) tokens_per_epoch += file.length(d);
  const auto L = static_cast<std::int64_t>(spec.seq_length);
  const std::int64_t X = spec.add_extra_token ? 1 : 0;
  std::int64_t windows = -1;
  std::int64_t epoch_tokens = 0;
  const bool whole_epochs = split_sequences > 0 && out.document_index.size() % split_sequences == 0;
  const auto epochs =
      static_cast<std::int64_t>(whole_epochs ? out.document_index.size() / split_sequences : 0);
  if (whole_epochs && !__builtin_mul_overflow(epochs, tokens_per_epoch, &epoch_tokens)) {
    windows = (epoch_tokens - X) / L;
  }
  // Megatron adds one partial window to a validation or test split when it keeps the last
  // partial sequence (drop_last_partial_validation_sequence = false).
  const auto samples_now = static_cast<std::int64_t>(out.samples());
  if (windows < 0 || (samples_now != windows && samples_now != windows + 1)) {
    throw DataError(
        str(folder.string(), ": the cached ", split_name(spec.split_index), " indices of ", chosen,
            " (", out.document_index.size(), " document entries, ", samples_now,
            " samples) do not fit ", file.prefix(), " as it is now (", split_sequences,
            " sequences and ", tokens_per_epoch, " tokens in the split, ", windows, " windows of ",
            L + X, " tokens in ", epochs,
            " epochs): they were built from other files; remove them or give another cache"));
  }
  return out;
}

void write_gpt_indices(const std::filesystem::path& folder,
                       const std::string& hash,
                       const std::string& prefix,
                       const GptSpec& spec,
                       const GptIndices& indices) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) {
    throw Error(str("gpt: cannot create the index cache ", folder.string(), ": ", error.message()));
  }
  auto write = [&](const IntArray& a, const char* kind, std::vector<std::int64_t> shape) {
    write_npy(folder / index_file(hash, spec.split_index, kind), a.element(), shape, a.data());
  };
  write(indices.document_index, "document",
        {static_cast<std::int64_t>(indices.document_index.size())});
  write(indices.sample_index, "sample",
        {static_cast<std::int64_t>(indices.sample_index.size() / 2), 2});
  write(indices.shuffle_index, "shuffle",
        {static_cast<std::int64_t>(indices.shuffle_index.size())});
  ipc::write_file_atomically(folder / description_file(hash, spec.split_index),
                             description_of(prefix, spec).dump(4), "gpt cache:");
}

}  // namespace ferry::tokens
