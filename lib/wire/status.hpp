#pragma once
// GET /v1/status as the API shows it (interface.md "Control API"): the daemon, the model in
// service, every service with its watchdog, and the deployment; their JSON both ways.

#include "wire/record.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace modeld::wire {

/// The model in service now (GET /v1/status "active").
struct Active {
  std::string model;
  std::string commit;
  std::string unit;
  std::uint16_t port = 0;
  std::string since;  ///< RFC 3339
};

/// The post-deploy watchdog of one model (GET /v1/status "watchdog", GET /metrics).
struct WatchdogStatus {
  std::string model;
  std::string unit;
  std::string state = "stopped";  ///< "watching", "restarting", "backoff" or "stopped"
  unsigned consecutive_failures = 0;  ///< failed probes in a row now
  std::uint64_t restarts = 0;         ///< restarts by the watchdog since the daemon started
  std::uint64_t probe_failures = 0;   ///< failed probes since the daemon started
  std::optional<std::string> last_restart_at;      ///< RFC 3339
  std::optional<std::string> last_restart_reason;  ///< the probe's answer, or the unit's state and exit
  std::optional<std::string> last_probe_at;        ///< RFC 3339
  std::optional<bool> last_probe_ok;
  std::optional<double> last_probe_seconds;  ///< how long the last probe took, in seconds
};

/// One service in service (GET /v1/status "services"), with what it was started with.
struct ServiceInfo {
  std::string model;
  std::string commit;
  std::string unit;
  std::uint16_t port = 0;                       ///< the port it was started on
  std::optional<std::vector<unsigned>> gpu_ids;  ///< NVML indices it was given; nullopt: every GPU
  std::string since;                            ///< RFC 3339: when it was put into service
  std::optional<WatchdogStatus> watchdog;       ///< its model watcher's record; nullopt when never watched
};

/// The body of GET /v1/status.
struct Status {
  std::string version;   ///< "daemon.version": the daemon's MODELD_VERSION
  double uptime_s = 0;   ///< "daemon.uptime_s": seconds since the daemon started
  std::optional<Active> active;
  std::vector<ServiceInfo> services;       ///< in the order put into service
  std::optional<WatchdogStatus> watchdog;  ///< the active model's watchdog
  std::optional<Record> deployment;        ///< the running deployment, else the most recent one
};

/// The watchdog record as GET /v1/status's "watchdog" shows it; pure.
nlohmann::json to_json(const WatchdogStatus& w);
/// The body of GET /v1/status; pure.
nlohmann::json to_json(const Status& s);

/// Reads a "watchdog" object (a missing field keeps its default); throws
/// nlohmann::json::exception on a mistyped one.
WatchdogStatus watchdog_from_json(const nlohmann::json& j);
/// Reads the body of GET /v1/status as to_json() writes it (a missing field keeps its default,
/// but "daemon" is required); bad_request "status: ..." naming what is missing or mistyped.
Result<Status> status_from_json(const nlohmann::json& j);

}  // namespace modeld::wire
