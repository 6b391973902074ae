#pragma once
// What the daemon records about the models in service, shared by the phases (which read it) and
// the state store (which persists it). No I/O here.

#include <map>
#include <string>
#include <vector>

namespace modeld::deploy {

/// The model in service, as recorded.
struct ActiveRecord {
  std::string model;
  std::string commit;
  std::string since;  ///< RFC 3339
};

/// Revisions pulled ahead and not deployed or removed since: model -> commits.
using Pulled = std::map<std::string, std::vector<std::string>>;

}  // namespace modeld::deploy
