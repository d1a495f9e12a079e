#include "datasets/token_files.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstring>
#include <limits>
#include <system_error>
#include <type_traits>

#include <c10/util/Half.h>
#include <torch/version.h>

#include "ferry/error.h"

#include "ipc/files.h"

namespace ferry::tokens {

namespace {

using detail::str;

struct ElementInfo {
  const char* name;
  std::size_t size;
};
constexpr std::array<ElementInfo, 12> kElements{{{"bool", 1},
                                                 {"int8", 1},
                                                 {"uint8", 1},
                                                 {"int16", 2},
                                                 {"uint16", 2},
                                                 {"int32", 4},
                                                 {"uint32", 4},
                                                 {"int64", 8},
                                                 {"uint64", 8},
                                                 {"float16", 2},
                                                 {"float32", 4},
                                                 {"float64", 8}}};

std::shared_ptr<const ipc::MappedFile> map(const std::filesystem::path& path, const char* what) {
  try {
    return std::make_shared<const ipc::MappedFile>(ipc::MappedFile::open(path));
  } catch (const std::system_error& e) {
    // e.what() names the call that failed (open, fstat or mmap) and the path.
    throw DataError(
        str(what, " ", path.string(), ": ", e.what(),
            e.code() == std::errc::no_such_file_or_directory ? "; check the path" : ""));
  }
}

template <class T>
T read_le(const std::byte* p) noexcept {  // the formats are little-endian, as this machine is
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---- .npy header ----

struct NpyHeader {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::int64_t>> shape;
};

// A Python dict literal as numpy writes it: {'descr': '<u2', 'fortran_order': False,
// 'shape': (10, 3), }. Throws what is wrong, for the caller to name the file.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  NpyHeader parse() {
    NpyHeader h;
    skip();
    expect('{');
    for (;;) {
      skip();
      if (peek() == '}') break;
      const std::string key = string_literal("a key");
      skip();
      expect(':');
      skip();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"') {
          throw DataError(
              "header field 'descr' is not a simple dtype (a structured or "
              "object dtype): ferry reads bool, integer and float arrays");
        }
        h.descr = string_literal("'descr'");
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
      } else if (key == "shape") {
        h.shape = tuple();
      } else {
        throw DataError(
            str("header field '", key, "' is not one of NumPy's (descr, fortran_order, shape)"));
      }
      skip();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip();
      if (peek() == '}') break;
      throw DataError(str("header: expected ',' or '}' at byte ", at_));
    }
    return h;
  }

 private:
  char peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }
  void skip() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  void expect(char c) {
    if (peek() != c) throw DataError(str("header: expected '", c, "' at byte ", at_));
    ++at_;
  }
  std::string string_literal(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') {
      throw DataError(str("header: expected ", what, " in quotes at byte ", at_));
    }
    const std::size_t end = s_.find(quote, at_ + 1);
    if (end == std::string_view::npos) throw DataError("header: an unterminated string");
    std::string out(s_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(at_, 4) == "True") {
      at_ += 4;
      return true;
    }
    if (s_.substr(at_, 5) == "False") {
      at_ += 5;
      return false;
    }
    throw DataError(str("header field 'fortran_order' is not True or False at byte ", at_));
  }
  std::vector<std::int64_t> tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    for (;;) {
      skip();
      if (peek() == ')') {
        ++at_;
        return dims;
      }
      std::int64_t v = 0;
      const char* first = s_.data() + at_;
      const auto [ptr, ec] = std::from_chars(first, s_.data() + s_.size(), v);
      if (ec != std::errc() || v < 0) {
        throw DataError(
            str("header field 'shape' holds something other than a size at byte ", at_));
      }
      at_ += static_cast<std::size_t>(ptr - first);
      if (peek() == 'L') ++at_;  // Python 2's long
      dims.push_back(v);
      skip();
      if (peek() == ',') ++at_;
    }
  }

  std::string_view s_;
  std::size_t at_ = 0;
};

Element element_of_descr(const std::string& descr, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return DataError(str(path, ": header field 'descr' is '", descr, "': ", why));
  };
  if (descr.size() < 3) throw refuse("not a dtype ferry reads (bool, integers, floats)");
  const char order = descr[0];
  const std::string_view code = std::string_view(descr).substr(1);
  static constexpr std::array<std::pair<std::string_view, Element>, 12> kCodes{{
      {"b1", Element::kBool},
      {"i1", Element::kInt8},
      {"u1", Element::kUInt8},
      {"i2", Element::kInt16},
      {"u2", Element::kUInt16},
      {"i4", Element::kInt32},
      {"u4", Element::kUInt32},
      {"i8", Element::kInt64},
      {"u8", Element::kUInt64},
      {"f2", Element::kFloat16},
      {"f4", Element::kFloat32},
      {"f8", Element::kFloat64},
  }};
  const auto it =
      std::find_if(kCodes.begin(), kCodes.end(), [&](const auto& c) { return c.first == code; });
  if (it == kCodes.end()) {
    throw refuse(
        "not a dtype ferry reads (bool, int8 to int64, uint8 to uint64, float16 to "
        "float64; an object, string or structured array is not a token array)");
  }
  if (order == '>' && element_size(it->second) > 1) {
    throw refuse("big-endian; convert it with numpy (a.astype(a.dtype.newbyteorder('<')))");
  }
  if (order != '<' && order != '|' && order != '=' && order != '>') {
    throw refuse("its byte order is not <, |, = or >");
  }
  return it->second;
}

// Multiplies sizes, or nullopt on overflow.
std::optional<std::size_t> product(const std::vector<std::int64_t>& shape, std::size_t unit) {
  std::size_t n = unit;
  for (const std::int64_t d : shape) {
    const auto dim = static_cast<std::size_t>(d);
    if (dim != 0 && n > std::numeric_limits<std::size_t>::max() / dim) return std::nullopt;
    n *= dim;
  }
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

template <class From, class To>
void convert_as(const std::byte* source, std::size_t count, void* target) {
  auto* out = static_cast<To*>(target);
  if (reinterpret_cast<std::uintptr_t>(source) % alignof(From) == 0) {
    const auto* in = reinterpret_cast<const From*>(source);
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<To>(in[i]);
  } else {  // an odd offset (a hand-written file): element by element
    for (std::size_t i = 0; i < count; ++i)
      out[i] = static_cast<To>(read_le<From>(source + i * sizeof(From)));
  }
}

template <class To>
void convert_to(const std::byte* source, Element from, std::size_t count, void* target) {
  switch (from) {
    case Element::kBool:
    case Element::kUInt8:
      return convert_as<std::uint8_t, To>(source, count, target);
    case Element::kInt8:
      return convert_as<std::int8_t, To>(source, count, target);
    case Element::kInt16:
      return convert_as<std::int16_t, To>(source, count, target);
    case Element::kUInt16:
      return convert_as<std::uint16_t, To>(source, count, target);
    case Element::kInt32:
      return convert_as<std::int32_t, To>(source, count, target);
    case Element::kUInt32:
      return convert_as<std::uint32_t, To>(source, count, target);
    case Element::kInt64:
      return convert_as<std::int64_t, To>(source, count, target);
    case Element::kUInt64:
      return convert_as<std::uint64_t, To>(source, count, target);
    default:
      throw Error(str("tokens: cannot convert ", element_name(from), " to an integer dtype"));
  }
}

// The LibTorch dtype an element is stored as, where LibTorch has one.
std::optional<torch::ScalarType> native_dtype(Element e) noexcept {
  switch (e) {
    case Element::kBool:
      return torch::kBool;
    case Element::kInt8:
      return torch::kInt8;
    case Element::kUInt8:
      return torch::kUInt8;
    case Element::kInt16:
      return torch::kInt16;
    case Element::kInt32:
      return torch::kInt32;
    case Element::kInt64:
      return torch::kInt64;
    case Element::kFloat16:
      return torch::kFloat16;
    case Element::kFloat32:
      return torch::kFloat32;
    case Element::kFloat64:
      return torch::kFloat64;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case Element::kUInt16:
      return torch::kUInt16;
    case Element::kUInt32:
      return torch::kUInt32;
    case Element::kUInt64:
      return torch::kUInt64;
#endif
    default:
      return std::nullopt;
  }
}

}  // namespace

std::size_t element_size(Element e) noexcept { return kElements[static_cast<std::size_t>(e)].size; }
const char* element_name(Element e) noexcept { return kElements[static_cast<std::size_t>(e)].name; }

std::optional<Element> element_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kElements.size(); ++i) {
    if (name == kElements[i].name) return static_cast<Element>(i);
  }
  return std::nullopt;
}

bool is_integer(Element e) noexcept {
  return e != Element::kBool && e != Element::kFloat16 && e != Element::kFloat32 &&
         e != Element::kFloat64;
}

std::optional<TokenDtype> token_dtype_from_name(std::string_view name) noexcept {
  if (name == "auto") return TokenDtype::kAuto;
  if (name == "int32") return TokenDtype::kInt32;
  if (name == "int64") return TokenDtype::kInt64;
  return std::nullopt;
}

torch::ScalarType delivered_dtype(Element stored, TokenDtype wanted) {
  if (wanted == TokenDtype::kInt64) {
    FERRY_CHECK(is_integer(stored), "dtype=int64: the tokens are ", element_name(stored),
                ", not integers; leave dtype at auto");
    return torch::kInt64;
  }
  if (wanted == TokenDtype::kInt32) {
    const bool fits = stored == Element::kInt8 || stored == Element::kUInt8 ||
                      stored == Element::kInt16 || stored == Element::kUInt16 ||
                      stored == Element::kInt32;
    FERRY_CHECK(fits, "dtype=int32 cannot hold every ", element_name(stored),
                " token; use dtype=int64, or auto");
    return torch::kInt32;
  }
  if (const auto native = native_dtype(stored)) return *native;
  // LibTorch before 2.3: the narrowest signed type that holds every value.
  FERRY_CHECK(stored != Element::kUInt64,
              "dtype=auto: uint64 values have no LibTorch 1.13 dtype (LibTorch 2.3 and later have "
              "uint64); use dtype=int64 if every value is below 2^63");
  return stored == Element::kUInt16 ? torch::kInt32 : torch::kInt64;
}

bool has_unsigned_dtypes() noexcept {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  return true;
#else
  return false;
#endif
}

void convert(
    const std::byte* source, Element from, std::size_t count, void* target, torch::ScalarType to) {
  if (const auto native = native_dtype(from); native && *native == to) {
    std::memcpy(target, source, count * element_size(from));
    return;
  }
  switch (to) {
    case torch::kInt32:
      return convert_to<std::int32_t>(source, from, count, target);
    case torch::kInt64:
      return convert_to<std::int64_t>(source, from, count, target);
    default:
      throw Error(str("tokens: cannot convert ", element_name(from), " to ", to));
  }
}

torch::Tensor tensor_of(const std::byte* source,
                        Element from,
                        std::vector<std::int64_t> sizes,
                        torch::ScalarType to,
                        const std::shared_ptr<const ipc::MappedFile>& keep) {
  std::size_t count = 1;
  for (const std::int64_t s : sizes) count *= static_cast<std::size_t>(s);
  const auto native = native_dtype(from);
  if (native && *native == to &&
      reinterpret_cast<std::uintptr_t>(source) % element_size(from) == 0) {
    // A view of the mapping, which the tensor keeps alive.
    return torch::from_blob(
        const_cast<std::byte*>(source), sizes, [held = keep](void*) mutable { held.reset(); },
        torch::TensorOptions().dtype(to));
  }
  torch::Tensor out = torch::empty(sizes, torch::TensorOptions().dtype(to));
  if (native && *native == to) {
    std::memcpy(out.data_ptr(), source, count * element_size(from));
  } else {
    convert(source, from, count, out.data_ptr(), to);
  }
  return out;
}

// ---- .npy ----

NpyArray NpyArray::open(const std::filesystem::path& path) {
  NpyArray a;
  a.file_ = map(path, "npy:");
  const ipc::MappedFile& f = *a.file_;
  const std::string& name = f.path();
  if (f.size() == 0) throw DataError(str(name, ": the file is empty, not an .npy array"));
  static constexpr char kMagic[] = "\x93NUMPY";
  if (f.size() < 8 || std::memcmp(f.data(), kMagic, 6) != 0) {
    throw DataError(str(name, ": not an .npy file (its magic is not \\x93NUMPY)"));
  }
  const auto major = static_cast<int>(f.data()[6]);
  const auto minor = static_cast<int>(f.data()[7]);
  if (minor != 0 || major < 1 || major > 3) {
    throw DataError(str(name, ": .npy format version ", major, ".", minor,
                        "; ferry reads versions 1.0, 2.0 and 3.0"));
  }
  a.version_ = major;
  const std::size_t prefix = major == 1 ? 10 : 12;
  if (f.size() < prefix) {
    throw DataError(str(name, ": the header is cut short (", f.size(), " bytes)"));
  }
  const std::size_t header_length =
      major == 1 ? read_le<std::uint16_t>(f.data() + 8) : read_le<std::uint32_t>(f.data() + 8);
  if (header_length > f.size() - prefix) {
    throw DataError(str(name, ": the header claims ", header_length,
                        " bytes but the file holds only ", f.size() - prefix, " after its prefix"));
  }
  const std::string_view text(reinterpret_cast<const char*>(f.data() + prefix), header_length);
  NpyHeader h;
  try {
    h = HeaderParser(text).parse();
  } catch (const DataError& e) {
    throw DataError(str(name, ": ", e.what()));
  }
  if (!h.descr || !h.fortran_order || !h.shape) {
    throw DataError(str(name, ": the header lacks ",
                        !h.descr           ? "'descr'"
                        : !h.fortran_order ? "'fortran_order'"
                                           : "'shape'"));
  }
  a.element_ = element_of_descr(*h.descr, name);
  a.shape_ = *h.shape;
  if (*h.fortran_order && a.shape_.size() > 1) {
    throw DataError(str(name,
                        ": header field 'fortran_order' is True: ferry reads C-order arrays "
                        "(numpy.ascontiguousarray(a) before saving)"));
  }
  const std::size_t offset = prefix + header_length;
  const auto bytes = product(a.shape_, element_size(a.element_));
  if (!bytes || *bytes > f.size() - offset) {
    throw DataError(str(name, ": header field 'shape' is ", shape_text(a.shape_), " of ",
                        element_name(a.element_), ", which needs ",
                        bytes ? std::to_string(*bytes) : std::string("more"),
                        " bytes after the header, but the file holds ", f.size() - offset));
  }
  a.count_ = *bytes / element_size(a.element_);
  a.data_ = f.data() == nullptr ? nullptr : f.data() + offset;
  return a;
}

void write_npy(const std::filesystem::path& path,
               Element element,
               const std::vector<std::int64_t>& shape,
               const void* data) {
  static constexpr std::array<const char*, 12> kDescr{"|b1", "|i1", "|u1", "<i2", "<u2", "<i4",
                                                      "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"};
  std::string dict = str("{'descr': '", kDescr[static_cast<std::size_t>(element)],
                         "', 'fortran_order': False, 'shape': ", shape_text(shape), ", }");
  // numpy 1.24 and later leave room for the first dimension to grow to 21 digits.
  if (!shape.empty()) dict.append(21 - std::to_string(shape[0]).size(), ' ');
  const bool v1 = dict.size() + 1 + 10 + 63 <= 0xffff;
  const std::size_t prefix = v1 ? 10 : 12;
  const std::size_t padding = 64 - (prefix + dict.size() + 1) % 64;
  const std::size_t header_length = dict.size() + padding + 1;
  std::string out = "\x93NUMPY";
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  if (v1) {
    const auto n = static_cast<std::uint16_t>(header_length);
    out.append(reinterpret_cast<const char*>(&n), 2);
  } else {
    const auto n = static_cast<std::uint32_t>(header_length);
    out.append(reinterpret_cast<const char*>(&n), 4);
  }
  out += dict;
  out.append(padding, ' ');
  out += '\n';
  const auto bytes = product(shape, element_size(element)).value_or(0);
  out.append(static_cast<const char*>(data), bytes);
  ipc::write_file_atomically(path, out, "write_npy:");
}

// ---- indexed datasets ----

IndexedFile IndexedFile::open(const std::string& prefix) {
  IndexedFile x;
  x.prefix_ = prefix;
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  x.idx_ = map(idx_path, "indexed dataset:");
  x.bin_ = map(bin_path, "indexed dataset:");
  const ipc::MappedFile& idx = *x.idx_;
  const std::byte* d = idx.data();
  static constexpr char kMagic[] = "MMIDIDX\0\0";
  if (idx.size() < 26) {
    throw DataError(str(idx_path, ": the .idx is ", idx.size(),
                        " bytes, shorter than its header (26 bytes at least)"));
  }
  if (std::memcmp(d, kMagic, 9) != 0) {
    throw DataError(str(idx_path,
                        ": not a Megatron-LM or fairseq index (its magic is not "
                        "MMIDIDX\\0\\0)"));
  }
  const auto version = read_le<std::uint64_t>(d + 9);
  if (version != 1) {
    throw DataError(str(idx_path, ": index version ", version, "; ferry reads version 1"));
  }
  const auto code = static_cast<unsigned>(d[17]);
  const auto n = read_le<std::uint64_t>(d + 18);
  if (n > (idx.size() - 26) / 12) {
    throw DataError(str(idx_path, ": the .idx says ", n, " sequences, which need ",
                        "12 bytes each, but it holds ", idx.size(),
                        " bytes in all (the .idx is cut short)"));
  }
  const std::size_t fairseq_size = 26 + 12 * n;
  std::size_t arrays = 26;
  if (idx.size() == fairseq_size) {
    x.layout_ = Layout::kFairseq;
  } else {
    const auto documents = idx.size() >= 34 ? read_le<std::uint64_t>(d + 26) : 0;
    const bool fits = documents <= (idx.size() - 34) / 8;
    const std::size_t megatron_size = 34 + 12 * n + 8 * documents;
    if (!fits || (idx.size() != megatron_size && idx.size() != megatron_size + n)) {
      throw DataError(
          str(idx_path, ": ", idx.size(), " bytes match neither layout of ", n,
              " sequences: fairseq's needs ", fairseq_size,
              ", Megatron-LM's 34 + 12 x sequences + 8 x documents (the .idx says ", documents,
              " document entries) = ", fits ? std::to_string(megatron_size) : std::string("more"),
              "; the .idx is cut short or not an index"));
    }
    x.layout_ = Layout::kMegatron;
    x.document_entries_ = documents;
    arrays = 34;
  }
  // The dtype codes of megatron/core/datasets/indexed_dataset.py and fairseq's.
  static constexpr std::array<std::optional<Element>, 11> kMegatron{
      std::nullopt,     Element::kUInt8, Element::kInt8,    Element::kInt16,
      Element::kInt32,  Element::kInt64, Element::kFloat64, Element::kFloat32,
      Element::kUInt16, std::nullopt,    std::nullopt};
  static constexpr std::array<std::optional<Element>, 11> kFairseq{
      std::nullopt,     Element::kUInt8,  Element::kInt8,    Element::kInt16,
      Element::kInt32,  Element::kInt64,  Element::kFloat64, Element::kFloat64,
      Element::kUInt16, Element::kUInt32, Element::kUInt64};
  const auto& table = x.layout_ == Layout::kMegatron ? kMegatron : kFairseq;
  if (code >= table.size() || !table[code]) {
    throw DataError(
        str(idx_path, ": dtype code ", code, " is not one of ",
            x.layout_ == Layout::kMegatron ? "Megatron-LM's (1 to 8)" : "fairseq's (1 to 10)"));
  }
  x.element_ = *table[code];
  x.sequences_ = n;
  x.lengths_ = d + arrays;
  x.pointers_ = x.lengths_ + 4 * n;
  x.document_index_ = x.pointers_ + 8 * n;
  // Every sequence inside .bin, at an offset of whole elements: checked once here, so reading
  // one later needs no check.
  const std::size_t item = element_size(x.element_);
  const std::size_t bin_size = x.bin_->size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t length = x.length(i);
    const std::int64_t pointer = x.pointer(i);
    if (length < 0 || pointer < 0 || static_cast<std::uint64_t>(pointer) % item != 0 ||
        static_cast<std::uint64_t>(length) > bin_size / item ||
        static_cast<std::uint64_t>(pointer) >
            bin_size - static_cast<std::uint64_t>(length) * item) {
      throw DataError(str(idx_path, ": sequence ", i, " has pointer ", pointer, " and length ",
                          length, " (", element_name(x.element_), "), which run past ", bin_path,
                          " (", bin_size,
                          " bytes) or are not whole elements: the .bin is cut "
                          "short, or the .idx is not its index"));
    }
  }
  if (x.layout_ == Layout::kMegatron) {
    const std::size_t entries = x.document_entries_;
    if (entries == 0 || x.document_start(0) != 0 ||
        x.document_start(entries - 1) != static_cast<std::int64_t>(n)) {
      throw DataError(str(
          idx_path,
          ": the document index must run from 0 to the number of "
          "sequences (",
          n, "); it has ", entries, " entries",
          entries > 0 ? str(", from ", x.document_start(0), " to ", x.document_start(entries - 1))
                      : std::string()));
    }
    for (std::size_t k = 1; k < entries; ++k) {
      if (x.document_start(k) < x.document_start(k - 1)) {
        throw DataError(str(idx_path, ": document index entry ", k, " (", x.document_start(k),
                            ") is below the one before it (", x.document_start(k - 1), ")"));
      }
    }
  }
  return x;
}

std::int64_t IndexedFile::length(std::size_t sequence) const noexcept {
  return read_le<std::int32_t>(lengths_ + 4 * sequence);
}
std::int64_t IndexedFile::pointer(std::size_t sequence) const noexcept {
  return read_le<std::int64_t>(pointers_ + 8 * sequence);
}
std::size_t IndexedFile::documents() const noexcept {
  return layout_ == Layout::kMegatron ? document_entries_ - 1 : sequences_;
}
std::int64_t IndexedFile::document_start(std::size_t document) const noexcept {
  if (layout_ == Layout::kFairseq) return static_cast<std::int64_t>(document);
  return read_le<std::int64_t>(document_index_ + 8 * document);
}
const std::byte* IndexedFile::tokens(std::size_t sequence, std::size_t offset) const noexcept {
  return bin_->data() + pointer(sequence) + offset * element_size(element_);
}

// ---- one run of tokens ----

TokenFile TokenFile::open(const std::filesystem::path& path,
                          std::string_view format,
                          Element element) {
  TokenFile t;
  std::string chosen(format);
  if (chosen == "auto") {
    if (path.extension() == ".npy") {
      chosen = "npy";
    } else {
      t.file_ = map(path, "tokens:");
      const std::int32_t magic = t.file_->size() >= 4 ? read_le<std::int32_t>(t.file_->data()) : 0;
      chosen = magic == 20240520 || magic == 20240801 ? "llmc" : "bin";
    }
  }
  t.format_ = chosen;
  if (chosen == "npy") {
    NpyArray a = NpyArray::open(path);
    if (a.shape().size() != 1 || !is_integer(a.element())) {
      throw DataError(str(a.path(), ": tokens come from a 1-D integer array; this one is ",
                          element_name(a.element()), " of ", a.shape().size(), " dimensions"));
    }
    t.file_ = a.file();
    t.element_ = a.element();
    t.count_ = a.count();
    t.data_ = a.data();
    return t;
  }
  if (!t.file_) t.file_ = map(path, "tokens:");
  const ipc::MappedFile& f = *t.file_;
  if (chosen == "bin") {
    FERRY_CHECK(element == Element::kUInt16 || element == Element::kUInt32,
                "tokens: a raw .bin holds uint16 (nanoGPT) or uint32 tokens, not ",
                element_name(element));
    const std::size_t item = element_size(element);
    if (f.size() % item != 0) {
      throw DataError(str(f.path(), ": ", f.size(), " bytes is not a whole number of ",
                          element_name(element),
                          " tokens: the file is cut short, or holds "
                          "another dtype"));
    }
    t.element_ = element;
    t.count_ = f.size() / item;
    t.data_ = f.data();
    return t;
  }
  if (chosen == "llmc") {
    if (f.size() < 1024) {
      throw DataError(str(f.path(), ": ", f.size(),
                          " bytes is shorter than llm.c's header (256 x int32 = 1024 bytes)"));
    }
    const auto magic = read_le<std::int32_t>(f.data());
    const auto version = read_le<std::int32_t>(f.data() + 4);
    const auto count = read_le<std::int32_t>(f.data() + 8);
    if (magic == 20240520) {
      if (version != 1) {
        throw DataError(str(f.path(), ": llm.c magic 20240520 (GPT-2, uint16) with version ",
                            version, "; it goes with version 1"));
      }
      t.element_ = Element::kUInt16;
    } else if (magic == 20240801) {
      if (version != 7) {
        throw DataError(str(f.path(), ": llm.c magic 20240801 (Llama 3, uint32) with version ",
                            version, "; it goes with version 7"));
      }
      t.element_ = Element::kUInt32;
    } else {
      throw DataError(str(f.path(), ": llm.c magic ", magic,
                          " is neither 20240520 (GPT-2, uint16) nor 20240801 (Llama 3, uint32)"));
    }
    const std::size_t item = element_size(t.element_);
    if (count < 0 || static_cast<std::size_t>(count) * item != f.size() - 1024) {
      throw DataError(str(f.path(), ": the header's token count is ", count, " (",
                          static_cast<std::int64_t>(count) * static_cast<std::int64_t>(item),
                          " bytes), but the file holds ", f.size() - 1024,
                          " bytes after the header"));
    }
    t.count_ = static_cast<std::size_t>(count);
    t.data_ = f.data() + 1024;
    return t;
  }
  throw ConfigError(str("tokens: format '", format, "' is not one of auto, bin, llmc, npy"));
}

}  // namespace ferry::tokens
