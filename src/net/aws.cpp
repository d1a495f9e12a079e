#include "net/aws.h"

#include <pthread.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>

#include "ferry/error.h"

#include "net/url.h"

namespace ferry::net {

using ferry::detail::str;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

std::string home_file(const char* override_var, const char* name) {
  std::string path = env(override_var);
  if (!path.empty()) return path;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/.aws/" + name;
}

// An AWS INI file: section -> key -> value. A nested block ("s3 =" then indented lines) is
// flattened to "s3.key".
using Ini = std::map<std::string, std::map<std::string, std::string>>;

Ini read_ini(const std::string& path) {
  Ini ini;
  std::ifstream in(path);
  std::string section;
  std::string nested;
  for (std::string line; std::getline(in, line);) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      nested.clear();
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    const std::string key = trim(line.substr(0, eq));
    const std::string value = trim(line.substr(eq + 1));
    if (!indented) nested.clear();
    if (!indented && value.empty()) {
      nested = key;
      continue;
    }
    ini[section][nested.empty() ? key : nested + "." + key] = value;
  }
  return ini;
}

const std::map<std::string, std::string>* section(const Ini& ini, const std::string& name) {
  const auto it = ini.find(name);
  return it == ini.end() ? nullptr : &it->second;
}

std::string get(const std::map<std::string, std::string>* s, const std::string& key) {
  if (s == nullptr) return {};
  const auto it = s->find(key);
  return it == s->end() ? std::string() : it->second;
}

}  // namespace

S3Settings resolve_s3_settings() {
  S3Settings s;
  const std::string profile_env = env("AWS_PROFILE");
  const std::string profile = profile_env.empty() ? "default" : profile_env;
  const std::string credentials_path = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::string config_path = home_file("AWS_CONFIG_FILE", "config");
  const Ini credentials_ini = credentials_path.empty() ? Ini{} : read_ini(credentials_path);
  const Ini config_ini = config_path.empty() ? Ini{} : read_ini(config_path);
  const auto* cred_section = section(credentials_ini, profile);
  const auto* config_section =
      section(config_ini, profile == "default" ? "default" : "profile " + profile);
  if (!profile_env.empty() && cred_section == nullptr && config_section == nullptr) {
    throw ConfigError(str("AWS_PROFILE=", profile_env, ": no such profile in ", credentials_path,
                          " or ", config_path, "; unset AWS_PROFILE or add the profile"));
  }

  // Credentials: the environment first, then the profile (credentials file, then config file),
  // as the AWS CLI looks for them.
  const std::string key_id = env("AWS_ACCESS_KEY_ID");
  const std::string secret = env("AWS_SECRET_ACCESS_KEY");
  if (!key_id.empty() || !secret.empty()) {
    if (key_id.empty() || secret.empty()) {
      throw ConfigError(str("AWS credentials: ",
                            key_id.empty()
                                ? "AWS_SECRET_ACCESS_KEY is set but not AWS_ACCESS_KEY_ID"
                                : "AWS_ACCESS_KEY_ID is set but not AWS_SECRET_ACCESS_KEY",
                            "; set both, or neither to use a profile"));
    }
    s.credentials = S3Credentials{key_id, secret, env("AWS_SESSION_TOKEN")};
    s.source = "the environment (AWS_ACCESS_KEY_ID)";
  } else {
    for (const auto& [sec, path] :
         {std::pair{cred_section, credentials_path}, std::pair{config_section, config_path}}) {
      const std::string id = get(sec, "aws_access_key_id");
      const std::string key = get(sec, "aws_secret_access_key");
      if (id.empty() && key.empty()) continue;
      if (id.empty() || key.empty()) {
        throw ConfigError(str("AWS profile '", profile, "' in ", path, " has ",
                              id.empty() ? "aws_secret_access_key but no aws_access_key_id"
                                         : "aws_access_key_id but no aws_secret_access_key"));
      }
      s.credentials = S3Credentials{id, key, get(sec, "aws_session_token")};
      s.source = str("profile '", profile, "' (", path, ")");
      break;
    }
  }
  if (!s.credentials) s.source = "none found: requests are unsigned (public buckets only)";

  s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = env("AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = get(config_section, "region");
  if (s.region.empty()) s.region = "us-east-1";

  s.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = env("AWS_ENDPOINT_URL");
  if (s.endpoint.empty()) s.endpoint = get(config_section, "s3.endpoint_url");
  if (s.endpoint.empty()) s.endpoint = get(config_section, "endpoint_url");
  s.custom_endpoint = !s.endpoint.empty();
  if (!s.custom_endpoint) s.endpoint = str("https://s3.", s.region, ".amazonaws.com");
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  if (s.endpoint.find("://") == std::string::npos) {
    throw ConfigError(str("S3 endpoint '", redact(s.endpoint),
                          "' has no scheme; write http://HOST:PORT or https://HOST"));
  }

  std::string style = env("FERRY_S3_ADDRESSING_STYLE");
  if (style.empty()) style = get(config_section, "s3.addressing_style");
  if (!style.empty()) {
    if (style != "auto" && style != "path" && style != "virtual") {
      throw ConfigError(str("S3 addressing style '", style, "': expected auto, path or virtual"));
    }
    s.addressing = style;
  }
  return s;
}

namespace {
// Held across fork() (pthread_atfork): a child never inherits it locked by another thread of the
// parent (one reading ahead: net/prefetch.h), nor the cache half-written.
std::mutex g_settings_mutex;
const bool g_settings_atfork = [] {
  ::pthread_atfork([] { g_settings_mutex.lock(); }, [] { g_settings_mutex.unlock(); },
                   [] { g_settings_mutex.unlock(); });
  return true;
}();
}  // namespace

// The settings once per process while the environment and the AWS files stay as they were.
S3Settings cached_s3_settings() {
  std::mutex& mutex = g_settings_mutex;
  static std::string cached_key;
  static std::optional<S3Settings> cached;
  std::string key;
  for (const char* name :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "FERRY_S3_ADDRESSING_STYLE", "HOME"}) {
    const char* v = std::getenv(name);
    key += v == nullptr ? std::string("\x01") : std::string(v);
    key += '\0';
  }
  for (const std::string& path : {home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
                                  home_file("AWS_CONFIG_FILE", "config")}) {
    struct stat st {};
    if (!path.empty() && ::stat(path.c_str(), &st) == 0) {
      key += str(st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size, ";");
    }
  }
  const std::lock_guard<std::mutex> lock(mutex);
  if (!cached || key != cached_key) {
    cached = resolve_s3_settings();
    cached_key = std::move(key);
  }
  return *cached;
}

bool S3Settings::path_style(const std::string& bucket) const {
  if (addressing == "path") return true;
  if (addressing == "virtual") return false;
  // auto: S3-compatible stores (MinIO, Ceph, R2, s3rver) at an endpoint of their own expect
  // path-style requests; AWS's own endpoint takes virtual-hosted ones, which a bucket name with
  // dots cannot be (its TLS certificate covers one level).
  return custom_endpoint || bucket.find('.') != std::string::npos;
}

// Path style: ENDPOINT/BUCKET, as AWS's SDKs write it (some stores, s3rver among them, sign a
// trailing slash differently); virtual-hosted: BUCKET.HOST/.
std::string S3Settings::bucket_url(const std::string& bucket) const {
  if (path_style(bucket)) return endpoint + "/" + percent_encode(bucket, false);
  const auto scheme_end = endpoint.find("://") + 3;
  return endpoint.substr(0, scheme_end) + bucket + "." + endpoint.substr(scheme_end) + "/";
}

std::string S3Settings::object_url(const std::string& bucket, const std::string& key) const {
  std::string url = bucket_url(bucket);
  if (url.back() != '/') url += '/';
  return url + percent_encode(key, true);
}

}  // namespace ferry::net
