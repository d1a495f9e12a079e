// pad_collate and pack_collate (ferry/tokens.h): batches of variable-length token sequences.

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "ferry/collate.h"
#include "ferry/error.h"
#include "ferry/tokens.h"

namespace ferry {

namespace {

using detail::str;

const torch::Tensor* tensor_field(const Example& sample, const std::string& name) {
  const Field* f = sample.find(name);
  return f != nullptr && f->is_tensor() ? &f->tensor() : nullptr;
}

// The samples without `names`, for default collation of the rest.
std::vector<Example> without(const std::vector<Example>& samples,
                             const std::set<std::string>& names) {
  std::vector<Example> rest;
  rest.reserve(samples.size());
  for (const Example& s : samples) {
    Example e;
    for (const auto& [name, field] : s) {
      if (!names.count(name)) e.set(name, field);
    }
    e.set_index(s.index());
    rest.push_back(std::move(e));
  }
  return rest;
}

}  // namespace

CollateFn pad_collate(PadOptions options) {
  FERRY_CHECK(options.multiple_of >= 1, "pad: multiple_of must be at least 1");
  return [options](std::vector<Example> samples) -> Batch {
    if (samples.empty()) return default_collate(std::move(samples));
    // The 1-D tensor fields whose lengths differ in this batch, and `field` whatever they are.
    std::set<std::string> padded;
    for (const auto& [name, field] : samples.front()) {
      if (!field.is_tensor() || field.tensor().dim() != 1) continue;
      bool differ = name == options.field;
      for (const Example& s : samples) {
        const torch::Tensor* t = tensor_field(s, name);
        if (t == nullptr || t->dim() != 1) {
          throw CollateError(str("pad: field '", name, "' is 1-D in dataset index ",
                                 samples.front().index(), " but not in dataset index ", s.index()));
        }
        differ = differ || t->size(0) != field.tensor().size(0);
      }
      if (differ) padded.insert(name);
    }
    Batch batch = default_collate(without(samples, padded));
    const auto rows = static_cast<std::int64_t>(samples.size());
    for (const std::string& name : padded) {
      std::int64_t longest = 0;
      for (const Example& s : samples) longest = std::max(longest, tensor_field(s, name)->size(0));
      const auto multiple = static_cast<std::int64_t>(options.multiple_of);
      const std::int64_t width = (longest + multiple - 1) / multiple * multiple;
      const torch::Tensor& first = *tensor_field(samples.front(), name);
      torch::Tensor out = torch::full(
          {rows, width}, name == "labels" ? options.label_value : options.value, first.options());
      for (std::int64_t i = 0; i < rows; ++i) {
        const torch::Tensor& t = *tensor_field(samples[static_cast<std::size_t>(i)], name);
        if (t.scalar_type() != first.scalar_type()) {
          throw CollateError(str("pad: field '", name, "' is ", first.scalar_type(),
                                 " in dataset index ", samples.front().index(), " but ",
                                 t.scalar_type(), " in dataset index ",
                                 samples[static_cast<std::size_t>(i)].index()));
        }
        out[i].narrow(0, 0, t.size(0)).copy_(t);
      }
      batch.set(name, out);
      if (name == options.field) {
        torch::Tensor lengths = torch::empty({rows}, torch::kInt64);
        for (std::int64_t i = 0; i < rows; ++i) {
          lengths[i] = tensor_field(samples[static_cast<std::size_t>(i)], name)->size(0);
        }
        batch.set("lengths", lengths);
        batch.set("attention_mask",
                  torch::arange(width, torch::kInt64).unsqueeze(0) < lengths.unsqueeze(1));
      }
    }
    return batch;
  };
}

CollateFn pack_collate(PackOptions options) {
  FERRY_CHECK(options.row_length >= 1, "pack: row_length must be at least 1");
  return [options](std::vector<Example> samples) -> Batch {
    const auto width = static_cast<std::int64_t>(options.row_length);
    struct Piece {
      std::size_t sample;
      std::int64_t from, count;  // in the sample's tensor
      std::int64_t row, at;      // where it goes
    };
    std::vector<Piece> pieces;
    std::int64_t row = 0;
    std::int64_t used = 0;  // in the current row
    c10::optional<torch::ScalarType> dtype;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const torch::Tensor* t = tensor_field(samples[i], options.field);
      if (t == nullptr || t->dim() != 1) {
        throw CollateError(str("pack: dataset index ", samples[i].index(), " has no 1-D field '",
                               options.field, "' to pack"));
      }
      if (!dtype) dtype = t->scalar_type();
      if (t->scalar_type() != *dtype) {
        throw CollateError(str("pack: field '", options.field, "' is ", *dtype,
                               " in dataset index ", samples.front().index(), " but ",
                               t->scalar_type(), " in dataset index ", samples[i].index()));
      }
      const std::int64_t n = t->size(0);
      if (n == 0) continue;
      // A document that does not fit in what is left of the row starts the next one; one
      // longer than a row is cut into rows of its own, its remainder opening a row others share.
      if (used > 0 && (n > width || used + n > width)) {
        ++row;
        used = 0;
      }
      for (std::int64_t from = 0; from < n;) {
        const std::int64_t count = std::min(n - from, width - used);
        pieces.push_back({i, from, count, row, used});
        from += count;
        used += count;
        if (used == width && from < n) {
          ++row;
          used = 0;
        }
      }
    }
    const std::int64_t rows = pieces.empty() ? 0 : row + 1;
    torch::Tensor packed = torch::full({rows, width}, options.value,
                                       torch::TensorOptions().dtype(dtype.value_or(torch::kInt64)));
    torch::Tensor positions = torch::zeros({rows, width}, torch::kInt64);
    torch::Tensor documents = torch::full({rows, width}, -1, torch::kInt32);
    // cu_seqlens is int32, as FlashAttention takes it.
    FERRY_CHECK(rows * width <= std::numeric_limits<std::int32_t>::max(), "pack: ", rows,
                " rows of ", width,
                " tokens are more positions than int32 cu_seqlens can hold; "
                "use smaller batches or rows");
    std::vector<std::int32_t> starts;
    std::int64_t longest = 0;
    auto* position = positions.data_ptr<std::int64_t>();
    auto* document = documents.data_ptr<std::int32_t>();
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      const torch::Tensor& t = *tensor_field(samples[p.sample], options.field);
      packed[p.row].narrow(0, p.at, p.count).copy_(t.narrow(0, p.from, p.count));
      const std::int64_t base = p.row * width + p.at;
      for (std::int64_t j = 0; j < p.count; ++j) {
        position[base + j] = j;
        document[base + j] = static_cast<std::int32_t>(p.sample);
      }
      starts.push_back(static_cast<std::int32_t>(base));
      longest = std::max(longest, p.count);
      // The row's padding after its last piece: a sequence of its own.
      const bool last_in_row = k + 1 == pieces.size() || pieces[k + 1].row != p.row;
      if (last_in_row && p.at + p.count < width) {
        starts.push_back(static_cast<std::int32_t>(base + p.count));
        longest = std::max(longest, width - p.at - p.count);
      }
    }
    starts.push_back(static_cast<std::int32_t>(rows * width));
    Batch batch(samples.size());
    batch.set(options.field, packed);
    batch.set("position_ids", positions);
    batch.set("document_ids", documents);
    batch.set(
        "cu_seqlens",
        torch::from_blob(starts.data(), {static_cast<std::int64_t>(starts.size())}, torch::kInt32)
            .clone());
    batch.set("max_seqlen", torch::scalar_tensor(longest, torch::kInt64));
    std::vector<std::int64_t> indices;
    indices.reserve(samples.size());
    for (const Example& s : samples) indices.push_back(s.index());
    batch.set_indices(std::move(indices));
    return batch;
  };
}

}  // namespace ferry
