#pragma once

// The files language-model training reads tokens from, opened in place: NumPy's .npy, Megatron-
// LM's and fairseq's indexed datasets (PREFIX.idx + PREFIX.bin), nanoGPT's raw .bin and llm.c's
// shards. Each is mapped read-only (ipc::MappedFile: never read whole), and every header field
// is checked against the file's size before anything past it is read; a bad file is a
// ferry::DataError naming the file, the field and the numbers. Formats as their own sources
// define them: numpy/lib/format.py, megatron/core/datasets/indexed_dataset.py,
// fairseq/data/indexed_dataset.py, nanoGPT's data/openwebtext/prepare.py, llm.c's
// dev/data/data_common.py.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

#include "ferry/tokens.h"

#include "ipc/mapped_file.h"

namespace ferry::tokens {

/// The element types the formats store, named as NumPy names them. LibTorch 1.13 has no uint16,
/// uint32 or uint64, so these are not LibTorch's dtypes.
enum class Element : std::uint8_t {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
};
std::size_t element_size(Element e) noexcept;
const char* element_name(Element e) noexcept;  // "uint16"
std::optional<Element> element_from_name(std::string_view name) noexcept;
bool is_integer(Element e) noexcept;

/// How a dataset delivers tokens (ferry/tokens.h). kAuto: as stored where LibTorch has the dtype
/// (uint16 stays two bytes on LibTorch 2.3 and later), else the narrowest LibTorch integer that
/// holds every value (uint16 as int32, uint32 and uint64 as int64 on LibTorch 1.13).
using ferry::TokenDtype;
std::optional<TokenDtype> token_dtype_from_name(
    std::string_view name) noexcept;  // auto|int32|int64
torch::ScalarType delivered_dtype(Element stored, TokenDtype wanted);
/// Whether this LibTorch has uint16, uint32 and uint64 (2.3 and later).
bool has_unsigned_dtypes() noexcept;

/// Copies `count` elements of type `from` at `source` into `target` as `to` (a LibTorch integer
/// or the same type). Same type: one memcpy.
void convert(
    const std::byte* source, Element from, std::size_t count, void* target, torch::ScalarType to);

/// A tensor of `count` elements at `source` (in a mapping `keep` holds alive) as `to`: a view of
/// the mapping when the types match and the data is aligned for them, else a converted copy.
torch::Tensor tensor_of(const std::byte* source,
                        Element from,
                        std::vector<std::int64_t> sizes,
                        torch::ScalarType to,
                        const std::shared_ptr<const ipc::MappedFile>& keep);

// ---- NumPy .npy ------------------------------------------------------------------------------

/// An .npy array (format versions 1.0, 2.0 and 3.0; little-endian; C order; bool, integers and
/// floats) in place. Fortran order, big-endian data and object or structured dtypes are refused
/// with the header field that says so.
class NpyArray {
 public:
  static NpyArray open(const std::filesystem::path& path);
  Element element() const noexcept { return element_; }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  std::size_t count() const noexcept { return count_; }  // elements
  int version() const noexcept { return version_; }
  const std::byte* data() const noexcept { return data_; }
  const std::shared_ptr<const ipc::MappedFile>& file() const noexcept { return file_; }
  const std::string& path() const noexcept { return file_->path(); }

 private:
  std::shared_ptr<const ipc::MappedFile> file_;
  Element element_ = Element::kUInt8;
  std::vector<std::int64_t> shape_;
  std::size_t count_ = 0;
  int version_ = 1;
  const std::byte* data_ = nullptr;
};

/// Writes `array` as an .npy file (version 1.0 where its header fits, else 2.0, as numpy.save
/// does; the header padded so the data starts on a 64-byte boundary), atomically.
void write_npy(const std::filesystem::path& path,
               Element element,
               const std::vector<std::int64_t>& shape,
               const void* data);

// ---- Indexed datasets (.idx + .bin) ----------------------------------------------------------

/// Megatron-LM's indexed dataset, or fairseq's MMapIndexedDataset (the same magic, no document
/// index, other dtype codes), told apart by the .idx's size: PREFIX.idx holds the sequences'
/// lengths and byte offsets into PREFIX.bin (and for Megatron the documents' first sequences).
class IndexedFile {
 public:
  enum class Layout : std::uint8_t { kMegatron, kFairseq };
  static IndexedFile open(const std::string& prefix);

  Layout layout() const noexcept { return layout_; }
  Element element() const noexcept { return element_; }
  std::size_t sequences() const noexcept { return sequences_; }
  std::int64_t length(std::size_t sequence) const noexcept;   // in elements
  std::int64_t pointer(std::size_t sequence) const noexcept;  // byte offset in .bin
  /// Documents: Megatron's document index (documents() + 1 entries, the last = sequences());
  /// fairseq has none: one document per sequence.
  std::size_t documents() const noexcept;
  std::int64_t document_start(std::size_t document) const noexcept;
  /// Elements [offset, offset + count) of a sequence in .bin (bounds checked at open).
  const std::byte* tokens(std::size_t sequence, std::size_t offset = 0) const noexcept;
  const std::string& prefix() const noexcept { return prefix_; }
  const std::shared_ptr<const ipc::MappedFile>& bin() const noexcept { return bin_; }

 private:
  std::string prefix_;
  std::shared_ptr<const ipc::MappedFile> idx_;
  std::shared_ptr<const ipc::MappedFile> bin_;
  Layout layout_ = Layout::kMegatron;
  Element element_ = Element::kUInt16;
  std::size_t sequences_ = 0;
  std::size_t document_entries_ = 0;  // Megatron's D
  const std::byte* lengths_ = nullptr;
  const std::byte* pointers_ = nullptr;
  const std::byte* document_index_ = nullptr;
};

// ---- One long run of tokens: nanoGPT's .bin, llm.c's shards, a 1-D .npy -----------------------

/// The tokens of one file, as a single run. `format`: "bin" (nanoGPT: raw little-endian
/// `element`, no header), "llmc" (llm.c: a 256 x int32 header, magic 20240520 version 1 with
/// uint16 tokens or magic 20240801 version 7 with uint32), "npy" (a 1-D array), or "auto" (by
/// extension: .npy; a .bin starting with an llm.c magic; else raw `element`).
class TokenFile {
 public:
  static TokenFile open(const std::filesystem::path& path,
                        std::string_view format,
                        Element element);
  Element element() const noexcept { return element_; }
  std::size_t count() const noexcept { return count_; }
  const std::byte* data() const noexcept { return data_; }
  const std::string& format() const noexcept { return format_; }
  const std::shared_ptr<const ipc::MappedFile>& file() const noexcept { return file_; }
  const std::string& path() const noexcept { return file_->path(); }

 private:
  std::shared_ptr<const ipc::MappedFile> file_;
  Element element_ = Element::kUInt16;
  std::size_t count_ = 0;
  const std::byte* data_ = nullptr;
  std::string format_;
};

}  // namespace ferry::tokens
