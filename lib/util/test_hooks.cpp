#include "util/test_hooks.hpp"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include <unistd.h>

namespace modeld::test_hooks {

void crash_point([[maybe_unused]] std::string_view name) {
#ifdef MODELD_TEST_HOOKS
  const char* want = std::getenv("MODELD_CRASH_POINT");
  if (!want || name != want) return;
  // One line on stderr (unbuffered), so the journal shows where the daemon died.
  std::fprintf(stderr, "modeld: crash point %.*s reached: exiting at once\n", static_cast<int>(name.size()),
               name.data());
  ::_exit(137);
#endif
}

std::optional<std::uint64_t> number([[maybe_unused]] const char* name) {
#ifdef MODELD_TEST_HOOKS
  const char* text = std::getenv(name);
  if (!text || !*text) return std::nullopt;
  std::uint64_t value = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
#else
  return std::nullopt;
#endif
}

}  // namespace modeld::test_hooks
