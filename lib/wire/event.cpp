#include "wire/event.hpp"

#include <nlohmann/json.hpp>

namespace modeld::wire {

std::string_view to_string(EventKind k) noexcept {
  switch (k) {
    case EventKind::phase: return "phase";
    case EventKind::progress: return "progress";
    case EventKind::state: return "state";
    case EventKind::watcher: return "watcher";
  }
  return "";
}

nlohmann::json to_json(const Event& e) {
  using nlohmann::json;
  if (e.kind == EventKind::watcher) return {{"model", e.model}, {"watchdog", e.watcher ? to_json(*e.watcher) : json(nullptr)}};
  json j{{"id", e.id}, {"model", e.model}};
  if (e.kind == EventKind::phase) j["phase"] = std::string(to_string(e.phase));
  if (e.kind == EventKind::state) {
    j["state"] = std::string(to_string(e.state));
    j["phase"] = std::string(to_string(e.phase));
    j["error"] = e.error ? to_json(*e.error) : json(nullptr);
  }
  if (e.kind == EventKind::progress) j["progress"] = to_json(e.progress);
  if (e.kind == EventKind::progress && e.phase == Phase::warming) {
    j["phase"] = std::string(to_string(e.phase));
    j["warm"] = e.warm ? to_json(*e.warm) : json(nullptr);
  }
  return j;
}

}  // namespace modeld::wire
