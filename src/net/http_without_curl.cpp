// The build found no libcurl (Debian: libcurl4-openssl-dev): remote shards are a clear error.

#include "net/http.h"

namespace ferry::net {

namespace {
[[noreturn]] void no_curl(const Request& r) {
  throw Error("cannot read " + r.display +
              ": this ferry was built without libcurl; install libcurl4-openssl-dev (7.75 or "
              "later) and build again");
}
}  // namespace

HttpCounters http_counters() noexcept { return {}; }
void set_transfer_observer(TransferObserver) noexcept {}
std::optional<std::string> http_get(const Request& r, bool, std::size_t) { no_curl(r); }
ObjectInfo http_head(const Request& r) { no_curl(r); }
void http_put_file(const Request& r, const std::string&) { no_curl(r); }
void http_delete(const Request& r) { no_curl(r); }
bool http_exists(const Request& r) { no_curl(r); }
void http_read_range(
    const Request& r, const std::string&, std::uint64_t, std::size_t, std::uint8_t*) {
  no_curl(r);
}

struct HttpStream::Transfer {};
HttpStream::HttpStream(Request request, std::uint64_t offset)
    : request_(std::move(request)), position_(offset) {
  no_curl(request_);
}
HttpStream::~HttpStream() = default;
std::size_t HttpStream::read(std::uint8_t*, std::size_t) { no_curl(request_); }
std::optional<std::uint64_t> HttpStream::size() { no_curl(request_); }

}  // namespace ferry::net
