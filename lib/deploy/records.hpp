#pragma once
// What the daemon records about the models in service, shared by the phases (which read it) and
// the state store (which persists it). No I/O here.

#include "deploy/started.hpp"

#include <nlohmann/json_fwd.hpp>

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

/// The JSON form of `a` in state.json and in deployment records: {"model", "commit", "since",
/// "started"?}.
nlohmann::json to_json(const ActiveRecord& a);

/// Reads what to_json wrote; throws nlohmann::json::exception when a field is missing or of the
/// wrong type (the callers name the file); "started" that does not parse is left out.
ActiveRecord active_record_from_json(const nlohmann::json& j);

/// Revisions pulled ahead and not deployed or removed since: model -> commits.
using Pulled = std::map<std::string, std::vector<std::string>>;

/// Whether revision `commit` of `model` is marked in `pulled`.
bool is_pulled(const Pulled& pulled, const std::string& model, const std::string& commit);

/// Drops the mark of `model` at `commit` (every commit: nullopt) from `pulled`, and the model's
/// entry once it has none; returns whether there was one.
bool forget_pulled(Pulled& pulled, const std::string& model, const std::optional<std::string>& commit);

}  // namespace modeld::deploy
