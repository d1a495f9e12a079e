#include "net/byte_source.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "ferry/error.h"

#include "ipc/child_process.h"
#include "ipc/unique_fd.h"
#include "net/aws.h"
#include "net/url.h"

extern char** environ;

namespace ferry::net {

using ferry::detail::str;

namespace {

class FileSource : public ByteSource {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {
    fd_.reset(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) throw DataError(str("shard ", path_, ": cannot open: ", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw DataError(str("shard ", path_, ": not a regular file"));
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  std::optional<std::uint64_t> size() override { return size_; }
  std::size_t read_at(std::uint64_t offset, std::uint8_t* out, std::size_t n) override {
    std::size_t done = 0;
    while (done < n) {
      const ssize_t k = ::pread(fd_.get(), out + done, n - done, static_cast<off_t>(offset + done));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) {
        throw DataError(str("shard ", path_, ": read at offset ", offset + done,
                            " failed: ", std::strerror(errno)));
      }
      if (k == 0) break;
      done += static_cast<std::size_t>(k);
    }
    return done;
  }
  bool sequential() const noexcept override { return false; }
  const std::string& name() const noexcept override { return path_; }

 private:
  std::string path_;
  ipc::UniqueFd fd_;
  std::uint64_t size_ = 0;
};

// Reads forward only: bytes between the position and a later offset are read and dropped.
class ForwardSource : public ByteSource {
 public:
  std::size_t read_at(std::uint64_t offset, std::uint8_t* out, std::size_t n) override {
    if (offset < position_) {
      throw Error(str("shard ", name(), ": read at offset ", offset, " behind the stream's ",
                      position_, " (a stream reads front to back)"));
    }
    std::uint8_t scratch[65536];
    while (position_ < offset) {
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(sizeof scratch, offset - position_));
      const std::size_t got = pull(scratch, want);
      if (got == 0) return 0;
      position_ += got;
    }
    std::size_t done = 0;
    while (done < n) {
      const std::size_t got = pull(out + done, n - done);
      if (got == 0) break;
      done += got;
      position_ += got;
    }
    return done;
  }
  bool sequential() const noexcept override { return true; }

 protected:
  explicit ForwardSource(std::uint64_t position) : position_(position) {}
  // Up to n bytes from the stream; 0 at its end.
  virtual std::size_t pull(std::uint8_t* out, std::size_t n) = 0;

 private:
  std::uint64_t position_;
};

class HttpStreamSource : public ForwardSource {
 public:
  HttpStreamSource(Request request, std::uint64_t offset)
      : ForwardSource(offset), name_(request.display), stream_(std::move(request), offset) {}
  std::optional<std::uint64_t> size() override { return stream_.size(); }
  const std::string& name() const noexcept override { return name_; }

 private:
  std::size_t pull(std::uint8_t* out, std::size_t n) override { return stream_.read(out, n); }
  std::string name_;
  HttpStream stream_;
};

// The state a read-ahead thread and its reader share (the thread may outlive the reader: it is
// detached, and stops at its next chunk once told).
struct ReadAhead {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::uint8_t> bytes;
  std::optional<std::uint64_t> size;
  bool size_known = false;
  bool ended = false;
  bool stop = false;
  std::exception_ptr failure;
};

class ReadAheadSource : public ForwardSource {
 public:
  ReadAheadSource(Request request, std::size_t ahead)
      : ForwardSource(0), name_(request.display), state_(std::make_shared<ReadAhead>()) {
    std::thread([state = state_, request = std::move(request), ahead]() mutable {
      try {
        HttpStream stream(std::move(request), 0);
        const auto size = stream.size();
        {
          const std::lock_guard<std::mutex> lock(state->mutex);
          state->size = size;
          state->size_known = true;
        }
        state->changed.notify_all();
        std::vector<std::uint8_t> chunk(1 << 16);
        while (true) {
          {
            std::unique_lock<std::mutex> lock(state->mutex);
            state->changed.wait(lock, [&] { return state->stop || state->bytes.size() < ahead; });
            if (state->stop) return;
          }
          const std::size_t n = stream.read(chunk.data(), chunk.size());
          {
            const std::lock_guard<std::mutex> lock(state->mutex);
            if (n == 0) {
              state->ended = true;
            } else {
              state->bytes.insert(state->bytes.end(), chunk.begin(),
                                  chunk.begin() + static_cast<std::ptrdiff_t>(n));
            }
          }
          state->changed.notify_all();
          if (n == 0) return;
        }
      } catch (...) {
        {
          const std::lock_guard<std::mutex> lock(state->mutex);
          state->failure = std::current_exception();
          state->size_known = true;
        }
        state->changed.notify_all();
      }
    }).detach();
  }
  ~ReadAheadSource() override {
    {
      const std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
    }
    state_->changed.notify_all();
  }
  std::optional<std::uint64_t> size() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->changed.wait(lock, [&] { return state_->size_known; });
    if (state_->failure && !state_->size) std::rethrow_exception(state_->failure);
    return state_->size;
  }
  const std::string& name() const noexcept override { return name_; }

 private:
  std::size_t pull(std::uint8_t* out, std::size_t n) override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->changed.wait(lock, [&] {
      return !state_->bytes.empty() || state_->ended || state_->failure != nullptr;
    });
    if (state_->bytes.empty()) {
      if (state_->failure) std::rethrow_exception(state_->failure);
      return 0;
    }
    const std::size_t k = std::min(n, state_->bytes.size());
    std::copy_n(state_->bytes.begin(), k, out);
    state_->bytes.erase(state_->bytes.begin(),
                        state_->bytes.begin() + static_cast<std::ptrdiff_t>(k));
    lock.unlock();
    state_->changed.notify_all();
    return k;
  }
  std::string name_;
  std::shared_ptr<ReadAhead> state_;
};

class RangeSource : public ByteSource {
 public:
  RangeSource(Request request, ObjectInfo info)
      : request_(std::move(request)), info_(std::move(info)) {}
  std::optional<std::uint64_t> size() override { return info_.size; }
  std::size_t read_at(std::uint64_t offset, std::uint8_t* out, std::size_t n) override {
    if (offset >= info_.size) return 0;
    const std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, info_.size - offset));
    http_read_range(request_, info_.etag, offset, take, out);
    return take;
  }
  bool sequential() const noexcept override { return false; }
  const std::string& name() const noexcept override { return request_.display; }

 private:
  Request request_;
  ObjectInfo info_;
};

// pipe:COMMAND, run by /bin/sh in a process group of its own; its exit status is checked at
// the end of its output, as WebDataset does, so a failed download is an error, not a short shard.
class PipeSource : public ForwardSource {
 public:
  explicit PipeSource(const std::string& location) : ForwardSource(0), name_(redact(location)) {
    const std::string command = location.substr(5);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::system_error(errno, std::generic_category(), "pipe2 for " + name_);
    }
    read_.reset(fds[0]);
    ipc::UniqueFd write_end(fds[1]);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
    ::posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
    ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    sigset_t none;
    sigset_t defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);  // the command dies of SIGPIPE when its reader is gone
    sigaddset(&defaults, SIGINT);
    ::posix_spawnattr_setsigmask(&attr, &none);
    ::posix_spawnattr_setsigdefault(&attr, &defaults);
    ::posix_spawnattr_setpgroup(&attr, 0);
    ::posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    pid_t pid = -1;
    const int rc =
        ::posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char**>(argv), environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      throw DataError(str("shard ", name_, ": cannot start /bin/sh: ", std::strerror(rc)));
    }
    child_ = ipc::ChildProcess(pid);
  }
  ~PipeSource() override {
    if (!child_.reaped()) ::kill(-child_.pid(), SIGKILL);  // the command and what it started
  }
  std::optional<std::uint64_t> size() override { return std::nullopt; }
  const std::string& name() const noexcept override { return name_; }

 private:
  std::size_t pull(std::uint8_t* out, std::size_t n) override {
    while (true) {
      const ssize_t k = ::read(read_.get(), out, n);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) throw DataError(str("shard ", name_, ": read failed: ", std::strerror(errno)));
      if (k > 0) return static_cast<std::size_t>(k);
      const ipc::ExitStatus status = child_.terminate(std::chrono::seconds(60));
      if (status.exit_code != 0) {
        throw DataError(str("shard ", name_, ": the command ", status.describe(),
                            " after writing its output; check the command"));
      }
      return 0;
    }
  }
  std::string name_;
  ipc::UniqueFd read_;
  ipc::ChildProcess child_;
};

std::string xml_unescape(std::string s) {
  static const std::pair<const char*, const char*> kEntities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : kEntities) {
    std::size_t at = 0;
    while ((at = s.find(from, at)) != std::string::npos) {
      s.replace(at, std::strlen(from), to);
      at += std::strlen(to);
    }
  }
  return s;
}

}  // namespace

Request request_for(const std::string& location, const RetryPolicy& retry) {
  const Location loc = parse_location(location);
  Request r;
  r.retry = retry;
  if (loc.scheme == Scheme::kS3) {
    const S3Settings s = cached_s3_settings();
    r.credentials_source = s.source;
    r.url = s.object_url(loc.bucket, loc.key);
    r.display = location;  // s3://bucket/key carries no secret
    r.region = s.region;
    if (s.credentials) r.credentials = std::make_shared<const S3Credentials>(*s.credentials);
    return r;
  }
  if (loc.scheme == Scheme::kHttp) {
    r.url = location;
    r.display = redact(location);
    return r;
  }
  throw Error(str("request_for: '", redact(location), "' is not an s3:// or http(s):// URL"));
}

std::unique_ptr<ByteSource> open_sequential(const std::string& location,
                                            std::uint64_t offset,
                                            const RetryPolicy& retry) {
  const Location loc = parse_location(location);
  switch (loc.scheme) {
    case Scheme::kFile:
      return std::make_unique<FileSource>(location);
    case Scheme::kPipe: {
      auto pipe = std::make_unique<PipeSource>(location);
      if (offset > 0) {
        std::uint8_t none;
        pipe->read_at(offset, &none, 0);  // a command starts at its first byte: skip to offset
      }
      return pipe;
    }
    case Scheme::kS3:
    case Scheme::kHttp:
      return std::make_unique<HttpStreamSource>(request_for(location, retry), offset);
  }
  throw Error("open_sequential: unknown scheme");
}

std::unique_ptr<ByteSource> open_read_ahead(const std::string& location,
                                            std::size_t ahead,
                                            const RetryPolicy& retry) {
  return std::make_unique<ReadAheadSource>(request_for(location, retry), ahead);
}

std::unique_ptr<ByteSource> open_ranged(const std::string& location,
                                        const ObjectInfo& info,
                                        const RetryPolicy& retry) {
  return std::make_unique<RangeSource>(request_for(location, retry), info);
}

std::vector<std::string> list_s3_tars(const std::string& prefix_url, const RetryPolicy& retry) {
  const Location loc = parse_location(prefix_url);
  if (loc.scheme != Scheme::kS3) throw Error("list_s3_tars: not an s3:// URL");
  const S3Settings s = cached_s3_settings();
  std::vector<std::string> out;
  std::string token;
  for (int page = 0;; ++page) {
    Request r;
    r.retry = retry;
    r.region = s.region;
    if (s.credentials) r.credentials = std::make_shared<const S3Credentials>(*s.credentials);
    r.credentials_source = s.source;
    // Query parameters sorted by name and encoded, as SigV4's canonical query string has them.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + percent_encode(token, false) + "&";
    // One level, as a local folder is listed: keys under deeper prefixes are not this folder's.
    query += "delimiter=%2F&list-type=2&prefix=" + percent_encode(loc.key, false);
    r.url = s.bucket_url(loc.bucket) + "?" + query;
    r.display = str(prefix_url, " (ListObjectsV2, page ", page + 1, ")");
    const std::string body = *http_get(r);
    std::size_t at = 0;
    while ((at = body.find("<Key>", at)) != std::string::npos) {
      const std::size_t end = body.find("</Key>", at);
      if (end == std::string::npos) break;
      const std::string key = xml_unescape(body.substr(at + 5, end - at - 5));
      if (key.size() > 4 && key.compare(key.size() - 4, 4, ".tar") == 0) {
        out.push_back("s3://" + loc.bucket + "/" + key);
      }
      at = end;
    }
    const bool truncated = body.find("<IsTruncated>true</IsTruncated>") != std::string::npos;
    if (!truncated) break;
    const auto t = body.find("<NextContinuationToken>");
    const auto te = t == std::string::npos ? t : body.find("</NextContinuationToken>", t);
    if (te == std::string::npos) {
      throw DataError(str("shards ", prefix_url, ": the store says its listing goes on (page ",
                          page + 1,
                          ") but gives no continuation token; the listing would be "
                          "cut short: list the shards with a brace pattern instead"));
    }
    token = xml_unescape(body.substr(t + 23, te - t - 23));
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    throw DataError(str("shards ", prefix_url, ": no .tar object under this prefix (",
                        s.custom_endpoint ? "endpoint " + redact(s.endpoint) : "AWS S3", ")"));
  }
  return out;
}

}  // namespace ferry::net
