// The Deployer's events as fields, and their JSON where they leave the daemon (the SSE stream).
#include "deploy/control.hpp"
#include "util/json.hpp"

#include <nlohmann/json.hpp>

namespace modeld::deploy {

std::string_view to_string(EventKind k) noexcept {
  switch (k) {
    case EventKind::phase: return "phase";
    case EventKind::progress: return "progress";
    case EventKind::state: return "state";
    case EventKind::watcher: return "watcher";
  }
  return "";
}

nlohmann::json to_json(const WatchdogStatus& w) {
  return {{"model", w.model},
          {"unit", w.unit},
          {"state", w.state},
          {"consecutive_failures", w.consecutive_failures},
          {"restarts", w.restarts},
          {"probe_failures", w.probe_failures},
          {"last_restart_at", util::or_null(w.last_restart_at)},
          {"last_restart_reason", util::or_null(w.last_restart_reason)},
          {"last_probe_at", util::or_null(w.last_probe_at)},
          {"last_probe_ok", util::or_null(w.last_probe_ok)},
          {"last_probe_seconds", util::or_null(w.last_probe_seconds)}};
}

Event deployment_event(EventKind kind, const Deployment& d) {
  Event e;
  e.kind = kind;
  e.id = d.id;
  e.model = d.model;
  e.phase = d.phase;
  e.state = d.state;
  e.error = d.error;
  if (kind == EventKind::progress) e.progress = d.progress;
  if (kind == EventKind::progress && d.phase == Phase::warming) e.warm = d.warm;
  return e;
}

nlohmann::json event_json(const Event& e) {
  if (e.kind == EventKind::watcher)
    return {{"model", e.model}, {"watchdog", e.watcher ? to_json(*e.watcher) : nlohmann::json(nullptr)}};
  nlohmann::json j{{"id", e.id}, {"model", e.model}};
  if (e.kind == EventKind::phase) j["phase"] = std::string(to_string(e.phase));
  if (e.kind == EventKind::state) {
    j["state"] = std::string(to_string(e.state));
    j["phase"] = std::string(to_string(e.phase));
    j["error"] = e.error ? to_json(*e.error) : nlohmann::json(nullptr);
  }
  if (e.kind == EventKind::progress) j["progress"] = to_json(e.progress);
  if (e.kind == EventKind::progress && e.phase == Phase::warming) {
    j["phase"] = std::string(to_string(e.phase));
    j["warm"] = e.warm ? to_json(*e.warm) : nlohmann::json(nullptr);
  }
  return j;
}

}  // namespace modeld::deploy
