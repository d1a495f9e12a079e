#include "net/url.h"

#include "ferry/error.h"

namespace ferry::net {

using ferry::detail::str;

bool is_remote(std::string_view text) noexcept {
  return text.starts_with("s3://") || text.starts_with("http://") || text.starts_with("https://") ||
         text.starts_with("pipe:");
}

Location parse_location(std::string_view text) {
  Location loc;
  loc.text = std::string(text);
  if (text.starts_with("pipe:")) {
    loc.scheme = Scheme::kPipe;
    if (text.size() == 5) throw DataError("shard 'pipe:': no command after 'pipe:'");
    return loc;
  }
  if (text.starts_with("s3://")) {
    loc.scheme = Scheme::kS3;
    const std::string_view rest = text.substr(5);
    const std::size_t slash = rest.find('/');
    loc.bucket = std::string(rest.substr(0, slash));
    if (loc.bucket.empty()) {
      throw DataError(str("shard '", text, "': no bucket; write s3://BUCKET/KEY"));
    }
    if (slash != std::string_view::npos) loc.key = std::string(rest.substr(slash + 1));
    return loc;
  }
  if (text.starts_with("http://") || text.starts_with("https://")) {
    loc.scheme = Scheme::kHttp;
    const std::size_t host = text.find("://") + 3;
    if (host >= text.size() || text[host] == '/') {
      throw DataError(str("shard '", redact(text), "': no host in the URL"));
    }
    return loc;
  }
  return loc;
}

std::string redact(std::string_view url) {
  std::string out(url);
  const std::size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const std::size_t host = scheme + 3;
    const std::size_t path = out.find_first_of("/?#", host);
    const std::size_t at = out.rfind('@', path == std::string::npos ? out.size() : path);
    if (at != std::string::npos && at >= host) out.replace(host, at - host, "***");
  }
  const std::size_t query = out.find('?');
  if (query != std::string::npos) {
    const std::size_t fragment = out.find('#', query);
    out.replace(query + 1, (fragment == std::string::npos ? out.size() : fragment) - query - 1,
                "***");
  }
  return out;
}

std::string percent_encode(std::string_view text, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace ferry::net
