#pragma once
// What the daemon records about the models in service, shared by the phases (which read it) and
// the state store (which persists it). No I/O here.

#include "deploy/started.hpp"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// The model in service, as recorded.
struct ActiveRecord {
  std::string model;
  std::string commit;
  std::string since;  ///< RFC 3339
  /// What its service was started with; nullopt in a state.json written before it was kept.
  std::optional<StartedSettings> started = {};
};

/// Revisions pulled ahead and not deployed or removed since: model -> commits.
using Pulled = std::map<std::string, std::vector<std::string>>;

}  // namespace modeld::deploy
