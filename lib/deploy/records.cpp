#include "deploy/records.hpp"

#include <nlohmann/json.hpp>

namespace modeld::deploy {

nlohmann::json to_json(const ActiveRecord& a) {
  nlohmann::json j{{"model", a.model}, {"commit", a.commit}, {"since", a.since}};
  if (a.started) j["started"] = to_json(*a.started);
  return j;
}

ActiveRecord active_record_from_json(const nlohmann::json& j) {
  ActiveRecord r{j.at("model").get<std::string>(), j.at("commit").get<std::string>(),
                 j.value("since", std::string())};
  // "started" since the settings are kept; a service recorded before has none.
  if (j.contains("started") && j["started"].is_object())
    if (auto st = started_settings_from_json(j["started"])) r.started = std::move(*st);
  return r;
}

}  // namespace modeld::deploy
