#pragma once

// HTTP(S) through libcurl, for shards in object stores: a whole small body (an index, a
// listing), a byte range, an object's size and ETag, and a body read front to back as it arrives.
//
// Every request retries what can pass (connection resets and refusals, timeouts and stalls, a body
// cut short, 500/502/503/504, S3's SlowDown) with exponential backoff and full jitter, and resumes
// a cut body with a Range request pinned to the object's ETag (If-Match), so a body that changed
// meanwhile is an error, never a splice of two objects. 4xx answers (403, 404, a bad signature)
// are not retried. A final error names the URL (redacted: no user, password or query string), the
// HTTP status, S3's error code and message, the attempts, and what to check.
//
// curl's handles belong to one thread of one process: each thread makes its own when it first
// needs one, and a handle that came through fork() is dropped unused (the child's copy of the
// parent's connection is never written to). Nothing of curl is shared across a fork.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/error.h"

namespace ferry::net {

struct S3Credentials;

// Retries and time limits. `max_attempts` counts attempts in a row that made no progress: a long
// body that is cut several times but advances each time is not given up on.
struct RetryPolicy {
  int max_attempts = 8;
  std::chrono::milliseconds base_delay{100};
  std::chrono::milliseconds max_delay{5000};
  std::chrono::seconds connect_timeout{10};
  std::chrono::seconds stall_timeout{30};  // no byte for this long: the connection is cut
};

// How one request is made: its URL (for curl) and its text for messages (redacted), and, for
// S3, the region and credentials it is signed with (SigV4), none for a plain or public URL.
struct Request {
  std::string url;
  std::string display;
  std::string region;
  std::shared_ptr<const S3Credentials> credentials;
  std::string credentials_source;  // where they came from (named in a 403's message), or ""
  RetryPolicy retry{};
  // Set (by another thread) to give the request up: it ends with ferry::Error ("cancelled") in
  // the middle of a body or a retry's backoff, or within about a second while it waits for an
  // answer (curl's progress callback slows to one call a second on a silent connection).
  const std::atomic<bool>* cancel = nullptr;
};

// A request that failed for good.
class HttpError : public DataError {
 public:
  HttpError(const std::string& message, long status, std::string code)
      : DataError(message), status_(status), code_(std::move(code)) {}
  long status() const noexcept { return status_; }            // 0: no HTTP answer
  const std::string& code() const noexcept { return code_; }  // S3's error code, or ""

 private:
  long status_;
  std::string code_;
};

struct ObjectInfo {
  std::uint64_t size = 0;
  std::string etag;  // as the server sent it, quotes included; empty if none
};

// Told of each transfer when it ends (every attempt of every request, and a stream's body), on
// the thread that made it: its start and end (CLOCK_MONOTONIC, ns) and the bytes received. One
// per process; a worker that traces sets it (nullptr: none).
using TransferObserver = void (*)(std::uint64_t start_ns,
                                  std::uint64_t end_ns,
                                  std::uint64_t bytes);
void set_transfer_observer(TransferObserver observer) noexcept;

// Counters of this process's requests, for stats and tests.
struct HttpCounters {
  std::uint64_t requests = 0;
  std::uint64_t retries = 0;
  std::uint64_t bytes = 0;
};
HttpCounters http_counters() noexcept;

// The whole body of a GET (for small objects: listings, indexes; at most `limit` bytes).
// nullopt for a 404 when `missing_ok`.
std::optional<std::string> http_get(const Request& request,
                                    bool missing_ok = false,
                                    std::size_t limit = 256u << 20);

// HEAD: the object's size and ETag.
ObjectInfo http_head(const Request& request);

// `size` bytes at `offset` into `out`, from a ranged GET pinned to `etag` when given.
void http_read_range(const Request& request,
                     const std::string& etag,
                     std::uint64_t offset,
                     std::size_t size,
                     std::uint8_t* out);

// PUT of a local file's bytes (an upload; retried whole).
void http_put_file(const Request& request, const std::string& path);

// DELETE; an object already gone is no error.
void http_delete(const Request& request);

// Whether the object exists (HEAD: 2xx true, 404 false; anything else throws HttpError).
bool http_exists(const Request& request);

// A body read front to back as it arrives, from one GET (a new ranged GET, pinned to the ETag,
// only after a failure). At most about 1 MiB is held: curl is paused while the reader lags.
class HttpStream {
 public:
  HttpStream(Request request, std::uint64_t offset);
  ~HttpStream();
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  // Up to `n` bytes; 0 only at the end of the body. Throws HttpError when a failure outlasts the
  // retries.
  std::size_t read(std::uint8_t* out, std::size_t n);
  // The object's size once the first answer came (nullopt before, or when the server sent none).
  std::optional<std::uint64_t> size();
  std::uint64_t position() const noexcept { return position_; }
  // The object's ETag, once the first answer came ("" if the server sent none).
  const std::string& etag() const noexcept { return etag_; }

 private:
  struct Transfer;
  void start();
  void take_answer();
  void pump();
  bool fill();
  void fail_or_retry(long status, const std::string& why, bool retryable);

  Request request_;
  std::uint64_t position_;
  std::optional<std::uint64_t> size_;
  std::string etag_;
  int failures_ = 0;
  std::uint64_t progress_mark_ = 0;
  std::unique_ptr<Transfer> transfer_;
};

}  // namespace ferry::net
