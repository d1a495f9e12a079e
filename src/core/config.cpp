#include "ferry/config.h"

#include <charconv>
#include <cstdio>

#include "ferry/error.h"

#include "core/hash.h"

namespace ferry {

namespace {

const char* kind_name(Config::Kind kind) {
  switch (kind) {
    case Config::Kind::kNull:
      return "null";
    case Config::Kind::kScalar:
      return "a scalar";
    case Config::Kind::kList:
      return "a list";
    case Config::Kind::kMap:
      return "a map";
  }
  return "?";
}

void write(std::string& out, const Config& c) {
  switch (c.kind()) {
    case Config::Kind::kNull:
      out += "null";
      return;
    case Config::Kind::kScalar:
      detail::append_quoted(out, c.scalar());
      return;
    case Config::Kind::kList: {
      out += '[';
      bool first = true;
      for (const Config& item : c.items()) {
        if (!first) out += ',';
        first = false;
        write(out, item);
      }
      out += ']';
      return;
    }
    case Config::Kind::kMap: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : c.entries()) {
        if (!first) out += ',';
        first = false;
        detail::append_quoted(out, key);
        out += ':';
        write(out, value);
      }
      out += '}';
      return;
    }
  }
}

// Reads exactly what write() produces.
class TextParser {
 public:
  explicit TextParser(std::string_view text) : s_(text) {}

  Config parse_all() {
    Config c = value();
    if (pos_ != s_.size()) error("unexpected text after the value");
    return c;
  }

 private:
  Config value() {
    if (pos_ >= s_.size()) error("unexpected end");
    struct Depth {
      std::size_t& d;
      explicit Depth(std::size_t& depth) : d(++depth) {}
      ~Depth() { --d; }
    } depth(depth_);
    if (depth_ > kMaxDepth) error("nested deeper than 256 levels");
    const char c = s_[pos_];
    if (c == '"') return Config(string());
    if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
      return Config();
    }
    if (c == '[') {
      ++pos_;
      Config list = Config::list();
      if (peek(']')) return list;
      for (;;) {
        list.push_back(value());
        if (peek(']')) return list;
        expect(',');
      }
    }
    if (c == '{') {
      ++pos_;
      Config map = Config::map();
      if (peek('}')) return map;
      for (;;) {
        std::string key = string();
        expect(':');
        map.set(std::move(key), value());
        if (peek('}')) return map;
        expect(',');
      }
    }
    error("unexpected character");
  }

  std::string string() {
    expect('"');
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c == '\\') {
        if (pos_ >= s_.size()) error("unfinished escape");
        const char e = s_[pos_++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'r':
            c = '\r';
            break;
          case 'u': {
            if (pos_ + 4 > s_.size()) error("unfinished \\u escape");
            unsigned v = 0;
            const auto r = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, v, 16);
            if (r.ptr != s_.data() + pos_ + 4 || v > 0x1f) error("bad \\u escape");
            pos_ += 4;
            c = static_cast<char>(v);
            break;
          }
          default:
            c = e;
        }
      }
      out += c;
    }
    expect('"');
    return out;
  }

  bool peek(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!peek(c)) error(std::string("expected '") + c + "'");
  }
  [[noreturn]] void error(const std::string& what) const {
    throw ConfigError(detail::str("malformed configuration text at offset ", pos_, ": ", what));
  }

  static constexpr std::size_t kMaxDepth = 256;
  std::string_view s_;
  std::size_t pos_ = 0;
  std::size_t depth_ = 0;
};

}  // namespace

std::string ConfigMark::str() const {
  if (!known()) return file;
  return detail::str(file, ":", line, ":", column);
}

std::string ConfigMark::prefix() const {
  std::string s = str();
  return s.empty() ? s : s + ": ";
}

std::string Config::describe() const {
  return kind_ == Kind::kScalar ? "'" + scalar_ + "'"
         : kind_ == Kind::kNull ? std::string("nothing (null)")
                                : std::string(kind_name(kind_));
}

Config Config::list(std::vector<Config> items) {
  Config c;
  c.kind_ = Kind::kList;
  c.items_ = std::move(items);
  return c;
}

Config Config::map(std::vector<Entry> entries) {
  Config c;
  c.kind_ = Kind::kMap;
  for (auto& [key, value] : entries) c.set(std::move(key), std::move(value));
  return c;
}

const std::string& Config::scalar() const {
  if (kind_ != Kind::kScalar)
    throw ConfigError(detail::str("expected a scalar, found ", kind_name(kind_)));
  return scalar_;
}

const std::vector<Config>& Config::items() const {
  if (kind_ != Kind::kList)
    throw ConfigError(detail::str("expected a list, found ", kind_name(kind_)));
  return items_;
}

const std::vector<Config::Entry>& Config::entries() const {
  if (kind_ != Kind::kMap)
    throw ConfigError(detail::str("expected a map, found ", kind_name(kind_)));
  return entries_;
}

std::size_t Config::size() const noexcept {
  if (kind_ == Kind::kList) return items_.size();
  if (kind_ == Kind::kMap) return entries_.size();
  return 0;
}

const Config* Config::find(std::string_view key) const noexcept {
  if (kind_ != Kind::kMap) return nullptr;
  for (const auto& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

Config& Config::set(std::string key, Config value) {
  if (kind_ == Kind::kNull) kind_ = Kind::kMap;
  if (kind_ != Kind::kMap)
    throw ConfigError(detail::str("cannot set key '", key, "' of ", kind_name(kind_)));
  for (auto& entry : entries_) {
    if (entry.first == key) {
      entry.second = std::move(value);
      return entry.second;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
  return entries_.back().second;
}

bool Config::erase(std::string_view key) {
  if (kind_ != Kind::kMap) return false;
  return std::erase_if(entries_, [&](const Entry& e) { return e.first == key; }) > 0;
}

void Config::push_back(Config item) {
  if (kind_ == Kind::kNull) kind_ = Kind::kList;
  if (kind_ != Kind::kList) throw ConfigError(detail::str("cannot append to ", kind_name(kind_)));
  items_.push_back(std::move(item));
}

std::string Config::to_text() const {
  std::string out;
  write(out, *this);
  return out;
}

Config Config::parse_text(std::string_view text) { return TextParser(text).parse_all(); }

std::uint64_t Config::hash() const { return detail::fnv1a(to_text()); }

bool operator==(const Config& a, const Config& b) {
  return a.kind_ == b.kind_ && a.scalar_ == b.scalar_ && a.items_ == b.items_ &&
         a.entries_ == b.entries_;
}

std::string Config::format_double(double value) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

std::string hash_string(std::uint64_t hash) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

}  // namespace ferry
