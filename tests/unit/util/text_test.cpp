#include "util/text.hpp"

#include <catch2/catch.hpp>

using namespace modeld::util;

TEST_CASE("globs match as huggingface_hub's fnmatch does, with star crossing slashes") {
  CHECK(glob_match("*.safetensors", "model-00001-of-00064.safetensors"));
  CHECK(glob_match("*.json", "sub/dir/config.json"));
  CHECK_FALSE(glob_match("*.json", "weights.bin"));
  CHECK(glob_match("tokenizer.???", "tokenizer.bin"));
}

TEST_CASE("filters keep included files that no exclude matches") {
  std::vector<std::string> inc{"*.json", "*.safetensors"}, exc{"original/*"};
  CHECK(passes_filters("config.json", inc, exc));
  CHECK_FALSE(passes_filters("original/consolidated.safetensors", inc, exc));
  CHECK_FALSE(passes_filters("README.md", inc, exc));
  CHECK(passes_filters("README.md", {}, {}));
}

TEST_CASE("model names follow the contract's pattern") {
  CHECK(valid_model_name("kimi-k2-5"));
  CHECK(valid_model_name("a"));
  CHECK(valid_model_name("qwen3.5_32b"));
  CHECK_FALSE(valid_model_name("Kimi"));
  CHECK_FALSE(valid_model_name("-lead"));
  CHECK_FALSE(valid_model_name(""));
  CHECK_FALSE(valid_model_name(std::string(65, 'a')));
  CHECK_FALSE(valid_model_name("a/b"));
}

TEST_CASE("repository paths that would escape a folder are unsafe") {
  CHECK(safe_relative_path("a/b.json"));
  CHECK_FALSE(safe_relative_path("../etc/passwd"));
  CHECK_FALSE(safe_relative_path("/etc/passwd"));
  CHECK_FALSE(safe_relative_path("a//b"));
  CHECK_FALSE(safe_relative_path("a/./b"));
  CHECK_FALSE(safe_relative_path("a/.."));
}

TEST_CASE("path encoding keeps slashes and escapes the rest") {
  CHECK(url_encode_path("a b/c+d.json") == "a%20b/c%2Bd.json");
  CHECK(url_encode_segment("refs/pr/1") == "refs%2Fpr%2F1");
}

TEST_CASE("RFC 3339 time stamps round-trip") {
  auto t = std::chrono::system_clock::from_time_t(1'800'000'000);
  CHECK(rfc3339(t) == "2027-01-15T08:00:00Z");
  CHECK(parse_rfc3339(rfc3339(t)) == t);
}
