#include "deploy/records.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

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

bool is_pulled(const Pulled& pulled, const std::string& model, const std::string& commit) {
  const auto it = pulled.find(model);
  return it != pulled.end() && std::find(it->second.begin(), it->second.end(), commit) != it->second.end();
}

bool forget_pulled(Pulled& pulled, const std::string& model, const std::optional<std::string>& commit) {
  auto it = pulled.find(model);
  if (it == pulled.end()) return false;
  const auto before = it->second.size();
  if (commit) std::erase(it->second, *commit);
  else it->second.clear();
  const bool changed = it->second.size() != before;
  if (it->second.empty()) pulled.erase(it);
  return changed;
}

}  // namespace modeld::deploy
