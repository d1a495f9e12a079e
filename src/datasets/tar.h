#pragma once

// POSIX tar archives, as WebDataset shards use them: a writer that lays members out the same way
// on every run (ustar headers, mode 0644, owner 0, mtime 0), and a reader that lists members
// from their headers (ustar, v7, pax `path`/`size` records and GNU long names) and reads their
// bytes with pread. Nothing in a header is trusted: sizes and offsets are checked against the
// file's length before anything is read.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ipc/unique_fd.h"
#include "net/byte_source.h"

namespace ferry::vision::detail {

struct TarMember {
  std::string name;
  std::uint64_t header_offset = 0;  // the first header block that belongs to it (pax included)
  std::uint64_t data_offset = 0;    // where its bytes start
  std::uint64_t size = 0;
};

// Writes an archive to `path` (created or truncated). Members are added in order; `finish()`
// writes the two end blocks, flushes and fsyncs. Errors are ferry::Error naming the path.
class TarWriter {
 public:
  explicit TarWriter(std::filesystem::path path);
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  // Adds a regular file; returns where it landed. Names longer than ustar holds (100 bytes, or
  // a 155-byte folder and a 100-byte name) are refused.
  TarMember add(std::string_view name, std::span<const std::uint8_t> bytes);
  // Ends the archive; returns its size in bytes.
  std::uint64_t finish();
  // Bytes the archive holds so far (headers and padding included).
  std::uint64_t size() const noexcept { return offset_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void write(const void* data, std::size_t size);
  void flush();

  std::filesystem::path path_;
  ipc::UniqueFd fd_;
  std::vector<std::uint8_t> buffer_;
  std::uint64_t offset_ = 0;
};

// Reads an archive: members in order with next(), bytes with read(). Throws ferry::DataError
// naming the file and the offset for a header whose checksum is wrong, a size that is not a
// number, or a member that runs past the end of the file.
//
// The bytes come from a net::ByteSource: a local file (pread), or a remote object or a command's
// output read front to back, where reads go forward only (next() then the member's read(), as a
// stream of samples does) and a source of unknown size ends where its bytes end.
class TarReader {
 public:
  explicit TarReader(std::filesystem::path path);
  explicit TarReader(std::unique_ptr<net::ByteSource> source);

  // The next regular file, from offset(); nullopt at the end of the archive (a zero block or
  // the end of the file). Folders, links and other entries are passed over.
  std::optional<TarMember> next();
  std::uint64_t offset() const noexcept { return offset_; }
  // Continues at a header that next() reached before (TarMember::header_offset); on a
  // front-to-back source, only at or past the bytes read so far.
  void seek(std::uint64_t offset);
  const std::string& name() const noexcept { return source_->name(); }

  // `size` bytes at `offset` (checked against the file's length).
  void read(std::uint64_t offset, std::uint64_t size, std::uint8_t* out) const;

 private:
  std::unique_ptr<net::ByteSource> source_;
  std::uint64_t file_size_ = 0;  // UINT64_MAX while unknown (a pipe)
  bool size_known_ = true;
  bool ended_ = false;  // next() found the end of the archive
  std::uint64_t offset_ = 0;
};

// Every regular member of an archive, in order.
std::vector<TarMember> list_tar(const std::filesystem::path& path);

// WebDataset's split of a member name into the sample's key and the field's extension: the key
// is the folder and the file name up to its first dot, the extension the rest, lower-cased
// ("a/b.seg.PNG" -> "a/b", "seg.png"). nullopt for a name with no dot in its file name.
std::optional<std::pair<std::string, std::string>> split_key(std::string_view name);

// DALI's WebDataset index (v1.2) of an archive's members: "v1.2 <samples>" then one line per
// sample (members grouped by key as split_key does) of "<ext> <offset> <size> <name>" for each
// of its members. Members without a key are left out.
std::string webdataset_index(const std::vector<TarMember>& members);

}  // namespace ferry::vision::detail
