#include "util/files.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace modeld;

namespace {
fs::path temp_file(const std::string& name, const std::string& content) {
  auto p = fs::temp_directory_path() / ("modeld-files-test-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p;
}
}  // namespace

TEST_CASE("a secret file gives its first line without trailing whitespace") {
  auto p = temp_file("token", "hf_abc \r\nsecond line\n");
  auto s = util::read_secret_file(p);
  fs::remove(p);
  REQUIRE(s.has_value());
  CHECK(*s == "hf_abc");
}

TEST_CASE("a missing secret file is an error naming the path, not the content") {
  auto s = util::read_secret_file("/nonexistent/modeld/hf-token");
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().message.find("/nonexistent/modeld/hf-token") != std::string::npos);
}

TEST_CASE("a file replaced atomically holds the new content and no temporary is left") {
  auto dir = fs::temp_directory_path() / ("modeld-files-test-dir-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  REQUIRE(util::write_file_atomically(dir / "f", "one").has_value());
  REQUIRE(util::write_file_atomically(dir / "f", "two").has_value());
  auto back = util::read_file(dir / "f");
  REQUIRE(back.has_value());
  CHECK(*back == "two");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  fs::remove_all(dir);
}

TEST_CASE("a process's name is its /proc/PID/comm, trimmed, and a process that is gone has none") {
  auto comm = util::read_file("/proc/self/comm");
  REQUIRE(comm.has_value());
  REQUIRE(comm->ends_with('\n'));
  CHECK(util::process_name(static_cast<std::uint32_t>(::getpid())) == comm->substr(0, comm->size() - 1));
  CHECK(util::process_name(0) == "");
  CHECK(util::process_name(4'000'000'000u) == "");
}
