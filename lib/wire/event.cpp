#include "wire/event.hpp"

#include "util/name_table.hpp"

#include <nlohmann/json.hpp>

namespace modeld::wire {
namespace {

using nlohmann::json;

constexpr util::NameTable<EventKind, 4> kKinds{{
    {EventKind::phase, "phase"},
    {EventKind::progress, "progress"},
    {EventKind::state, "state"},
    {EventKind::watcher, "watcher"},
}};

// The phase or state named by the string `j`; throws like a mistyped field when the name is
// unknown, so that event_from_json() reports both alike.
template <class T>
T named(const json& j, std::optional<T> (*from)(std::string_view) noexcept) {
  if (auto v = from(j.get<std::string>())) return *v;
  throw json::other_error::create(501, "unknown name " + j.dump(), &j);
}

// The fields of a phase, progress or state event beside "id" and "model".
void read_deployment_event(const json& j, Event& e) {
  if (e.kind != EventKind::progress || j.contains("phase")) e.phase = named(j.at("phase"), phase_from_string);
  else e.phase = Phase::downloading;  // only the warming phase's progress names its phase
  if (e.kind == EventKind::state) {
    e.state = named(j.at("state"), state_from_string);
    if (j.contains("error") && !j["error"].is_null()) e.error = error_from_json(j["error"]);
  }
  if (e.kind == EventKind::progress) {
    e.progress = progress_from_json(j.at("progress"));
    if (j.contains("warm")) e.warm = warm_from_json(j["warm"]);
  }
}

}  // namespace

std::string_view to_string(EventKind k) noexcept { return util::name_in(kKinds, k).value_or(""); }
std::optional<EventKind> event_kind_from_string(std::string_view s) noexcept { return util::value_in(kKinds, s); }

nlohmann::json to_json(const Event& e) {
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

Result<Event> event_from_json(EventKind kind, const json& j) {
  try {
    if (!j.is_object()) throw json::type_error::create(302, "expected an object, not " + std::string(j.type_name()), &j);
    Event e;
    e.kind = kind;
    e.model = j.at("model").get<std::string>();
    if (kind == EventKind::watcher) {
      if (!j.at("watchdog").is_null()) e.watcher = watchdog_from_json(j["watchdog"]);
      return e;
    }
    e.id = j.at("id").get<std::string>();
    read_deployment_event(j, e);
    return e;
  } catch (const json::exception& ex) {
    return make_error(Errc::bad_request, std::string("event: ") + ex.what());
  }
}

}  // namespace modeld::wire
