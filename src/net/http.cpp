#include "net/http.h"

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "net/aws.h"

namespace ferry::net {

using ferry::detail::str;

namespace {

std::atomic<std::uint64_t> g_requests{0};
std::atomic<std::uint64_t> g_retries{0};
std::atomic<std::uint64_t> g_bytes{0};
std::atomic<TransferObserver> g_observer{nullptr};

std::uint64_t monotonic_ns() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1'000'000'000ull +
         static_cast<std::uint64_t>(t.tv_nsec);
}

void observe(std::uint64_t start_ns, std::uint64_t bytes) noexcept {
  if (TransferObserver o = g_observer.load(std::memory_order_relaxed))
    o(start_ns, monotonic_ns(), bytes);
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { ::curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// curl runs with CURLOPT_NOSIGNAL (no alarm() in a threaded program), so a write to a socket the
// peer closed would raise SIGPIPE in the calling thread: blocked here for the call, and a
// SIGPIPE it raised is taken off the thread before the old mask comes back.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    ::pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        ::sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

class HeaderList {
 public:
  HeaderList() = default;
  HeaderList(const HeaderList&) = delete;
  HeaderList& operator=(const HeaderList&) = delete;
  ~HeaderList() { ::curl_slist_free_all(list_); }
  void add(const std::string& line) {
    curl_slist* next = ::curl_slist_append(list_, line.c_str());
    if (next == nullptr) throw std::bad_alloc();
    list_ = next;
  }
  curl_slist* get() const noexcept { return list_; }

 private:
  curl_slist* list_ = nullptr;
};

// This thread's easy handle (its connections are kept between requests). One made before a
// fork is left alone in the child: it holds the parent's connections.
CURL* thread_easy() {
  struct Handle {
    pid_t pid = 0;
    CURL* easy = nullptr;
    ~Handle() {
      if (easy != nullptr && pid == ::getpid()) {
        SigpipeGuard guard;
        ::curl_easy_cleanup(easy);
      }
    }
  };
  thread_local Handle handle;
  if (handle.easy != nullptr && handle.pid != ::getpid()) handle.easy = nullptr;
  if (handle.easy == nullptr) {
    global_init();
    handle.easy = ::curl_easy_init();
    handle.pid = ::getpid();
    if (handle.easy == nullptr) throw Error("curl_easy_init failed (out of memory?)");
  } else {
    ::curl_easy_reset(handle.easy);
  }
  return handle.easy;
}

// The settings every request shares: time limits, protocols, SigV4 signing.
// Sockets close on exec: a spawned worker or a pipe: command inherits no connection.
curl_socket_t open_socket(void*, curlsocktype, curl_sockaddr* address) {
  return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

void configure(CURL* easy, const Request& r, HeaderList& headers) {
  ::curl_easy_setopt(easy, CURLOPT_URL, r.url.c_str());
  ::curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, &open_socket);
  ::curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
  ::curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  ::curl_easy_setopt(easy, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
  ::curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT,
                     static_cast<long>(r.retry.connect_timeout.count()));
  ::curl_easy_setopt(easy, CURLOPT_USERAGENT, "ferry");
  ::curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, nullptr);  // bytes as stored, no gzip
  if (r.credentials) {
    const std::string sigv4 = "aws:amz:" + r.region + ":s3";
    ::curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4.c_str());
    ::curl_easy_setopt(easy, CURLOPT_USERNAME, r.credentials->access_key.c_str());
    ::curl_easy_setopt(easy, CURLOPT_PASSWORD, r.credentials->secret_key.c_str());
    // S3 wants the payload's hash on every SigV4 request, and curl before 7.86 does not send it
    // (curl#8810); a GET has no payload to sign.
    headers.add("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!r.credentials->session_token.empty()) {
      headers.add("x-amz-security-token: " + r.credentials->session_token);
    }
  } else {
    ::curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
    ::curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 5L);
  }
}

bool retryable_code(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

bool retryable_status(long status, const std::string& code) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
         status == 504 || code == "SlowDown" || code == "RequestTimeout" || code == "InternalError";
}

std::string xml_field(const std::string& body, const std::string& tag) {
  const std::string open = "<" + tag + ">";
  const auto a = body.find(open);
  if (a == std::string::npos) return {};
  const auto b = body.find("</" + tag + ">", a);
  if (b == std::string::npos) return {};
  return body.substr(a + open.size(), std::min<std::size_t>(b - a - open.size(), 300));
}

std::string advice(long status, const std::string& code) {
  if (code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId" ||
      code == "AuthorizationHeaderMalformed") {
    return "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE), "
           "the region (AWS_REGION) and the endpoint (AWS_ENDPOINT_URL)";
  }
  if (status == 403) {
    return "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE), "
           "the region (AWS_REGION), and that they may read this object";
  }
  if (status == 404) return "check the bucket, the key and the endpoint";
  if (status == 412) return "the object changed while it was read; run again";
  if (status == 0) return "check the endpoint and the network";
  return "check the store's status";
}

std::string describe_failure(const Request& r,
                             long status,
                             const std::string& code,
                             const std::string& message,
                             const std::string& transport,
                             int attempts) {
  std::string s = str(r.display, ": ");
  if (status != 0) {
    s += str("HTTP ", status);
    if (!code.empty()) s += " " + code;
    if (!message.empty()) s += " (" + message + ")";
  } else {
    s += transport;
  }
  s += str(" after ", attempts, attempts == 1 ? " attempt" : " attempts");
  s += "; " + advice(status, code);
  if ((status == 403 || status == 400) && !r.credentials_source.empty()) {
    s += " (credentials: " + r.credentials_source + ")";
  }
  return s;
}

bool cancelled(const Request& r) noexcept {
  return r.cancel != nullptr && r.cancel->load(std::memory_order_relaxed);
}

[[noreturn]] void throw_cancelled(const Request& r) {
  throw Error(str(r.display, ": the request was cancelled"));
}

void backoff(const Request& r, int failures) {
  const RetryPolicy& p = r.retry;
  thread_local std::minstd_rand rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  const auto cap =
      std::min<std::int64_t>(p.max_delay.count(), p.base_delay.count() << std::min(failures, 20));
  std::uniform_int_distribution<std::int64_t> jitter(0, std::max<std::int64_t>(cap, 1));
  ++g_retries;
  // In slices, so that a cancelled request does not sleep on.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(jitter(rng));
  while (std::chrono::steady_clock::now() < until) {
    if (cancelled(r)) throw_cancelled(r);
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(50), until - std::chrono::steady_clock::now()));
  }
}

// Cuts a transfer after `limit` without a byte either way (a stalled connection is retried).
// curl's own low-speed limit averages over seconds and lets a stall after a burst run on.
// Also ends it when `cancel` is set.
struct StallWatch {
  std::chrono::seconds limit;
  const std::atomic<bool>* cancel = nullptr;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  curl_off_t seen = -1;
  bool stalled = false;

  void arm(CURL* easy) {
    ::curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    ::curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, &StallWatch::on_progress);
    ::curl_easy_setopt(easy, CURLOPT_XFERINFODATA, this);
  }
  static int on_progress(void* user, curl_off_t, curl_off_t now, curl_off_t, curl_off_t up) {
    auto* w = static_cast<StallWatch*>(user);
    if (w->cancel != nullptr && w->cancel->load(std::memory_order_relaxed)) return 1;
    const auto t = std::chrono::steady_clock::now();
    if (now + up != w->seen) {
      w->seen = now + up;
      w->last = t;
      return 0;
    }
    if (t - w->last > w->limit) {
      w->stalled = true;
      return 1;  // CURLE_ABORTED_BY_CALLBACK
    }
    return 0;
  }
};

// One blocking request's answer.
struct Answer {
  CURLcode result = CURLE_OK;
  long status = 0;
  std::string etag;
  std::optional<std::uint64_t> length;       // Content-Length
  std::optional<std::uint64_t> range_total;  // the "/N" of Content-Range
  std::optional<std::uint64_t> range_start;
  std::string error_body;
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  const auto first = s.find_first_not_of(' ');
  return first == std::string::npos ? std::string() : s.substr(first);
}

void parse_header(Answer& a, const char* data, std::size_t n) {
  std::string line(data, n);
  if (line.rfind("HTTP/", 0) == 0) {
    a = Answer{};
    const auto space = line.find(' ');
    if (space != std::string::npos) a.status = std::strtol(line.c_str() + space + 1, nullptr, 10);
    return;
  }
  const auto colon = line.find(':');
  if (colon == std::string::npos) return;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string value = trim(line.substr(colon + 1));
  if (name == "etag") a.etag = value;
  if (name == "content-length") a.length = std::strtoull(value.c_str(), nullptr, 10);
  if (name == "content-range" && value.rfind("bytes ", 0) == 0) {
    a.range_start = std::strtoull(value.c_str() + 6, nullptr, 10);
    const auto slash = value.find('/');
    if (slash != std::string::npos && value[slash + 1] != '*') {
      a.range_total = std::strtoull(value.c_str() + slash + 1, nullptr, 10);
    }
  }
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  parse_header(*static_cast<Answer*>(user), data, size * n);
  return size * n;
}

// A blocking request, retried. `sink(answer, data, n)` takes body bytes of a 2xx answer and
// returns false to stop the transfer (a limit reached); `restart(answer)` is called before each
// attempt and returns the Range header to send ("" for none). `upload`: a PUT of that file's
// bytes, sent again from its start at each attempt.
template <class Sink, class Restart>
Answer perform(const Request& r,
               bool head,
               Sink&& sink,
               Restart&& restart,
               bool missing_ok,
               const std::string& if_match = {},
               const char* method = nullptr,
               std::FILE* upload = nullptr) {
  int failures = 0;
  int attempts = 0;
  while (true) {
    if (cancelled(r)) throw_cancelled(r);
    CURL* easy = thread_easy();
    HeaderList headers;
    configure(easy, r, headers);
    Answer answer;
    const std::string range = restart();
    if (!range.empty()) headers.add("Range: " + range);
    if (!if_match.empty() && if_match.rfind("W/", 0) != 0) headers.add("If-Match: " + if_match);
    ::curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers.get());
    if (head) ::curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
    if (method != nullptr) ::curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method);
    if (upload != nullptr) {
      std::rewind(upload);
      struct stat st {};
      ::fstat(::fileno(upload), &st);
      ::curl_easy_setopt(easy, CURLOPT_UPLOAD, 1L);
      ::curl_easy_setopt(easy, CURLOPT_READDATA, upload);
      ::curl_easy_setopt(easy, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(st.st_size));
    }
    ::curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &on_header);
    ::curl_easy_setopt(easy, CURLOPT_HEADERDATA, &answer);
    struct Context {
      Answer* answer;
      Sink* sink;
      std::exception_ptr failure;
      const std::atomic<bool>* cancel;
    } context{&answer, &sink, nullptr, r.cancel};
    auto write = +[](char* data, std::size_t size, std::size_t n, void* user) -> std::size_t {
      auto* c = static_cast<Context*>(user);
      const std::size_t bytes = size * n;
      try {  // nothing may unwind through curl
        if (c->cancel != nullptr && c->cancel->load(std::memory_order_relaxed)) return 0;
        if (c->answer->status < 200 || c->answer->status >= 300) {
          if (c->answer->error_body.size() < 65536) c->answer->error_body.append(data, bytes);
          return bytes;
        }
        g_bytes += bytes;
        return (*c->sink)(*c->answer, reinterpret_cast<const std::uint8_t*>(data), bytes) ? bytes
                                                                                          : 0;
      } catch (...) {
        c->failure = std::current_exception();
        return 0;
      }
    };
    ::curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, write);
    ::curl_easy_setopt(easy, CURLOPT_WRITEDATA, &context);
    StallWatch watch{r.retry.stall_timeout, r.cancel};
    watch.arm(easy);
    ++g_requests;
    ++attempts;
    const std::uint64_t bytes_before = g_bytes.load(std::memory_order_relaxed);
    const std::uint64_t started = monotonic_ns();
    {
      SigpipeGuard guard;
      answer.result = ::curl_easy_perform(easy);
    }
    observe(started, g_bytes.load(std::memory_order_relaxed) - bytes_before);
    if (context.failure) std::rethrow_exception(context.failure);
    if (cancelled(r)) throw_cancelled(r);
    const std::string code = xml_field(answer.error_body, "Code");
    if (answer.result == CURLE_WRITE_ERROR) return answer;  // the sink stopped it
    if (answer.result == CURLE_OK && answer.status >= 200 && answer.status < 300) return answer;
    if (answer.result == CURLE_OK && answer.status == 404 && missing_ok) return answer;
    const bool transport = answer.result != CURLE_OK;
    const bool retry = transport ? retryable_code(answer.result) || watch.stalled
                                 : retryable_status(answer.status, code);
    if (!retry || ++failures >= r.retry.max_attempts) {
      throw HttpError(
          describe_failure(r, transport ? 0 : answer.status, code,
                           xml_field(answer.error_body, "Message"),
                           watch.stalled ? str("no byte for ", r.retry.stall_timeout.count(), " s")
                           : transport   ? str("curl error ", static_cast<int>(answer.result), " (",
                                               ::curl_easy_strerror(answer.result), ")")
                                         : std::string(),
                           attempts),
          transport ? 0 : answer.status, code);
    }
    backoff(r, failures);
  }
}

}  // namespace

void set_transfer_observer(TransferObserver observer) noexcept { g_observer.store(observer); }

HttpCounters http_counters() noexcept {
  return {g_requests.load(), g_retries.load(), g_bytes.load()};
}

std::optional<std::string> http_get(const Request& request, bool missing_ok, std::size_t limit) {
  std::string body;
  bool too_big = false;
  const Answer a = perform(
      request, false,
      [&](const Answer&, const std::uint8_t* data, std::size_t n) {
        if (body.size() + n > limit) {
          too_big = true;
          return false;
        }
        body.append(reinterpret_cast<const char*>(data), n);
        return true;
      },
      [&] {
        body.clear();
        return std::string();
      },
      missing_ok);
  if (too_big) {
    throw DataError(
        str(request.display, ": more than ", limit, " bytes; not an index or a listing"));
  }
  if (a.status == 404) return std::nullopt;
  return body;
}

ObjectInfo http_head(const Request& request) {
  const Answer a = perform(
      request, true, [](const Answer&, const std::uint8_t*, std::size_t) { return true; },
      [] { return std::string(); }, false);
  if (!a.length) throw DataError(str(request.display, ": the server sent no Content-Length"));
  return {*a.length, a.etag};
}

void http_read_range(const Request& request,
                     const std::string& etag,
                     std::uint64_t offset,
                     std::size_t size,
                     std::uint8_t* out) {
  if (size == 0) return;
  std::size_t got = 0;
  // A server that ignores Range answers 200 with the whole body: its head is dropped.
  std::uint64_t skip = 0;
  bool first_bytes = true;
  const Answer a = perform(
      request, false,
      [&](const Answer& answer, const std::uint8_t* data, std::size_t n) {
        if (first_bytes && answer.status == 200) skip = offset + got;
        first_bytes = false;
        const std::size_t drop = static_cast<std::size_t>(std::min<std::uint64_t>(skip, n));
        skip -= drop;
        data += drop;
        n -= drop;
        const std::size_t take = std::min(n, size - got);
        std::memcpy(out + got, data, take);
        got += take;
        // A 206 ends by itself (the connection stays open for the next request); a 200 sends
        // the whole object, stopped once the range is in.
        return got < size || answer.status != 200;
      },
      [&] {
        skip = 0;
        first_bytes = true;
        return str("bytes=", offset + got, "-", offset + size - 1);
      },
      false, etag);
  (void)a;
  if (got < size) {
    throw DataError(str(request.display, ": ", size, " bytes at offset ", offset, " asked, ", got,
                        " came: the object is shorter than its index says"));
  }
}

void http_put_file(const Request& request, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw Error(
        str("upload to ", request.display, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> owner(file, &std::fclose);
  Request r = request;
  r.display = "upload of " + path + " to " + request.display;
  perform(
      r, false, [](const Answer&, const std::uint8_t*, std::size_t) { return true; },
      [] { return std::string(); }, false, {}, nullptr, file);
}

void http_delete(const Request& request) {
  const Answer a = perform(
      request, false, [](const Answer&, const std::uint8_t*, std::size_t) { return true; },
      [] { return std::string(); }, true, {}, "DELETE");
  (void)a;
}

bool http_exists(const Request& request) {
  const Answer a = perform(
      request, true, [](const Answer&, const std::uint8_t*, std::size_t) { return true; },
      [] { return std::string(); }, true);
  return a.status != 404;
}

// ---- HttpStream ----

struct HttpStream::Transfer {
  static constexpr std::size_t kHigh = 1 << 20;

  pid_t pid = ::getpid();
  std::uint64_t started = monotonic_ns();
  std::uint64_t received = 0;
  CURLM* multi = nullptr;
  CURL* easy = nullptr;
  HeaderList headers;
  Answer answer;
  std::vector<std::uint8_t> buffer;
  std::size_t pos = 0;
  bool paused = false;
  bool done = false;
  CURLcode result = CURLE_OK;
  std::uint64_t skip = 0;  // a 200 to a Range request: the bytes before the offset are dropped
  std::uint64_t asked_from = 0;
  std::exception_ptr failure;  // thrown in a callback, rethrown by the reader
  // The last time a byte came (or the reader let curl go on): a stall is measured from it.
  std::chrono::steady_clock::time_point last_byte = std::chrono::steady_clock::now();

  ~Transfer() {
    if (pid != ::getpid()) return;  // came through a fork: the parent's, left alone
    observe(started, received);
    SigpipeGuard guard;  // closing a TLS connection writes to it
    if (multi != nullptr && easy != nullptr) ::curl_multi_remove_handle(multi, easy);
    if (easy != nullptr) ::curl_easy_cleanup(easy);
    if (multi != nullptr) ::curl_multi_cleanup(multi);
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    try {  // nothing may unwind through curl
      return take(t, data, size * n);
    } catch (...) {
      t->failure = std::current_exception();
      return 0;
    }
  }

  static std::size_t take(Transfer* t, char* data, std::size_t bytes) {
    if (t->answer.status == 206 && t->asked_from > 0 && t->answer.range_start &&
        *t->answer.range_start != t->asked_from) {
      throw DataError(str("the server answered bytes from ", *t->answer.range_start,
                          " to a request for bytes from ", t->asked_from));
    }
    if (t->answer.status < 200 || t->answer.status >= 300) {
      if (t->answer.error_body.size() < 65536) t->answer.error_body.append(data, bytes);
      return bytes;
    }
    if (t->buffer.size() - t->pos >= kHigh) {
      t->paused = true;
      return CURL_WRITEFUNC_PAUSE;
    }
    t->last_byte = std::chrono::steady_clock::now();
    if (t->answer.status == 200 && t->asked_from > 0 && t->skip == 0 && !t->answer.range_start &&
        t->buffer.empty()) {
      t->skip = t->asked_from;
      t->asked_from = 0;
    }
    std::size_t drop = static_cast<std::size_t>(std::min<std::uint64_t>(t->skip, bytes));
    t->skip -= drop;
    if (t->pos > 0 && t->pos >= t->buffer.size() / 2) {
      t->buffer.erase(t->buffer.begin(), t->buffer.begin() + static_cast<std::ptrdiff_t>(t->pos));
      t->pos = 0;
    }
    t->buffer.insert(t->buffer.end(), data + drop, data + bytes);
    g_bytes += bytes;
    t->received += bytes;
    return bytes;
  }
};

HttpStream::HttpStream(Request request, std::uint64_t offset)
    : request_(std::move(request)), position_(offset), progress_mark_(offset) {
  start();
}

HttpStream::~HttpStream() = default;

void HttpStream::start() {
  global_init();
  transfer_.reset();
  auto t = std::make_unique<Transfer>();
  t->multi = ::curl_multi_init();
  t->easy = ::curl_easy_init();
  if (t->multi == nullptr || t->easy == nullptr) throw Error("curl: cannot make a handle");
  configure(t->easy, request_, t->headers);
  if (position_ > 0) {
    t->headers.add(str("Range: bytes=", position_, "-"));
    t->asked_from = position_;
  }
  if (!etag_.empty() && etag_.rfind("W/", 0) != 0) t->headers.add("If-Match: " + etag_);
  ::curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers.get());
  ::curl_easy_setopt(t->easy, CURLOPT_HEADERFUNCTION, &on_header);
  ::curl_easy_setopt(t->easy, CURLOPT_HEADERDATA, &t->answer);
  ::curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  ::curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
  ::curl_multi_add_handle(t->multi, t->easy);
  ++g_requests;
  transfer_ = std::move(t);
}

void HttpStream::fail_or_retry(long status, const std::string& why, bool retryable) {
  if (position_ > progress_mark_) {
    failures_ = 0;  // the last connection moved the body forward
    progress_mark_ = position_;
  }
  ++failures_;
  const Answer& a = transfer_->answer;
  const std::string code = xml_field(a.error_body, "Code");
  if (!retryable || failures_ >= request_.retry.max_attempts) {
    throw HttpError(describe_failure(request_, status, code, xml_field(a.error_body, "Message"),
                                     why, failures_) +
                        (position_ > 0 ? str(" (at byte ", position_, ")") : std::string()),
                    status, code);
  }
  transfer_.reset();
  backoff(request_, failures_);
  start();
}

// The first bytes of a 2xx answer fix the object's size and ETag (its headers are all in by
// then).
void HttpStream::take_answer() {
  const Transfer& t = *transfer_;
  if (size_ || t.answer.status < 200 || t.answer.status >= 300) return;
  if (t.buffer.empty() && !t.done) return;
  if (t.answer.range_total) {
    size_ = t.answer.range_total;
  } else if (t.answer.length) {
    size_ = *t.answer.length + (t.answer.status == 206 ? t.answer.range_start.value_or(0) : 0);
  }
  if (etag_.empty()) etag_ = t.answer.etag;
}

std::optional<std::uint64_t> HttpStream::size() {
  if (!size_) fill();
  take_answer();
  return size_;
}

// Lets curl take what has come (never waits): data flows in while the reader works on what it
// has, and a transfer paused for a full buffer goes on once half of it is read.
void HttpStream::pump() {
  Transfer& t = *transfer_;
  SigpipeGuard guard;
  if (t.paused && t.buffer.size() - t.pos < Transfer::kHigh / 2) {
    t.paused = false;
    t.last_byte = std::chrono::steady_clock::now();
    ::curl_easy_pause(t.easy, CURLPAUSE_CONT);
  }
  int running = 0;
  ::curl_multi_perform(t.multi, &running);
  int left = 0;
  while (CURLMsg* m = ::curl_multi_info_read(t.multi, &left)) {
    if (m->msg == CURLMSG_DONE) {
      t.done = true;
      t.result = m->data.result;
    }
  }
}

std::size_t HttpStream::read(std::uint8_t* out, std::size_t n) {
  if (!fill()) return 0;
  Transfer& t = *transfer_;
  if (!t.done && t.buffer.size() - t.pos < Transfer::kHigh / 2) pump();
  const std::size_t k = std::min(n, t.buffer.size() - t.pos);
  std::memcpy(out, t.buffer.data() + t.pos, k);
  t.pos += k;
  position_ += k;
  return k;
}

// Until bytes wait in the buffer (true) or the body has ended whole (false): failures retried,
// and a stall measured only over this wait (a reader away for a while, training or saving, did
// not stall the connection).
bool HttpStream::fill() {
  auto waiting_since = std::chrono::steady_clock::now();
  while (true) {
    if (cancelled(request_)) throw_cancelled(request_);  // polls below wait 200 ms at most
    Transfer& t = *transfer_;
    take_answer();
    if (t.failure) std::rethrow_exception(std::exchange(t.failure, nullptr));
    if (t.pos < t.buffer.size()) return true;
    if (t.done) {
      const long status = t.answer.status;
      if (t.result == CURLE_OK && status >= 200 && status < 300) {
        if (!size_ || position_ >= *size_) return false;
        fail_or_retry(0, str("the body ended at byte ", position_, " of ", *size_), true);
      } else if (t.result == CURLE_OK && status == 416 && size_ && position_ >= *size_) {
        return false;  // resumed at the very end (a tar without end blocks)
      } else if (t.result != CURLE_OK) {
        fail_or_retry(0,
                      str("curl error ", static_cast<int>(t.result), " (",
                          ::curl_easy_strerror(t.result), ")"),
                      retryable_code(t.result));
      } else {
        fail_or_retry(status, "", retryable_status(status, xml_field(t.answer.error_body, "Code")));
      }
      waiting_since = std::chrono::steady_clock::now();
      continue;
    }
    pump();
    if (t.done || t.pos < t.buffer.size()) continue;
    const auto now = std::chrono::steady_clock::now();
    if (!t.paused && now - std::max(t.last_byte, waiting_since) > request_.retry.stall_timeout) {
      fail_or_retry(0, str("no byte for ", request_.retry.stall_timeout.count(), " s"), true);
      waiting_since = std::chrono::steady_clock::now();
      continue;
    }
    if (!t.paused) ::curl_multi_poll(t.multi, nullptr, 0, 200, nullptr);
  }
}

}  // namespace ferry::net
