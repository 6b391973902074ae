#pragma once
// The deployment record as the API shows it (interface.md "Control API", DEPLOYMENT): its
// phases, kinds and states, its progress, warm and switch objects, and their JSON both ways.
// The daemon fills these types (deploy::Deployment extends Record with its own bookkeeping) and
// modelctl reads its answers into them; the on-disk record is lib/deploy/record_file's.

#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::wire {

/// Phases in the order they run (interface.md "Deployment phases and states").
enum class Phase {
  planning, freeing_disk, downloading, verifying, warming, stopping_old, launching, health_checking,
  benchmarking, rolling_back
};

/// What a deployment does: `deploy` (a model put into service), `pull` (a revision downloaded
/// and verified ahead, no service touched) or `stop` (a model taken out of service, its files
/// kept). The API's "kind"; a record written without it is a deploy.
enum class Kind { deploy, pull, stop };

/// States: running, then exactly one terminal state.
enum class State { running, succeeded, failed, cancelled, rolled_back };

/// The stable name of a phase used in the API and the journal, e.g. "freeing_disk"; pure.
std::string_view to_string(Phase p) noexcept;
/// The stable name of a state, e.g. "rolled_back"; pure.
std::string_view to_string(State s) noexcept;
/// The stable name of a kind: "deploy", "pull" or "stop"; pure.
std::string_view to_string(Kind k) noexcept;
/// The phase named `s` by to_string(); nullopt when unknown.
std::optional<Phase> phase_from_string(std::string_view s) noexcept;
/// The state named `s` by to_string(); nullopt when unknown.
std::optional<State> state_from_string(std::string_view s) noexcept;
/// The kind named `s` by to_string(); nullopt when unknown.
std::optional<Kind> kind_from_string(std::string_view s) noexcept;

/// Progress of one file in flight, as the API reports it ("progress.files").
struct FileProgress {
  std::string path;
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  double rate_bytes_per_s = 0;
  std::optional<double> eta_s;  ///< null until the file's rate is known
  unsigned connections = 0;     ///< connections fetching parts of it now
};

/// Download progress as the API reports it: sizes in bytes, rate in bytes/s, ETA in seconds.
struct Progress {
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  unsigned files_done = 0;
  unsigned files_total = 0;
  double rate_bytes_per_s = 0;
  std::optional<double> eta_s;
  std::vector<FileProgress> files;  ///< files in flight (downloading only; not persisted)
};

/// What warming found and did, in bytes (interface.md "DEPLOYMENT.warm"): the checkpoint's
/// size, what was in the page cache before, what warming read, what was resident at launch.
struct WarmReport {
  std::uint64_t bytes_total = 0;
  std::uint64_t bytes_resident_before = 0;
  std::uint64_t bytes_warmed = 0;
  std::optional<std::uint64_t> bytes_resident_at_launch;  ///< null until launching measured it
};

/// The outage of a switch in seconds (interface.md "DEPLOYMENT.switch"): from the request to
/// stop the old service (or the start of the new one, with nothing serving) until the new one
/// is ready, and its parts.
struct SwitchReport {
  double downtime_s = 0;
  double stop_s = 0;           ///< StopUnit until nothing of the old service is left
  double launch_s = 0;         ///< between the stop and StartUnit (checks, link, drop-in, reload)
  double start_to_port_s = 0;  ///< StartUnit until the port listens
  double port_to_ready_s = 0;  ///< the port listens until the first token (or passing probe)
};

/// One deployment, running or ended, with exactly the fields the API shows (DEPLOYMENT).
struct Record {
  std::string id;                     ///< "20261129T193942Z-kimi-k2-5", unique, sortable by start
  Kind kind = Kind::deploy;
  std::string model;
  std::optional<std::string> commit;  ///< null until planned
  bool allow_downtime = false;
  /// Whether the deployment changed what serves or what is on disk; false for a no-op (the
  /// model already serves at that commit with the same settings).
  bool changed = true;
  Phase phase = Phase::planning;
  State state = State::running;
  Progress progress;
  std::optional<Error> error;
  std::string started_at;             ///< RFC 3339 UTC
  std::optional<std::string> finished_at;
  std::optional<double> benchmark_ttft_s;
  std::optional<double> benchmark_decode_tokens_per_s;
  std::optional<WarmReport> warm;             ///< null until warming ran
  std::optional<SwitchReport> switch_report;  ///< the API's "switch": null until the new service was ready

  /// Whether the deployment reached a terminal state.
  bool ended() const { return state != State::running; }
};

/// The API's error object {"code", "message"} of `e`; pure.
nlohmann::json to_json(const Error& e);
/// The API's "progress" object of a DEPLOYMENT; pure.
nlohmann::json to_json(const Progress& p);
/// The API's "warm" object of a DEPLOYMENT (also in the warming phase's progress events); pure.
nlohmann::json to_json(const WarmReport& w);
/// The API's "switch" object of a DEPLOYMENT; pure.
nlohmann::json to_json(const SwitchReport& s);
/// The API's DEPLOYMENT object of `r`, every field present (null where unknown); pure.
nlohmann::json to_json(const Record& r);

/// Reads an error object {"code", "message"}; throws nlohmann::json::exception when either is
/// missing or not a string (an unknown code reads as Errc::internal).
Error error_from_json(const nlohmann::json& j);
/// Reads a "progress" object; throws nlohmann::json::exception on a missing or mistyped field
/// ("files" may be missing).
Progress progress_from_json(const nlohmann::json& j);
/// Reads a "warm" object, nullopt for null; throws nlohmann::json::exception otherwise on a bad one.
std::optional<WarmReport> warm_from_json(const nlohmann::json& j);
/// Reads a "switch" object, nullopt for null; throws nlohmann::json::exception on a bad one.
std::optional<SwitchReport> switch_from_json(const nlohmann::json& j);
/// Reads a DEPLOYMENT object as to_json() writes it ("kind", "allow_downtime", "changed",
/// "benchmark", "warm" and "switch" may be missing, as in records of older daemons); returns
/// bad_request "deployment record: ..." naming what is missing, mistyped or unknown.
Result<Record> record_from_json(const nlohmann::json& j);
/// Reads the body of GET /v1/deployments, {"deployments": [DEPLOYMENT...]}, each record as
/// record_from_json() does; bad_request naming what is missing, mistyped or unknown.
Result<std::vector<Record>> deployments_from_json(const nlohmann::json& j);

}  // namespace modeld::wire
