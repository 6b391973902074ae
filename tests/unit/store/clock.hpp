#pragma once
// Test helper of the store tests: waiting for the file system's clock, whose ticks are coarse.

#include "store/store.hpp"
#include "unit/verify/test_files.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

namespace modeld::test {

/// Writes a scratch file in `dir` until the file system's clock (a tick of a few ms) has moved past
/// `past_ns`, so that the next change of a file's ctime is seen.
inline void let_the_clock_pass(const std::filesystem::path& dir, std::int64_t past_ns) {
  const auto scratch = dir / "clock-tick";
  for (int i = 0; i < 1000000; ++i) {
    write_file(scratch, std::to_string(i));
    auto id = store::identity_of(scratch);
    REQUIRE(id.has_value());
    if (id->ctime_ns > past_ns) break;
  }
  std::filesystem::remove(scratch);
}

}  // namespace modeld::test
