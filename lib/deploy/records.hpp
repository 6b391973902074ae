#pragma once
// What the daemon records about the models in service, shared by the phases (which read it) and
// the state store (which persists it). No I/O here.

#include <string>

namespace modeld::deploy {

/// The model in service, as recorded.
struct ActiveRecord {
  std::string model;
  std::string commit;
  std::string since;  ///< RFC 3339
};

}  // namespace modeld::deploy
