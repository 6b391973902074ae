#include "repo/ids.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace modeld::repo;

TEST_CASE("repository ids follow huggingface_hub's rules, with the namespace required") {
  for (const char* good : {"moonshotai/Kimi-K2.5", "MiniMaxAI/MiniMax-M2.5", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
                           "a/b", "foo/bar", "123/456", "Foo-BAR_foo/bar123", "_org/_name_", "org/x.y-z_1",
                           "deepseek-ai/DeepSeek-V3.1"}) {
    INFO(good);
    CHECK(valid_repo_id(good));
  }
  CHECK(valid_repo_id("org/" + std::string(96, 'n')));
}

TEST_CASE("repository ids the Hub refuses, or without a namespace, are refused") {
  for (const char* bad : {"", "gpt2", "/", "org/", "/name", "a/b/c", "datasets/foo/bar", "org//name",
                          ".org/name", "org./name", "-org/name", "org-/name", "org/.name", "org/name.",
                          "org/-name", "org/name-", "org/foo--bar", "org/foo..bar", "o--rg/name", "o..rg/name",
                          "org/foo.git", "org/na me", "org/na\\me", "org/caf\xc3\xa9", "org/name\n", "../name",
                          "org/..", "org/.", "org/a+b", "org/a:b"}) {
    INFO(bad);
    CHECK_FALSE(valid_repo_id(bad));
  }
  CHECK_FALSE(valid_repo_id("org/" + std::string(97, 'n')));
  CHECK_FALSE(valid_repo_id(std::string_view("org/na\0me", 9)));
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

TEST_CASE("a commit id is 40 lower-case hex digits, nothing else") {
  CHECK(is_commit_id(std::string(40, 'a')));
  CHECK(is_commit_id("0123456789abcdef0123456789abcdef01234567"));
  CHECK_FALSE(is_commit_id(std::string(40, 'A')));
  CHECK_FALSE(is_commit_id(std::string(39, 'a')));
  CHECK_FALSE(is_commit_id(std::string(41, 'a')));
  CHECK_FALSE(is_commit_id("main"));
  CHECK_FALSE(is_commit_id(std::string(40, 'g')));
}
