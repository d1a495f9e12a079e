#include "ferry/device_transforms.h"

#include <limits>

#include "ferry/error.h"

namespace ferry::device_transforms {

namespace {

std::string join_fields(const std::vector<std::string>& fields) {
  std::string out;
  for (const auto& f : fields) out += (out.empty() ? "" : ", ") + f;
  return out;
}

double max_of(torch::ScalarType type) {
  switch (type) {
    case torch::kUInt8:
      return std::numeric_limits<std::uint8_t>::max();
    case torch::kInt8:
      return std::numeric_limits<std::int8_t>::max();
    case torch::kInt16:
      return std::numeric_limits<std::int16_t>::max();
    case torch::kInt32:
      return std::numeric_limits<std::int32_t>::max();
    case torch::kInt64:
      return static_cast<double>(std::numeric_limits<std::int64_t>::max());
    default:
      return 1.0;
  }
}

}  // namespace

ToDtype::ToDtype(torch::ScalarType dtype, bool scale, std::vector<std::string> fields)
    : dtype_(dtype), scale_(scale), fields_(std::move(fields)) {
  FERRY_CHECK(!fields_.empty(), "to_dtype: fields is empty; name the batch fields to convert");
}

void ToDtype::apply(Batch& batch) const {
  for (const auto& field : fields_) {
    const torch::Tensor& t = batch[field];
    const bool from_int = !at::isFloatingType(t.scalar_type()) && t.scalar_type() != torch::kBool;
    const bool to_float = at::isFloatingType(dtype_);
    FERRY_CHECK(!scale_ || to_float || !at::isFloatingType(t.scalar_type()),
                "to_dtype: scaling field '", field, "' from ", t.scalar_type(), " down to ", dtype_,
                " is not supported; convert to a floating-point dtype, or set scale=false");
    torch::Tensor out = t.to(dtype_);
    if (scale_ && from_int && to_float) out.div_(max_of(t.scalar_type()));
    batch.set(field, std::move(out));
  }
}

std::string ToDtype::describe() const {
  return detail::str("to_dtype(", dtype_, scale_ ? ", scale" : "", " on ", join_fields(fields_),
                     ")");
}

Normalize::Normalize(std::vector<double> mean,
                     std::vector<double> std,
                     std::vector<std::string> fields)
    : mean_(std::move(mean)), std_(std::move(std)), fields_(std::move(fields)) {
  FERRY_CHECK(!mean_.empty() && mean_.size() == std_.size(), "normalize: mean has ", mean_.size(),
              " values and std ", std_.size(), "; give one of each per channel");
  for (const double s : std_) {
    FERRY_CHECK(s != 0.0, "normalize: std has a 0, which would divide by zero");
  }
  FERRY_CHECK(!fields_.empty(), "normalize: fields is empty; name the batch fields to normalise");
}

void Normalize::apply(Batch& batch) const {
  for (const auto& field : fields_) {
    const torch::Tensor& t = batch[field];
    FERRY_CHECK(at::isFloatingType(t.scalar_type()), "normalize: field '", field, "' is ",
                t.scalar_type(), "; convert it to floating point first (to_dtype)");
    FERRY_CHECK(t.dim() >= 2 && t.size(1) == static_cast<std::int64_t>(mean_.size()),
                "normalize: field '", field, "' has shape ", t.sizes(), ", but mean and std have ",
                mean_.size(), " channels (expected [batch, ", mean_.size(), ", ...])");
    torch::Tensor mean;
    torch::Tensor std;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      std::vector<std::int64_t> shape(static_cast<std::size_t>(t.dim()), 1);
      shape[1] = static_cast<std::int64_t>(mean_.size());
      for (const auto& [m, s] : constants_) {
        if (m.device() == t.device() && m.scalar_type() == t.scalar_type() && m.dim() == t.dim()) {
          mean = m;
          std = s;
        }
      }
      if (!mean.defined()) {
        // Made on the host as the tensor's dtype (the CPU pipeline's float constants), then moved
        // to the device once; the copy is tiny and happens only here.
        const auto host = torch::TensorOptions().dtype(torch::kDouble);
        mean = torch::tensor(mean_, host).to(t.scalar_type()).reshape(shape).to(t.device());
        std = torch::tensor(std_, host).to(t.scalar_type()).reshape(shape).to(t.device());
        constants_.emplace_back(mean, std);
      }
    }
    batch.set(field, t.sub(mean).div_(std));
  }
}

std::string Normalize::describe() const {
  return detail::str("normalize(", mean_.size(), " channels on ", join_fields(fields_), ")");
}

}  // namespace ferry::device_transforms
