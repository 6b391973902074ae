#include "util/test_hooks.hpp"

#include <cstdio>
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

}  // namespace modeld::test_hooks
