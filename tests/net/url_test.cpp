// Shard locations and S3 settings, without a network: what a URL names, what a message may show
// of it, and where credentials, region, endpoint and addressing come from.

#include "net/url.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/error.h"
#include "ferry/vision/webdataset.h"

#include "net/aws.h"
#include "net/byte_source.h"

namespace ferry::net {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// Sets environment variables for one test and puts the old values back.
class Env {
 public:
  Env() {
    for (const char* name :
         {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
          "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
          "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "FERRY_S3_ADDRESSING_STYLE", "HOME"}) {
      const char* v = std::getenv(name);
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(name);
    }
    home_ = fs::path(::testing::TempDir()) / ("ferry_aws_" + std::to_string(::getpid()));
    fs::create_directories(home_ / ".aws");
    ::setenv("HOME", home_.c_str(), 1);
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
    fs::remove_all(home_);
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  void write(const std::string& file, const std::string& text) {
    std::ofstream(home_ / ".aws" / file) << text;
  }
  const fs::path& home() const { return home_; }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
  fs::path home_;
};

TEST(Location, SchemesAndTheirParts) {
  const Location s3 = parse_location("s3://bucket/train/shard-000.tar");
  EXPECT_EQ(s3.scheme, Scheme::kS3);
  EXPECT_EQ(s3.bucket, "bucket");
  EXPECT_EQ(s3.key, "train/shard-000.tar");
  EXPECT_EQ(parse_location("s3://bucket").key, "");
  EXPECT_EQ(parse_location("https://host/a.tar").scheme, Scheme::kHttp);
  EXPECT_EQ(parse_location("http://host:8080/a.tar").scheme, Scheme::kHttp);
  EXPECT_EQ(parse_location("pipe:curl -s http://x/a.tar").scheme, Scheme::kPipe);
  EXPECT_EQ(parse_location("data/a.tar").scheme, Scheme::kFile);
  EXPECT_TRUE(is_remote("pipe:cat a.tar"));
  EXPECT_FALSE(is_remote("s3.tar"));
  EXPECT_THAT([] { parse_location("s3:///key"); },
              ::testing::ThrowsMessage<DataError>(HasSubstr("write s3://BUCKET/KEY")));
  EXPECT_THAT([] { parse_location("pipe:"); },
              ::testing::ThrowsMessage<DataError>(HasSubstr("no command")));
  EXPECT_THAT([] { parse_location("https:///a.tar"); },
              ::testing::ThrowsMessage<DataError>(HasSubstr("no host")));
}

TEST(Location, RedactHidesUserPasswordAndQuery) {
  EXPECT_EQ(redact("https://user:pw@host/a.tar"), "https://***@host/a.tar");
  EXPECT_EQ(redact("https://host/a.tar?X-Amz-Signature=abc&X-Amz-Credential=AKIA"),
            "https://host/a.tar?***");
  EXPECT_EQ(redact("https://host/a.tar"), "https://host/a.tar");
  EXPECT_EQ(redact("s3://bucket/key"), "s3://bucket/key");
  EXPECT_EQ(percent_encode("a b/c+d~", true), "a%20b/c%2Bd~");
  EXPECT_EQ(percent_encode("a/b", false), "a%2Fb");
}

TEST(S3Settings, TheEnvironmentFirstThenTheProfileAsTheAwsCliReadsThem) {
  Env env;
  env.write("credentials",
            "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = defaultsecret\n"
            "[team]\naws_access_key_id = TEAMKEY\naws_secret_access_key = teamsecret\n"
            "aws_session_token = teamtoken\n");
  env.write("config",
            "[default]\nregion = eu-west-1\n"
            "[profile team]\nregion = ap-south-1\ns3 =\n  addressing_style = path\n"
            "  endpoint_url = http://127.0.0.1:9000\n");
  S3Settings s = resolve_s3_settings();
  ASSERT_TRUE(s.credentials);
  EXPECT_EQ(s.credentials->access_key, "DEFAULTKEY");
  EXPECT_EQ(s.region, "eu-west-1");
  EXPECT_EQ(s.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(s.object_url("bucket", "a b/c.tar"),
            "https://bucket.s3.eu-west-1.amazonaws.com/a%20b/c.tar");
  EXPECT_EQ(s.object_url("my.bucket", "c.tar"),
            "https://s3.eu-west-1.amazonaws.com/my.bucket/c.tar")
      << "a dotted bucket cannot be a virtual host under AWS's certificate";

  env.set("AWS_PROFILE", "team");
  s = resolve_s3_settings();
  EXPECT_EQ(s.credentials->access_key, "TEAMKEY");
  EXPECT_EQ(s.credentials->session_token, "teamtoken");
  EXPECT_EQ(s.region, "ap-south-1");
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(s.object_url("bucket", "k.tar"), "http://127.0.0.1:9000/bucket/k.tar");

  env.set("AWS_ACCESS_KEY_ID", "ENVKEY");
  env.set("AWS_SECRET_ACCESS_KEY", "envsecret");
  env.set("AWS_REGION", "us-west-2");
  env.set("AWS_ENDPOINT_URL_S3", "http://localhost:9999/");
  env.set("AWS_ENDPOINT_URL", "http://ignored:1");
  s = resolve_s3_settings();
  EXPECT_EQ(s.credentials->access_key, "ENVKEY");
  EXPECT_EQ(s.credentials->session_token, "");
  EXPECT_EQ(s.region, "us-west-2");
  EXPECT_EQ(s.endpoint, "http://localhost:9999");
  EXPECT_THAT(s.source, Not(HasSubstr("envsecret")));

  env.set("FERRY_S3_ADDRESSING_STYLE", "virtual");
  EXPECT_EQ(resolve_s3_settings().object_url("b", "k"), "http://b.localhost:9999/k");
}

TEST(S3Settings, NoCredentialsMeansUnsignedAndErrorsNeverShowASecret) {
  Env env;
  S3Settings s = resolve_s3_settings();
  EXPECT_FALSE(s.credentials);
  EXPECT_THAT(s.source, HasSubstr("unsigned"));
  env.set("AWS_SECRET_ACCESS_KEY", "topsecret");
  EXPECT_THAT([] { resolve_s3_settings(); },
              ::testing::ThrowsMessage<ConfigError>(
                  ::testing::AllOf(HasSubstr("AWS_ACCESS_KEY_ID"), Not(HasSubstr("topsecret")))));
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  env.write("credentials", "[half]\naws_secret_access_key = hiddensecret\n");
  env.set("AWS_PROFILE", "half");
  EXPECT_THAT(
      [] { resolve_s3_settings(); },
      ::testing::ThrowsMessage<ConfigError>(::testing::AllOf(
          HasSubstr("'half'"), HasSubstr("no aws_access_key_id"), Not(HasSubstr("hiddensecret")))));
  env.set("AWS_PROFILE", "nobody");
  EXPECT_THAT([] { resolve_s3_settings(); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("AWS_PROFILE=nobody")));
  ::unsetenv("AWS_PROFILE");
  env.set("AWS_ENDPOINT_URL", "127.0.0.1:9000");
  EXPECT_THAT([] { resolve_s3_settings(); },
              ::testing::ThrowsMessage<ConfigError>(HasSubstr("has no scheme")));
}

TEST(Shards, BracePatternsExpandForRemoteShardsWithoutTouchingTheNetwork) {
  EXPECT_EQ(vision::expand_shards("s3://b/train/shard-{00..02}.tar"),
            (std::vector<std::string>{"s3://b/train/shard-00.tar", "s3://b/train/shard-01.tar",
                                      "s3://b/train/shard-02.tar"}));
  EXPECT_EQ(
      vision::expand_shards("https://h/x-{8..10}.tar"),
      (std::vector<std::string>{"https://h/x-8.tar", "https://h/x-9.tar", "https://h/x-10.tar"}));
  EXPECT_EQ(vision::expand_shards("pipe:cat a.tar"), std::vector<std::string>{"pipe:cat a.tar"});
}

// pipe: runs the command and reads its output; a command that fails is an error naming it.
TEST(Pipe, TheCommandsOutputIsTheShardAndItsExitStatusIsChecked) {
  auto source = open_sequential("pipe:printf 'hello world'");
  std::string got(32, '\0');
  std::size_t n = source->read_at(6, reinterpret_cast<std::uint8_t*>(got.data()), got.size());
  EXPECT_EQ(got.substr(0, n), "world");
  auto failing = open_sequential("pipe:printf abc; exit 3");
  EXPECT_THAT([&] { failing->read_at(0, reinterpret_cast<std::uint8_t*>(got.data()), got.size()); },
              ::testing::ThrowsMessage<DataError>(
                  ::testing::AllOf(HasSubstr("pipe:printf abc; exit 3"), HasSubstr("code 3"))));
}

}  // namespace
}  // namespace ferry::net
