#pragma once
// rolling_back (rollback.cpp): the new service stopped, the old ones restored.

#include "deploy/phase.hpp"
#include "deploy/health_check.hpp"
#include "deploy/launch.hpp"

namespace modeld::deploy {

/// What rolling_back did: when it asked for the first old service's start and when the last one
/// was ready (0 when none came back), which came back, and which did not, with why.
struct Restored {
  Launched launched;
  Readiness readiness;
  std::vector<std::string> restored;                          ///< models serving again, in order
  std::vector<std::pair<std::string, std::string>> failed;   ///< model -> why it did not come back
};

/// rolling_back: stop the new service, then restore every service the run stopped (its link, its
/// drop-in as it ran, warmed), started in the order they were put into service and then each
/// awaited ready. Returns which came back and which did not (Restored::failed); rollback_failed
/// only when the new service cannot be stopped or nothing served before.
boost::asio::awaitable<Result<Restored>> run_rolling_back(Services& s, const Run& run);

}  // namespace modeld::deploy
