#include "datasets/tar.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>

#include "ferry/error.h"

namespace ferry::vision::detail {

namespace {

using ferry::detail::str;

constexpr std::size_t kBlock = 512;
constexpr std::size_t kBufferSize = 1 << 20;

std::uint64_t round_up(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// An octal field of `width` bytes: width - 1 digits and a NUL.
void put_octal(std::uint8_t* field, std::size_t width, std::uint64_t value) {
  field[width - 1] = 0;
  for (std::size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<std::uint8_t>('0' + (value & 7));
    value >>= 3;
  }
}

std::uint32_t checksum(const std::uint8_t* header) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    sum += (i >= 148 && i < 156) ? static_cast<std::uint32_t>(' ') : header[i];
  }
  return sum;
}

// Old tars summed signed chars; both sums are accepted, as tarfile and GNU tar do.
std::int64_t signed_checksum(const std::uint8_t* header) {
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<signed char>(header[i]);
  }
  return sum;
}

// A numeric field: octal digits (spaces and NULs around them), or GNU's base-256 form.
std::optional<std::uint64_t> parse_number(const std::uint8_t* field, std::size_t width) {
  if (field[0] & 0x80) {
    if (field[0] != 0x80) return std::nullopt;  // negative
    std::uint64_t value = 0;
    for (std::size_t i = 1; i < width; ++i) {
      if (value >> 56) return std::nullopt;
      value = (value << 8) | field[i];
    }
    return value;
  }
  std::size_t i = 0;
  while (i < width && (field[i] == ' ' || field[i] == 0)) ++i;
  std::uint64_t value = 0;
  bool digits = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (value >> 60) return std::nullopt;
    value = value * 8 + (field[i] - '0');
    digits = true;
  }
  for (; i < width; ++i) {
    if (field[i] != ' ' && field[i] != 0) return std::nullopt;
  }
  if (!digits) return 0;
  return value;
}

std::string field_string(const std::uint8_t* field, std::size_t width) {
  const auto* begin = reinterpret_cast<const char*>(field);
  return std::string(begin, strnlen(begin, width));
}

}  // namespace

// ---- TarWriter ----

TarWriter::TarWriter(std::filesystem::path path) : path_(std::move(path)) {
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_) {
    throw Error(str("tar ", path_.string(), ": cannot create: ", std::strerror(errno),
                    "; check that the folder exists and is writable"));
  }
  buffer_.reserve(kBufferSize);
}

TarMember TarWriter::add(std::string_view name, std::span<const std::uint8_t> bytes) {
  std::array<std::uint8_t, kBlock> header{};
  std::string_view prefix;
  std::string_view base = name;
  if (name.size() > 100) {
    // ustar: a folder part of up to 155 bytes, split at a '/', and the rest in `name`.
    const std::size_t cut = name.rfind('/', 155);
    if (cut == std::string_view::npos || name.size() - cut - 1 > 100 || cut == 0) {
      throw Error(str("tar ", path_.string(), ": member name '", name, "' is ", name.size(),
                      " bytes, longer than a ustar header holds (a 155-byte folder and a ",
                      "100-byte name); use shorter keys"));
    }
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  if (name.empty()) throw Error(str("tar ", path_.string(), ": a member needs a name"));
  std::memcpy(header.data(), base.data(), base.size());
  put_octal(header.data() + 100, 8, 0644);
  put_octal(header.data() + 108, 8, 0);
  put_octal(header.data() + 116, 8, 0);
  if (bytes.size() >= (std::uint64_t{1} << 33)) {
    throw Error(str("tar ", path_.string(), ": member '", name, "' is ", bytes.size(),
                    " bytes; a ustar member holds less than 8 GiB"));
  }
  put_octal(header.data() + 124, 12, bytes.size());
  put_octal(header.data() + 136, 12, 0);
  header[156] = '0';
  std::memcpy(header.data() + 257, "ustar", 6);  // with its NUL
  std::memcpy(header.data() + 263, "00", 2);
  if (!prefix.empty()) std::memcpy(header.data() + 345, prefix.data(), prefix.size());
  // The checksum: six octal digits, a NUL and a space, as tar writes it.
  const std::uint32_t sum = checksum(header.data());
  put_octal(header.data() + 148, 7, sum);
  header[155] = ' ';

  TarMember member{std::string(name), offset_, offset_ + kBlock, bytes.size()};
  write(header.data(), kBlock);
  write(bytes.data(), bytes.size());
  static constexpr std::array<std::uint8_t, kBlock> zeros{};
  write(zeros.data(), round_up(bytes.size()) - bytes.size());
  return member;
}

std::uint64_t TarWriter::finish() {
  static constexpr std::array<std::uint8_t, 2 * kBlock> zeros{};
  write(zeros.data(), zeros.size());
  flush();
  if (::fsync(fd_.get()) != 0) {
    throw Error(str("tar ", path_.string(), ": fsync failed: ", std::strerror(errno)));
  }
  fd_.reset();
  return offset_;
}

void TarWriter::write(const void* data, std::size_t size) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  offset_ += size;
  if (buffer_.size() + size > kBufferSize) flush();
  if (size >= kBufferSize) {
    while (size > 0) {
      const ssize_t n = ::write(fd_.get(), p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw Error(str("tar ", path_.string(), ": write failed: ", std::strerror(errno),
                        "; check that the disk has room"));
      }
      p += n;
      size -= static_cast<std::size_t>(n);
    }
    return;
  }
  buffer_.insert(buffer_.end(), p, p + size);
}

void TarWriter::flush() {
  std::size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_.get(), buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(str("tar ", path_.string(), ": write failed: ", std::strerror(errno),
                      "; check that the disk has room"));
    }
    done += static_cast<std::size_t>(n);
  }
  buffer_.clear();
}

// ---- TarReader ----

TarReader::TarReader(std::filesystem::path path) : TarReader(net::open_sequential(path.string())) {}

TarReader::TarReader(std::unique_ptr<net::ByteSource> source) : source_(std::move(source)) {
  const auto size = source_->size();
  size_known_ = size.has_value();
  file_size_ = size.value_or(std::numeric_limits<std::uint64_t>::max());
}

void TarReader::seek(std::uint64_t offset) {
  if (offset % kBlock != 0 || offset > file_size_) {
    throw DataError(str("tar ", name(), ": offset ", offset, " is not a header of this file (",
                        file_size_, " bytes)"));
  }
  offset_ = offset;
  ended_ = false;
}

void TarReader::read(std::uint64_t offset, std::uint64_t size, std::uint8_t* out) const {
  if (offset > file_size_ || size > file_size_ - offset) {
    throw DataError(str("tar ", name(), ": ", size, " bytes at offset ", offset,
                        " run past the end of the file (", file_size_,
                        " bytes): the shard is truncated, or its index is stale"));
  }
  const std::size_t got = source_->read_at(offset, out, static_cast<std::size_t>(size));
  if (got < size) {
    throw DataError(str("tar ", name(), ": read at offset ", offset + got,
                        " failed: end of file (the shard is cut short)"));
  }
}

std::optional<TarMember> TarReader::next() {
  if (ended_) return std::nullopt;
  std::optional<std::string> long_name;
  bool has_pax_size = false;  // (not an optional: GCC 12 warns of it falsely)
  std::uint64_t pax_size = 0;
  std::uint64_t start = offset_;
  std::array<std::uint8_t, kBlock> header{};
  while (true) {
    if (size_known_ && file_size_ - std::min(file_size_, offset_) < kBlock) {
      if (offset_ < file_size_ || long_name || has_pax_size) {
        throw DataError(str("tar ", name(), ": cut short at offset ", offset_,
                            " (a header needs 512 bytes; the file has ", file_size_, ")"));
      }
      return std::nullopt;
    }
    if (!size_known_) {
      // A stream of unknown length ends where its bytes end.
      const std::size_t got = source_->read_at(offset_, header.data(), kBlock);
      if (got == 0 && !long_name && !has_pax_size) {
        ended_ = true;
        return std::nullopt;
      }
      if (got < kBlock) {
        throw DataError(str("tar ", name(), ": cut short at offset ", offset_ + got,
                            " (a header needs 512 bytes)"));
      }
    } else {
      read(offset_, kBlock, header.data());
    }
    if (std::all_of(header.begin(), header.end(), [](std::uint8_t b) { return b == 0; })) {
      ended_ = true;  // asked again, the end is not read twice (a stream cannot go back to it)
      return std::nullopt;
    }
    const auto stored = parse_number(header.data() + 148, 8);
    if (!stored || (*stored != checksum(header.data()) &&
                    static_cast<std::int64_t>(*stored) != signed_checksum(header.data()))) {
      throw DataError(str("tar ", name(), ": the header at offset ", offset_,
                          " has a wrong checksum: not a tar file, or corrupt there"));
    }
    const auto size = parse_number(header.data() + 124, 12);
    if (!size) {
      throw DataError(str("tar ", name(), ": the header at offset ", offset_,
                          " has a size that is not a number"));
    }
    const char type = static_cast<char>(header[156]);
    const bool extension = type == 'x' || type == 'L';
    const std::uint64_t data = offset_ + kBlock;
    const std::uint64_t member_size = extension ? *size : (has_pax_size ? pax_size : *size);
    if (data > file_size_ || member_size > file_size_ - data) {
      throw DataError(str("tar ", name(), ": the member at offset ", offset_, " needs ",
                          member_size, " bytes, past the end of the file (", file_size_,
                          " bytes): the shard is truncated"));
    }
    const std::uint64_t after = data + round_up(member_size);
    if (extension) {
      if (*size > (std::uint64_t{1} << 20)) {
        throw DataError(str("tar ", name(), ": the extended header at offset ", offset_, " is ",
                            *size, " bytes; refusing more than 1 MiB"));
      }
      std::string text(*size, '\0');
      read(data, *size, reinterpret_cast<std::uint8_t*>(text.data()));
      if (type == 'L') {
        long_name = std::string(text.c_str());
      } else {
        // Records "LEN key=value\n": LEN counts the whole record, its digits and newline too.
        std::size_t pos = 0;
        while (pos < text.size()) {
          const std::size_t space = text.find(' ', pos);
          const auto malformed = [&] {
            return DataError(str("tar ", name(), ": malformed pax record at offset ", data + pos));
          };
          if (space == std::string::npos || space == pos || space - pos > 7) throw malformed();
          std::size_t length = 0;
          for (std::size_t k = pos; k < space; ++k) {
            if (!std::isdigit(static_cast<unsigned char>(text[k]))) throw malformed();
            length = length * 10 + static_cast<std::size_t>(text[k] - '0');
          }
          if (length < space - pos + 2 || length > text.size() - pos ||
              text[pos + length - 1] != '\n') {
            throw malformed();
          }
          const std::string record = text.substr(space + 1, pos + length - space - 2);
          const std::size_t eq = record.find('=');
          if (eq != std::string::npos) {
            const std::string key = record.substr(0, eq);
            const std::string value = record.substr(eq + 1);
            if (key == "path") long_name = value;
            if (key == "size") {
              std::uint64_t v = 0;
              for (char c : value) {
                if (!std::isdigit(static_cast<unsigned char>(c)) || v > (~0ull) / 10) {
                  throw DataError(str("tar ", name(), ": pax size '", value, "' at offset ",
                                      data + pos, " is not a number"));
                }
                v = v * 10 + static_cast<std::uint64_t>(c - '0');
              }
              pax_size = v;
              has_pax_size = true;
            }
          }
          pos += length;
        }
      }
      offset_ = data + round_up(*size);
      continue;
    }
    offset_ = after;
    if (type != '0' && type != '\0' && type != '7') {  // folders, links, global pax headers
      long_name.reset();
      has_pax_size = false;
      start = offset_;
      continue;
    }
    std::string name;
    if (long_name) {
      name = *long_name;
    } else {
      name = field_string(header.data(), 100);
      const bool ustar = std::memcmp(header.data() + 257, "ustar", 5) == 0;
      const std::string prefix = ustar ? field_string(header.data() + 345, 155) : std::string();
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    return TarMember{std::move(name), start, data, member_size};
  }
}

std::vector<TarMember> list_tar(const std::filesystem::path& path) {
  TarReader reader(path);
  std::vector<TarMember> members;
  while (auto member = reader.next()) members.push_back(std::move(*member));
  return members;
}

std::optional<std::pair<std::string, std::string>> split_key(std::string_view name) {
  const std::size_t slash = name.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const std::size_t dot = name.find('.', base);
  if (dot == std::string_view::npos || dot == base) return std::nullopt;
  std::string ext(name.substr(dot + 1));
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::make_pair(std::string(name.substr(0, dot)), std::move(ext));
}

std::string webdataset_index(const std::vector<TarMember>& members) {
  std::string lines;
  std::size_t samples = 0;
  std::optional<std::string> key;
  for (const TarMember& m : members) {
    const auto split = split_key(m.name);
    if (!split) continue;
    if (key != split->first) {
      if (key) lines += '\n';
      key = split->first;
      ++samples;
    } else {
      lines += ' ';
    }
    lines += str(split->second, ' ', m.data_offset, ' ', m.size, ' ', m.name);
  }
  if (key) lines += '\n';
  return str("v1.2 ", samples, "\n", lines);
}

}  // namespace ferry::vision::detail
