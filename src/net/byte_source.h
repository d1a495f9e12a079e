#pragma once

// The bytes of a shard wherever it lives: a local file (pread), an object read front to back
// from one GET (s3:// and http(s)://), an object read by byte ranges, or a command's standard
// output (pipe:). Tar readers and datasets read through this and never see a URL's parts.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/http.h"

namespace ferry::net {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // The total size when known (a file's size, an object's length); nullopt for a pipe.
  virtual std::optional<std::uint64_t> size() = 0;
  // Up to `n` bytes at `offset` into `out`; fewer only at the end. A sequential source takes
  // only offsets at or past what it has read (what lies between is read and dropped), and throws
  // ferry::Error for an offset behind it.
  virtual std::size_t read_at(std::uint64_t offset, std::uint8_t* out, std::size_t n) = 0;
  virtual bool sequential() const noexcept = 0;
  // The shard's name for messages: a path, or a URL without secrets.
  virtual const std::string& name() const noexcept = 0;
};

// How a remote object is reached: the HTTP request (signed for S3) and the text for messages.
// S3 settings are read from the environment and the AWS files at this call, in this process.
Request request_for(const std::string& location, const RetryPolicy& retry = {});

// A shard read front to back from `offset` (a header's offset, from a checkpoint): a local file,
// one GET for s3:// and http(s)://, a command for pipe: (only from offset 0... or skipping).
std::unique_ptr<ByteSource> open_sequential(const std::string& location,
                                            std::uint64_t offset = 0,
                                            const RetryPolicy& retry = {});

// A remote object (s3://, http(s)://) read front to back from its first byte by a thread of its
// own, which keeps up to `ahead` bytes in memory: a stream opens its next shard with this while it
// reads the current one, so the next one's first bytes are here when it gets there. Failures
// come to the reader (as from open_sequential's source); dropping it stops the thread.
std::unique_ptr<ByteSource> open_read_ahead(const std::string& location,
                                            std::size_t ahead,
                                            const RetryPolicy& retry = {});

// A remote object read by byte ranges, each GET pinned to `info`'s ETag.
std::unique_ptr<ByteSource> open_ranged(const std::string& location,
                                        const ObjectInfo& info,
                                        const RetryPolicy& retry = {});

// The shard list a WebDataset location names: brace ranges expanded by the caller; here an
// `s3://bucket/prefix/` (ending in '/') is listed with ListObjectsV2, its `.tar` keys in order.
std::vector<std::string> list_s3_tars(const std::string& prefix_url, const RetryPolicy& retry = {});

}  // namespace ferry::net
