#pragma once
// State recovery at start (docs/hardening.md "State recovery"): the model services that run
// without a line in state.json — a state.json lost, emptied or fallen back to an older copy — are
// found through the service manager and adopted or reported, never ignored. Read-only: the
// Deployer puts what is adopted into its state and writes the journal lines.

#include "deploy/phase.hpp"
#include "deploy/records.hpp"

#include <boost/asio/awaitable.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace modeld::deploy {

/// A unit modeld-serve@NAME.service that is up while no service of NAME is in state.
struct UnrecordedUnit {
  std::string model;
  std::string unit;
  /// Set when it can be adopted: the model's configuration, commit (models_dir/NAME's link) and,
  /// when the drop-in modeld wrote still renders from today's configuration, its started settings.
  std::optional<ActiveRecord> adopt;
  /// A sentence: why it is not adopted, or for an adoption what its record rests on.
  std::string why;
};

/// The units modeld-serve@*.service that are up (ServiceManager::units_up) whose model has no
/// service in state (`recorded`) and is not in `skip` (models an interrupted deployment owns), each with
/// what reconciliation may do: adopt a configured model whose link points to a revision with a
/// manifest (`since` = `now`, RFC 3339), or report it (not configured, no link, a revision never
/// verified). An error of the service manager is returned as it is. Store reads on the disk pool.
boost::asio::awaitable<Result<std::vector<UnrecordedUnit>>> find_unrecorded_units(Services& s,
                                                                                std::set<std::string> recorded,
                                                                                std::set<std::string> skip,
                                                                                std::string now);

}  // namespace modeld::deploy
