#pragma once
// What becomes of a task that fails: every coroutine the daemon spawns ends in a completion
// handler that says so in the journal, instead of losing the exception (asio::detached) or
// repeating the same rethrow-and-log block.

#include "sys/log.hpp"

#include <exception>
#include <string>

namespace modeld::sys {

/// A co_spawn completion handler that logs how a task ended (see log_failure()).
struct LogFailure {
  std::string what;  ///< the task's name, e.g. "configuration reload"
  Fields fields;     ///< journal fields of the error line

  /// Does nothing for a task that returned; logs an error line "WHAT failed: MESSAGE" for one that
  /// threw, and a debug line for one that ended by cancellation (operation_aborted). Never throws.
  void operator()(std::exception_ptr e) const;
};

/// The completion handler for a task named `what`: co_spawn(ex, task(), log_failure("what")).
inline LogFailure log_failure(std::string what, Fields fields = {}) {
  return LogFailure{std::move(what), std::move(fields)};
}

}  // namespace modeld::sys
