#include "deploy/started.hpp"

#include "gpu/nvml.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <set>

namespace modeld::deploy {

namespace {

// Names of the variables set in only one of `a` and `b`, or set to different values.
std::vector<std::string> changed_variables(const std::map<std::string, std::string>& a,
                                           const std::map<std::string, std::string>& b) {
  std::set<std::string> names;
  for (const auto& [k, v] : a)
    if (auto it = b.find(k); it == b.end() || it->second != v) names.insert(k);
  for (const auto& [k, v] : b)
    if (!a.contains(k)) names.insert(k);
  return {names.begin(), names.end()};
}

}  // namespace

std::vector<std::string> settings_changed(const StartedSettings& was, const StartedSettings& now) {
  std::vector<std::string> out;
  if (was.command != now.command) out.emplace_back("command changed");
  if (auto vars = changed_variables(was.environment, now.environment); !vars.empty())
    out.push_back(fmt::format("environment changed ({})", fmt::join(vars, ", ")));
  if (was.working_directory != now.working_directory) out.emplace_back("working directory changed");
  if (was.gpus != now.gpus) out.push_back(fmt::format("GPUs changed ({} -> {})", was.gpus, now.gpus));
  if (was.gpu_ids != now.gpu_ids)
    out.push_back(fmt::format("GPU ids changed ({} -> {})", gpu::describe_indices(was.gpu_ids), gpu::describe_indices(now.gpu_ids)));
  if (was.port != now.port) out.push_back(fmt::format("port changed ({} -> {})", was.port, now.port));
  return out;
}

nlohmann::json to_json(const StartedSettings& s) {
  nlohmann::json j{{"command", s.command},
                   {"environment", s.environment},
                   {"working_directory", s.working_directory},
                   {"gpus", s.gpus},
                   {"port", s.port}};
  j["gpu_ids"] = s.gpu_ids ? nlohmann::json(*s.gpu_ids) : nlohmann::json(nullptr);
  return j;
}

Result<StartedSettings> started_settings_from_json(const nlohmann::json& j) {
  try {
    StartedSettings s;
    s.command = j.at("command").get<std::vector<std::string>>();
    s.environment = j.at("environment").get<std::map<std::string, std::string>>();
    s.working_directory = j.at("working_directory").get<std::string>();
    s.gpus = j.value("gpus", 0u);
    s.port = j.value("port", std::uint16_t{0});
    if (j.contains("gpu_ids") && !j["gpu_ids"].is_null()) s.gpu_ids = j["gpu_ids"].get<std::vector<unsigned>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::bad_request, fmt::format("started settings: {}", e.what()));
  }
}

}  // namespace modeld::deploy
