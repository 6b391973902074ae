#include "wire/status.hpp"

#include "wire/fields.hpp"

#include <concepts>

namespace modeld::wire {

using detail::either;

template <either<Active> S, class F>
void fields(S& a, F&& f) {
  f("model", a.model);
  f("commit", a.commit);
  f("unit", a.unit);
  f("port", a.port);
  f("since", a.since);
}

template <either<WatchdogStatus> S, class F>
void fields(S& w, F&& f) {
  f("model", w.model);
  f("unit", w.unit);
  f("state", w.state);
  f("consecutive_failures", w.consecutive_failures);
  f("restarts", w.restarts);
  f("probe_failures", w.probe_failures);
  f("last_restart_at", w.last_restart_at);
  f("last_restart_reason", w.last_restart_reason);
  f("last_probe_at", w.last_probe_at);
  f("last_probe_ok", w.last_probe_ok);
  f("last_probe_seconds", w.last_probe_seconds);
}

template <either<ServiceInfo> S, class F>
void fields(S& s, F&& f) {
  f("model", s.model);
  f("commit", s.commit);
  f("unit", s.unit);
  f("port", s.port);
  f("gpu_ids", s.gpu_ids);
  f("since", s.since);
  f("watchdog", s.watchdog);
}

// "daemon" is an object of its own and "deployment" a Record (record.hpp reads and writes it):
// both beside these.
template <either<Status> S, class F>
void fields(S& s, F&& f) {
  f("active", s.active);
  f("services", s.services);
  f("watchdog", s.watchdog);
}

nlohmann::json to_json(const WatchdogStatus& w) { return detail::write(w); }

nlohmann::json to_json(const Status& s) {
  auto body = detail::write(s);
  body["daemon"] = nlohmann::json{{"version", s.version}, {"uptime_s", s.uptime_s}};
  body["deployment"] = s.deployment ? to_json(*s.deployment) : nlohmann::json(nullptr);
  return body;
}

WatchdogStatus watchdog_from_json(const nlohmann::json& j) {
  WatchdogStatus w;
  detail::read(j, w);
  return w;
}

Result<Status> status_from_json(const nlohmann::json& j) {
  try {
    Status s;
    detail::read(j, s);
    s.version = j.at("daemon").at("version").get<std::string>();
    s.uptime_s = j.at("daemon").at("uptime_s").get<double>();
    if (j.contains("deployment") && !j["deployment"].is_null()) {
      auto d = record_from_json(j["deployment"]);
      if (!d) return d.error();
      s.deployment = std::move(*d);
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::bad_request, std::string("status: ") + e.what());
  }
}

}  // namespace modeld::wire
