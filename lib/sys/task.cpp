#include "sys/task.hpp"

#include <boost/asio/error.hpp>
#include <boost/system/system_error.hpp>

namespace modeld::sys {

void LogFailure::operator()(std::exception_ptr e) const {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const boost::system::system_error& ex) {
    // A task bound to a cancellation slot may end this way when it is cancelled: not a failure.
    const bool cancelled = ex.code() == boost::asio::error::operation_aborted;
    log(cancelled ? Level::debug : Level::error, fields,
        fmt::format("{} {}: {}", what, cancelled ? "ended by cancellation" : "failed", ex.what()));
  } catch (const std::exception& ex) {
    log(Level::error, fields, fmt::format("{} failed: {}", what, ex.what()));
  } catch (...) {
    log(Level::error, fields, fmt::format("{} failed: an exception that is not a std::exception", what));
  }
}

}  // namespace modeld::sys
