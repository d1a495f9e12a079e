#include "collate/batch_layout.h"

#include <cstring>

#include "ferry/error.h"

namespace ferry::collate {

namespace {

std::string shape_str(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(sizes[i]);
  }
  return out + "]";
}

const char* kind_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::kTensor:
      return "tensor";
    case FieldKind::kInt:
      return "int";
    case FieldKind::kDouble:
      return "double";
    case FieldKind::kString:
      return "string";
  }
  return "?";
}

FieldKind kind_of(const Field& field) {
  if (field.is_tensor()) return FieldKind::kTensor;
  if (field.is_int()) return FieldKind::kInt;
  if (field.is_double()) return FieldKind::kDouble;
  return FieldKind::kString;
}

std::size_t align_up(std::size_t n) {
  return (n + kFieldAlignment - 1) / kFieldAlignment * kFieldAlignment;
}

// Places the fields of `layout` one after another in one block, each at an aligned offset, in
// their order (strings take no room), and sets the block's size: the one home of the layout
// rule that workers, the main process and a user's collate_fn all rely on.
void place_fields(BatchLayout& layout) {
  std::size_t offset = 0;
  for (FieldLayout& f : layout.fields) {
    if (f.kind == FieldKind::kString) continue;
    offset = align_up(offset);
    f.offset = offset;
    offset += f.nbytes;
  }
  layout.total_bytes = align_up(offset);
}

std::string describe(const at::Tensor& t) {
  return detail::str(shape_str(t.sizes()), " ", c10::toString(t.scalar_type()));
}

}  // namespace

BatchLayout plan_batch(const std::vector<Example>& samples) {
  if (samples.empty()) throw CollateError("collate: a batch needs at least one sample");
  const Example& first = samples.front();
  BatchLayout layout;
  layout.num_samples = samples.size();
  const auto batch = static_cast<std::int64_t>(samples.size());
  for (const auto& [name, field] : first) {
    FieldLayout f;
    f.name = name;
    f.kind = kind_of(field);
    if (f.kind == FieldKind::kTensor) {
      const at::Tensor& t = field.tensor();
      if (!t.defined()) {
        throw CollateError(detail::str("collate: field '", name, "' of sample ", first.index(),
                                       " is an undefined tensor"));
      }
      f.dtype = t.scalar_type();
      f.sizes.push_back(batch);
      f.sizes.insert(f.sizes.end(), t.sizes().begin(), t.sizes().end());
      f.sample_bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    } else if (f.kind == FieldKind::kInt || f.kind == FieldKind::kDouble) {
      f.dtype = f.kind == FieldKind::kInt ? c10::ScalarType::Long : c10::ScalarType::Double;
      f.sizes = {batch};
      f.sample_bytes = 8;
    }
    f.nbytes = f.sample_bytes * samples.size();
    layout.fields.push_back(std::move(f));
  }
  place_fields(layout);

  // Every other sample must have the same fields, kinds, dtypes and shapes as the first.
  for (std::size_t i = 1; i < samples.size(); ++i) {
    const Example& s = samples[i];
    if (s.size() != first.size()) {
      for (const auto& [name, field] : s) {
        if (!first.contains(name)) {
          throw CollateError(detail::str("collate: field '", name, "' is in sample ", s.index(),
                                         " but not in sample ", first.index(),
                                         "; every sample of a batch needs the same fields"));
        }
      }
    }
    for (const FieldLayout& f : layout.fields) {
      const Field* field = s.find(f.name);
      if (field == nullptr) {
        throw CollateError(detail::str("collate: field '", f.name, "' is in sample ", first.index(),
                                       " but missing from sample ", s.index(), " (its fields: ",
                                       s.field_names(), "); every sample needs the same fields"));
      }
      if (kind_of(*field) != f.kind) {
        throw CollateError(detail::str("collate: field '", f.name, "' is a ", kind_name(f.kind),
                                       " in sample ", first.index(), " but a ",
                                       kind_name(kind_of(*field)), " in sample ", s.index()));
      }
      if (f.kind != FieldKind::kTensor) continue;
      const at::Tensor& t = field->tensor();
      const at::Tensor& t0 = first[f.name].tensor();
      if (!t.defined() || t.scalar_type() != f.dtype ||
          !std::equal(t.sizes().begin(), t.sizes().end(), f.sizes.begin() + 1, f.sizes.end()) ||
          t.dim() + 1 != static_cast<std::int64_t>(f.sizes.size())) {
        throw CollateError(detail::str(
            "collate: field '", f.name, "' has ", t.defined() ? describe(t) : "an undefined tensor",
            " in sample ", s.index(), " but ", describe(t0), " in sample ", first.index(),
            "; tensors of one batch must share shape and dtype: resize or cast them in the "
            "dataset, or pass a collate_fn that pads"));
      }
    }
  }
  return layout;
}

void write_batch(const std::vector<Example>& samples, const BatchLayout& layout, std::byte* base) {
  for (const FieldLayout& f : layout.fields) {
    std::byte* dst = base + f.offset;
    for (std::size_t i = 0; i < samples.size(); ++i, dst += f.sample_bytes) {
      const Field& field = samples[i][f.name];
      switch (f.kind) {
        case FieldKind::kTensor: {
          const at::Tensor& t = field.tensor();
          if (t.device().is_cpu() && t.is_contiguous()) {
            if (f.sample_bytes > 0 && t.data_ptr() != dst) {  // else: already in place
              std::memcpy(dst, t.data_ptr(), f.sample_bytes);
            }
          } else {
            // Strided or non-CPU sample: let ATen copy it into place, still exactly once.
            at::from_blob(dst, t.sizes(), at::TensorOptions().dtype(f.dtype)).copy_(t);
          }
          break;
        }
        case FieldKind::kInt: {
          const std::int64_t v = field.to_int();
          std::memcpy(dst, &v, sizeof v);
          break;
        }
        case FieldKind::kDouble: {
          const double v = field.to_double();
          std::memcpy(dst, &v, sizeof v);
          break;
        }
        case FieldKind::kString:
          break;
      }
    }
  }
}

BatchLayout resize_layout(const BatchLayout& layout, std::size_t num_samples) {
  BatchLayout out;
  out.num_samples = num_samples;
  for (FieldLayout f : layout.fields) {
    if (f.kind != FieldKind::kString) {
      f.sizes.front() = static_cast<std::int64_t>(num_samples);
      f.nbytes = f.sample_bytes * num_samples;
    }
    out.fields.push_back(std::move(f));
  }
  place_fields(out);
  return out;
}

bool same_layout(const BatchLayout& a, const BatchLayout& b) noexcept {
  if (a.num_samples != b.num_samples || a.total_bytes != b.total_bytes ||
      a.fields.size() != b.fields.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.fields.size(); ++i) {
    const FieldLayout& x = a.fields[i];
    const FieldLayout& y = b.fields[i];
    if (x.name != y.name || x.kind != y.kind || x.dtype != y.dtype || x.sizes != y.sizes ||
        x.offset != y.offset || x.sample_bytes != y.sample_bytes) {
      return false;
    }
  }
  return true;
}

void* ExpectedBatch::find(std::size_t position,
                          std::string_view field,
                          c10::IntArrayRef sizes,
                          c10::ScalarType dtype) const noexcept {
  if (position >= layout_.num_samples) return nullptr;
  for (const FieldLayout& f : layout_.fields) {
    if (f.name != field) continue;
    if (f.kind != FieldKind::kTensor || f.dtype != dtype || f.sample_bytes == 0 ||
        f.sizes.size() != sizes.size() + 1 ||
        !std::equal(sizes.begin(), sizes.end(), f.sizes.begin() + 1)) {
      return nullptr;
    }
    handed_out_.store(true, std::memory_order_relaxed);
    return base_ + f.offset + position * f.sample_bytes;
  }
  return nullptr;
}

bool ExpectedBatch::can_write(const std::vector<Example>& samples,
                              const BatchLayout& actual) const {
  const bool expected_shape = same_layout(actual, layout_);
  const auto* lo = reinterpret_cast<const std::byte*>(base_);
  const auto* hi = lo + size_;
  bool any_inside = false;
  for (const FieldLayout& f : actual.fields) {
    if (f.kind != FieldKind::kTensor) continue;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const at::Tensor& t = samples[i][f.name].tensor();
      if (!t.has_storage()) continue;
      const auto* start = static_cast<const std::byte*>(t.storage().data());
      const auto* end = start + t.storage().nbytes();
      if (end <= lo || start >= hi) continue;  // elsewhere: only read
      any_inside = true;
      const std::byte* place = base_ + f.offset + i * f.sample_bytes;
      if (!expected_shape || !t.is_contiguous() || t.data_ptr() != place || start < place ||
          end > place + f.sample_bytes) {
        return false;
      }
    }
  }
  return any_inside ? expected_shape : actual.total_bytes <= size_;
}

BatchLayout plan_batch(const Batch& batch) {
  BatchLayout layout;
  layout.num_samples = batch.size();
  for (const std::string& name : batch) {
    FieldLayout f;
    f.name = name;
    if (batch.is_tensor(name)) {
      const at::Tensor& t = batch[name];
      if (!t.defined()) {
        throw CollateError(
            detail::str("collate_fn returned an undefined tensor for field '", name, "'"));
      }
      f.kind = FieldKind::kTensor;
      f.dtype = t.scalar_type();
      f.sizes.assign(t.sizes().begin(), t.sizes().end());
      f.nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    } else {
      f.kind = FieldKind::kString;
    }
    layout.fields.push_back(std::move(f));
  }
  place_fields(layout);
  return layout;
}

void write_batch(const Batch& batch, const BatchLayout& layout, std::byte* base) {
  for (const FieldLayout& f : layout.fields) {
    if (f.kind != FieldKind::kTensor) continue;
    const at::Tensor& t = batch[f.name];
    if (t.device().is_cpu() && t.is_contiguous()) {
      if (f.nbytes > 0) std::memcpy(base + f.offset, t.data_ptr(), f.nbytes);
    } else {
      at::from_blob(base + f.offset, t.sizes(), at::TensorOptions().dtype(f.dtype)).copy_(t);
    }
  }
}

Batch view_batch(const BatchLayout& layout,
                 std::byte* base,
                 const std::shared_ptr<void>& owner,
                 const std::vector<Example>& samples) {
  Batch batch(layout.num_samples);
  std::vector<std::int64_t> indices;
  indices.reserve(samples.size());
  for (const Example& s : samples) indices.push_back(s.index());
  batch.set_indices(std::move(indices));
  for (const FieldLayout& f : layout.fields) {
    if (f.kind == FieldKind::kString) {
      std::vector<std::string> strings;
      strings.reserve(samples.size());
      for (const Example& s : samples) strings.push_back(s[f.name].str());
      batch.set(f.name, std::move(strings));
      continue;
    }
    // Each field holds a reference to the whole block: the block is freed with its last view.
    batch.set(f.name,
              at::from_blob(
                  base + f.offset, f.sizes, [owner](void*) {}, at::TensorOptions().dtype(f.dtype)));
  }
  return batch;
}

}  // namespace ferry::collate
