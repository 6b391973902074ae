#pragma once
// Test-only hooks. Their bodies are compiled in only with the CMake option MODELD_TEST_HOOKS
// (developer and CI builds, the default); the packaged daemon is built without them
// (scripts/package.sh), where every hook returns at once.

#include <cstdint>
#include <optional>
#include <string_view>

namespace modeld::test_hooks {

/// With test hooks compiled in, ends the process at once (_exit(137): no destructors, no flush,
/// as a kill -9 there would) when the environment variable MODELD_CRASH_POINT equals `name`;
/// otherwise, and always in a build without them, returns. Never blocks.
void crash_point(std::string_view name);

/// With test hooks compiled in, the environment variable `name` read as a whole non-negative
/// number; nullopt when it is unset or not such a number, and always in a build without them.
/// Never blocks.
std::optional<std::uint64_t> number(const char* name);

}  // namespace modeld::test_hooks
