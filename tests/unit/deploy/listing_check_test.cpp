// What planning refuses in a listing before anything is summed, linked or downloaded: files under
// modeld's own `.modeld/`, files larger than hub.max_file_size, sizes whose sum wraps.

#include "deploy/plan.hpp"

#include <catch2/catch.hpp>

#include <limits>

using namespace modeld;
using namespace modeld::deploy;

namespace {

config::ModelConfig model() {
  config::ModelConfig m;
  m.name = "m";
  m.repo = "org/m";
  m.source_file = "/etc/modeld/models.d/m.toml";
  return m;
}

repo::Snapshot listing(std::initializer_list<std::pair<std::string, std::uint64_t>> files) {
  repo::Snapshot s;
  s.repo = "org/m";
  s.commit = std::string(40, 'a');
  for (const auto& [path, size] : files) s.files.push_back(repo::RepoFile{path, size, std::string(40, 'b'), {}});
  return s;
}

constexpr std::uint64_t kMax = 1ull << 40;

}  // namespace

TEST_CASE("an honest listing passes") {
  CHECK(check_listed_files(model(), listing({{"config.json", 44}, {"model.safetensors", 5ull << 30}}), kMax).has_value());
  CHECK(check_listed_files(model(), listing({{".modeldx/a.json", 1}, {"x/.modeld/a.json", 1}}), kMax).has_value());
}

TEST_CASE("a file under the revision's .modeld/ is refused naming it and the way out") {
  for (const char* path : {".modeld/manifest.json", ".modeld/partial/x.part", ".modeld"}) {
    auto r = check_listed_files(model(), listing({{"config.json", 44}, {path, 10}}), kMax);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::hub_bad_response);
    CHECK(r.error().files == std::vector<std::string>{path});
    CHECK_THAT(r.error().message, Catch::Contains(path) && Catch::Contains("modeld's own") &&
                                      Catch::Contains("/etc/modeld/models.d/m.toml"));
  }
}

TEST_CASE("a file larger than hub.max_file_size is refused naming it and the bound") {
  for (std::uint64_t size : std::vector<std::uint64_t>{1ull << 63, std::numeric_limits<std::uint64_t>::max(), kMax + 1}) {
    auto r = check_listed_files(model(), listing({{"a.safetensors", size}, {"config.json", 44}}), kMax);
    REQUIRE(!r);
    CHECK(r.error().code == Errc::hub_bad_response);
    CHECK(r.error().files == std::vector<std::string>{"a.safetensors"});
    CHECK_THAT(r.error().message, Catch::Contains("'a.safetensors' is " + std::to_string(size) + " bytes") &&
                                      Catch::Contains("hub.max_file_size"));
  }
  CHECK(check_listed_files(model(), listing({{"a.safetensors", kMax}}), kMax).has_value());
}

TEST_CASE("sizes whose sum does not fit in 64 bits are refused instead of wrapping") {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  auto r = check_listed_files(model(), listing({{"a", 1ull << 63}, {"b", 1ull << 63}, {"config.json", 44}}), max);
  REQUIRE(!r);
  CHECK(r.error().code == Errc::hub_bad_response);
  CHECK_THAT(r.error().message, Catch::Contains("more than 2^64 bytes"));
  CHECK_FALSE(check_listed_files(model(), listing({{"a", max}, {"b", 1}}), max).has_value());
}

TEST_CASE("names no file system can store are refused before anything is downloaded") {
  const std::string long_name(256, 'x');
  auto r = check_listed_files(model(), listing({{"config.json", 44}, {"dir/" + long_name + ".txt", 1}}), kMax);
  REQUIRE(!r.has_value());
  CHECK(r.error().code == Errc::hub_bad_response);
  CHECK_THAT(r.error().message, Catch::Contains("260 bytes long") && Catch::Contains("255"));
  CHECK(check_listed_files(model(), listing({{std::string(255, 'y'), 1}}), kMax).has_value());

  auto both = check_listed_files(model(), listing({{"foo", 1}, {"foo/bar", 1}}), kMax);
  REQUIRE(!both.has_value());
  CHECK(both.error().files == std::vector<std::string>{"foo"});
  CHECK_THAT(both.error().message, Catch::Contains("both as a file and as a folder"));
  CHECK(check_listed_files(model(), listing({{"foo.json", 1}, {"foo/bar", 1}, {"foobar/x", 1}}), kMax).has_value());
}
