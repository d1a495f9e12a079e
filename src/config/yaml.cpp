// YAML text to a Config tree with marks, ${VAR} expansion, and the reverse for printing.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "ferry/error.h"
#include "ferry/pipeline.h"

namespace ferry {

namespace {

// A document larger than this (after aliases are expanded) is refused: a billion-laughs file
// would otherwise expand into gigabytes.
constexpr std::size_t kMaxNodes = 1'000'000;

ConfigMark mark_of(const std::string& file, const YAML::Mark& m) {
  if (m.is_null()) return ConfigMark{file, 0, 0};
  return ConfigMark{file, static_cast<std::size_t>(m.line) + 1,
                    static_cast<std::size_t>(m.column) + 1};
}

std::string at(const ConfigMark& mark) {
  const std::string s = mark.str();
  return s.empty() ? std::string() : s + ": ";
}

bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

// ${VAR} and ${VAR:-default} (the default when VAR is unset or empty, as in the shell; it may
// hold ${...} itself).
std::string expand(const std::string& text, const ConfigMark& mark) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = text.find("${", i);
    if (start == std::string::npos) {
      out.append(text, i, std::string::npos);
      break;
    }
    out.append(text, i, start - i);
    // The matching '}': a default may itself hold ${...}.
    std::size_t close = std::string::npos;
    for (std::size_t k = start + 2, depth = 1; k < text.size(); ++k) {
      if (text.compare(k, 2, "${") == 0) {
        ++depth;
        ++k;
      } else if (text[k] == '}' && --depth == 0) {
        close = k;
        break;
      }
    }
    if (close == std::string::npos) {
      throw ConfigError(detail::str(at(mark), "'", text, "': '${' without a closing '}'; write ",
                                    "${NAME} or ${NAME:-default}"));
    }
    const std::string inner = text.substr(start + 2, close - start - 2);
    std::size_t n = 0;
    while (n < inner.size() && (n == 0 ? is_name_start(inner[n]) : is_name_char(inner[n]))) ++n;
    const std::string name = inner.substr(0, n);
    const bool has_default = inner.compare(n, 2, ":-") == 0;
    if (name.empty() || (n != inner.size() && !has_default)) {
      throw ConfigError(detail::str(at(mark), "'${", inner, "}': expected ${NAME} or ",
                                    "${NAME:-default}, NAME being letters, digits and '_'"));
    }
    const char* value = std::getenv(name.c_str());
    if (value != nullptr && *value != '\0') {
      out += value;
    } else if (has_default) {
      out += expand(inner.substr(n + 2), mark);
    } else {
      throw ConfigError(detail::str(at(mark), "environment variable ", name,
                                    " is not set; set it, or give a default: ${", name,
                                    ":-value}"));
    }
    i = close + 1;
  }
  return out;
}

class Converter {
 public:
  explicit Converter(std::string file) : file_(std::move(file)) {}

  Config convert(const YAML::Node& node) {
    if (++nodes_ > kMaxNodes) {
      throw ConfigError(detail::str(at(mark_of(file_, node.Mark())), "the document expands to ",
                                    "more than ", kMaxNodes,
                                    " nodes (aliases repeating aliases?); refused"));
    }
    const ConfigMark mark = mark_of(file_, node.Mark());
    Config out;
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        break;
      case YAML::NodeType::Scalar:
        out = Config(expand(node.Scalar(), mark));
        break;
      case YAML::NodeType::Sequence:
        out = Config::list();
        for (const YAML::Node& item : node) out.push_back(convert(item));
        break;
      case YAML::NodeType::Map: {
        out = Config::map();
        std::set<std::string> seen;
        for (const auto& entry : node) {
          const YAML::Node& key = entry.first;
          const ConfigMark key_mark = mark_of(file_, key.Mark());
          if (!key.IsScalar()) {
            throw ConfigError(detail::str(at(key_mark), "a map key must be a plain name, found ",
                                          key.IsMap()        ? "a map"
                                          : key.IsSequence() ? "a list"
                                                             : "null"));
          }
          const std::string& name = key.Scalar();
          if (!seen.insert(name).second) {
            throw ConfigError(detail::str(at(key_mark), "duplicate key '", name,
                                          "': it is already set above in the same map; keep one"));
          }
          out.set(name, convert(entry.second));
        }
        break;
      }
    }
    out.set_mark(mark);
    return out;
  }

 private:
  std::string file_;
  std::size_t nodes_ = 0;
};

// The line and column of the first byte that is not UTF-8, or nothing.
void check_utf8(std::string_view text, const std::string& file) {
  std::size_t line = 1;
  std::size_t column = 1;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t len = 0;
    if (c < 0x80) {
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && c >= 0xC2) {
      len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
    } else if ((c & 0xF8) == 0xF0 && c <= 0xF4) {
      len = 4;
    }
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    }
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(c));
      throw ConfigError(detail::str(file, ":", line, ":", column, ": byte ", hex,
                                    " is not UTF-8; save the file as UTF-8"));
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += len;
  }
}

void emit(YAML::Emitter& out, const Config& node) {
  switch (node.kind()) {
    case Config::Kind::kNull:
      out << YAML::Null;
      break;
    case Config::Kind::kScalar:
      out << node.scalar();
      break;
    case Config::Kind::kList: {
      bool flat = true;
      for (const Config& item : node.items()) flat = flat && item.is_scalar();
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const Config& item : node.items()) emit(out, item);
      out << YAML::EndSeq;
      break;
    }
    case Config::Kind::kMap:
      out << YAML::BeginMap;
      for (const auto& [key, value] : node.entries()) {
        out << YAML::Key << key << YAML::Value;
        emit(out, value);
      }
      out << YAML::EndMap;
      break;
  }
}

}  // namespace

Config parse_yaml(std::string_view text, const std::string& file) {
  check_utf8(text, file);
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(text));
  } catch (const YAML::Exception& e) {
    const bool variables = text.find("${") != std::string_view::npos;
    throw ConfigError(detail::str(at(mark_of(file, e.mark)), "YAML syntax: ", e.msg,
                                  variables ? " (inside {...} or [...], quote a value that holds "
                                              "${...}: \"${NAME}\")"
                                            : ""));
  }
  if (documents.empty()) return Config();
  if (documents.size() > 1) {
    throw ConfigError(detail::str(at(mark_of(file, documents[1].Mark())),
                                  "a second YAML document ('---'); a pipeline is one document"));
  }
  return Converter(file).convert(documents.front());
}

Config read_yaml(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(file, ec);
    throw ConfigError(detail::str(
        file.string(), ": ", exists ? "cannot be read (check its permissions)" : "no such file",
        exists ? "" : "; check the path"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  Config root = parse_yaml(text, file.string());
  if (root.is_null()) {
    throw ConfigError(detail::str(file.string(), ": the file is empty; a pipeline needs at least ",
                                  "a 'dataset' section (see configs/demo.yaml)"));
  }
  return root;
}

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  out.SetIndent(2);
  emit(out, config);
  return std::string(out.c_str()) + "\n";
}

}  // namespace ferry
