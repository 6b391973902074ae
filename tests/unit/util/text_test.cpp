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

TEST_CASE("control characters are escaped as JSON writes them, everything else is kept") {
  CHECK(escape_control("config.json") == "config.json");
  CHECK(escape_control("") == "");
  CHECK(escape_control("a\nb\rc\td\be\ff") == "a\\nb\\rc\\td\\be\\ff");
  CHECK(escape_control("notes\n\x1b[31mFORGED\x1b[0m.json") == "notes\\n\\u001b[31mFORGED\\u001b[0m.json");
  CHECK(escape_control(std::string_view("nul\0del\x7f", 8)) == "nul\\u0000del\\u007f");
  // C1 controls as UTF-8 (U+009B is CSI on terminals that take 8-bit controls), not other UTF-8.
  CHECK(escape_control("csi\xc2\x9b" "2J next\xc2\x85line") == "csi\\u009b2J next\\u0085line");
  CHECK(escape_control("caf\xc3\xa9 \xc2\xa0nbsp \xe2\x80\xa6") == "caf\xc3\xa9 \xc2\xa0nbsp \xe2\x80\xa6");
  // Bytes that are not UTF-8 stay as they are; a lone C2 at the end too.
  CHECK(escape_control("\x9b\xff\xc2") == "\x9b\xff\xc2");
  CHECK(escape_control("back\\slash") == "back\\slash");
}

TEST_CASE("percent-decoding decodes escapes, keeps '+' and refuses a bad escape") {
  CHECK(modeld::util::percent_decode("a%20b+c%2Fd%41") == std::optional<std::string>("a b+c/dA"));
  CHECK(modeld::util::percent_decode("") == std::optional<std::string>(""));
  for (const char* bad : {"%", "a%4", "%zz", "%4g"}) {
    INFO(bad);
    CHECK_FALSE(modeld::util::percent_decode(bad));
  }
}

TEST_CASE("an excerpt escapes control characters as escape_control does and marks a cut") {
  CHECK(excerpt("loading", 200) == "loading");
  CHECK(excerpt("", 5) == "");
  CHECK(excerpt("abcdef", 6) == "abcdef");
  CHECK(excerpt("abcdefg", 6) == "abcdef...");
  // Escaped, not blanked: nothing of the text is lost within the limit.
  CHECK(excerpt("{\"error\":\n\t\"oom\x1b[2J\"}", 200) == "{\"error\":\\n\\t\"oom\\u001b[2J\"}");
  CHECK(excerpt("a\x7f\xc2\x9b", 200) == "a\\u007f\\u009b");
  // The limit counts the bytes before escaping.
  CHECK(excerpt("\n\n\n", 2) == "\\n\\n...");
}
