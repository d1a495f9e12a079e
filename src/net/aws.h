#pragma once

// S3 settings as the AWS tools read them: credentials, region, endpoint and addressing style
// from the environment, `~/.aws/credentials` and `~/.aws/config` (AWS_PROFILE,
// AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE). Read at call time, in the process that makes the
// requests. The secret key and session token never leave this struct for any text: describe()
// names where they came from, not what they are.

#include <optional>
#include <string>

namespace ferry::net {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty: none
};

struct S3Settings {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  std::string region = "us-east-1";
  bool custom_endpoint = false;
  std::string addressing = "auto";           // auto | path | virtual
  std::optional<S3Credentials> credentials;  // none: unsigned requests (public buckets)
  std::string source;  // where the credentials came from, for messages ("environment", ...)

  // The HTTP URL of an object (key already as written; it is percent-encoded here).
  std::string object_url(const std::string& bucket, const std::string& key) const;
  // The bucket's URL for ListObjectsV2 (no query; no trailing '/' in path style).
  std::string bucket_url(const std::string& bucket) const;
  // Whether requests to `bucket` use path-style addressing.
  bool path_style(const std::string& bucket) const;
};

// Throws ferry::ConfigError naming the file and the profile for a profile that is named but not
// found, or half a key pair.
S3Settings resolve_s3_settings();

// resolve_s3_settings(), read again only when the environment or the AWS files changed (a
// map-style dataset asks at every sample: one stat per file, not a read).
S3Settings cached_s3_settings();

}  // namespace ferry::net
