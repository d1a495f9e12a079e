#pragma once

// Where a shard lives, as WebDataset's users write it: a local path, `s3://bucket/key`,
// `http(s)://host/path`, or `pipe:COMMAND` (the command's standard output is the shard). This
// layer knows nothing of tensors or datasets; it names places and keeps secrets out of text.

#include <optional>
#include <string>
#include <string_view>

namespace ferry::net {

enum class Scheme { kFile, kS3, kHttp, kPipe };

struct Location {
  Scheme scheme = Scheme::kFile;
  std::string text;    // as written (for a local path: the path)
  std::string bucket;  // s3: the bucket
  std::string key;     // s3: the key (no leading '/'); may be empty or end in '/' (a prefix)
};

// Parses a shard location; throws ferry::DataError naming the text for `s3://` without a
// bucket, a URL without a host, or an empty `pipe:`.
Location parse_location(std::string_view text);

// Whether `text` names a remote or piped shard (s3://, http://, https://, pipe:).
bool is_remote(std::string_view text) noexcept;

// A URL fit for an error message, a log or a trace: user and password, and the whole query
// string (where pre-signed URLs carry their signature and tokens), replaced by "***". Every
// message that names a URL goes through this.
std::string redact(std::string_view url);

// RFC 3986 percent-encoding of everything but unreserved characters; '/' kept when
// `keep_slash` (an S3 key as a URL path, as SigV4's canonical URI wants it).
std::string percent_encode(std::string_view text, bool keep_slash);

}  // namespace ferry::net
