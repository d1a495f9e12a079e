#include "loader/batch_message.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include "ferry/error.h"

#include "collate/batch_layout.h"

namespace ferry::detail {

namespace {

// The dtypes a batch field may have: those of ordinary tensors (no quantized or bit types).
bool plain_dtype(std::int8_t code) {
  switch (static_cast<c10::ScalarType>(code)) {
    case c10::ScalarType::Byte:
    case c10::ScalarType::Char:
    case c10::ScalarType::Short:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Half:
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::ComplexHalf:
    case c10::ScalarType::ComplexFloat:
    case c10::ScalarType::ComplexDouble:
    case c10::ScalarType::Bool:
    case c10::ScalarType::BFloat16:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case c10::ScalarType::UInt16:  // token files' dtypes (LibTorch 2.3 and later)
    case c10::ScalarType::UInt32:
    case c10::ScalarType::UInt64:
#endif
      return code >= 0;
    default:
      return false;
  }
}

}  // namespace

Batch open_batch(ipc::BatchReadyMessage& m,
                 std::byte* base,
                 std::size_t size,
                 const std::shared_ptr<void>& owner,
                 const std::string& who) {
  auto bad = [&](const ipc::FieldMeta& f, const std::string& what) {
    return Error(str(who, " sent batch ", m.sequence, " of epoch ", m.epoch, " with field '",
                     f.name, "' ", what, " (its segment is ", size,
                     " bytes); the message is corrupt: a bug in ferry or memory corruption in "
                     "the worker"));
  };
  Batch batch(m.num_samples);
  for (std::size_t k = 0; k < m.fields.size(); ++k) {
    ipc::FieldMeta& f = m.fields[k];
    for (std::size_t j = 0; j < k; ++j) {
      if (m.fields[j].name == f.name) throw bad(f, "twice");
    }
    if (f.kind > static_cast<std::uint8_t>(collate::FieldKind::kString)) {
      throw bad(f, str("of kind ", static_cast<int>(f.kind), ", which is no field kind"));
    }
    const bool is_string = f.kind == static_cast<std::uint8_t>(collate::FieldKind::kString);
    if (is_string != (f.dtype < 0)) {
      throw bad(f, str("of kind ", static_cast<int>(f.kind), " with dtype code ",
                       static_cast<int>(f.dtype)));
    }
    if (is_string) {
      if (f.nbytes != 0 || !f.sizes.empty()) throw bad(f, "of strings with a tensor's extent");
      batch.set(f.name, std::move(f.strings));
      continue;
    }
    if (!plain_dtype(f.dtype)) throw bad(f, str("with dtype code ", static_cast<int>(f.dtype)));
    if (!f.strings.empty()) throw bad(f, "of a tensor that carries strings");
    const auto dtype = static_cast<c10::ScalarType>(f.dtype);
    const std::uint64_t element = c10::elementSize(dtype);
    std::uint64_t numel = 1;
    for (const std::int64_t s : f.sizes) {
      if (s < 0) throw bad(f, str("with size ", s));
      if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(s), &numel)) {
        throw bad(f, "whose element count overflows");
      }
    }
    std::uint64_t extent = 0;
    if (__builtin_mul_overflow(numel, element, &extent)) {
      throw bad(f, "whose byte count overflows");
    }
    if (extent != f.nbytes) {
      throw bad(f, str("of ", f.nbytes, " bytes, but its sizes and dtype make ", extent));
    }
    std::uint64_t end = 0;
    if (__builtin_add_overflow(f.offset, f.nbytes, &end) || end > size) {
      throw bad(f, str("at offset ", f.offset, " of ", f.nbytes, " bytes, outside its segment"));
    }
    if (f.offset % element != 0) {
      throw bad(f, str("at offset ", f.offset, ", not aligned to its ", element, "-byte elements"));
    }
    batch.set(f.name,
              at::from_blob(
                  base + f.offset, f.sizes, [owner](void*) {}, at::TensorOptions().dtype(dtype)));
  }
  batch.set_indices(std::move(m.indices));
  return batch;
}

}  // namespace ferry::detail
