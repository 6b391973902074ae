#pragma once
// The deployment record: what the API calls DEPLOYMENT (interface.md "Control API"), its
// phases and states, and its JSON form (the same in the API, the SSE stream and state_dir).

#include "deploy/records.hpp"
#include "deploy/started.hpp"
#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

namespace modeld::deploy {

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

/// Stable names used in the API and the journal, e.g. "freeing_disk", "rolled_back".
std::string_view to_string(Phase p) noexcept;
std::string_view to_string(State s) noexcept;
/// Parses a name from to_string(); nullopt when unknown.
std::optional<Phase> phase_from_string(std::string_view s) noexcept;
std::optional<State> state_from_string(std::string_view s) noexcept;
std::string_view to_string(Kind k) noexcept;
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

/// Wall-clock marks of a switch in ns since the epoch, 0 while not reached; internal, persisted
/// as each is reached, so a daemon restarted mid-switch still measures the whole outage.
struct SwitchMarks {
  std::int64_t stop_requested_ns = 0;   ///< just before StopUnit of the old service
  std::int64_t stop_done_ns = 0;        ///< nothing of the old service left (control group, ports)
  std::int64_t start_requested_ns = 0;  ///< just before StartUnit of the service that is to serve
  std::int64_t port_ns = 0;             ///< its readiness wait first saw the port accept a connection
  std::int64_t ready_ns = 0;            ///< its first token (or passing probe with health.completion = false)
};

/// The switch's outage from `m`, in seconds: from stop_requested (start_requested when nothing
/// was stopped) to ready, and its parts (negative spans read as 0). nullopt until a start and a
/// ready are marked.
std::optional<SwitchReport> switch_report_of(const SwitchMarks& m);

/// The current wall-clock time in ns since the epoch, as SwitchMarks holds it.
std::int64_t wall_clock_ns();

/// One deployment, running or ended.
struct Deployment {
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
  std::optional<WarmReport> warm;            ///< null until warming ran
  std::optional<SwitchReport> switch_report;  ///< the API's "switch": null until the new service was ready
  // Internal bookkeeping that lets a restarted daemon continue or roll back (also persisted).
  /// The services in conflict with the model when it started (a stop: the one it stops), in the
  /// order they were put into service, each with the settings it was started with when
  /// recorded: stopping_old stops them, rolling_back starts them again with exactly those
  /// settings, not as today's configuration would render them. Every other service is left alone.
  std::vector<ActiveRecord> previous;
  /// `"restart": true` was asked for: restart the model even when it already serves that commit
  /// with the same settings.
  bool restart = false;
  bool old_stopped = false;                    ///< stopping_old began: a failure or cancel now rolls back
  /// allow_downtime and the disk plan must evict the active model: stopping_old runs right after
  /// planning, before freeing_disk (interface.md "Deployment phases and states").
  bool downtime_first = false;
  bool cancel_requested = false;
  /// Cleanup of the model's older revisions began (after health_checking, not cancellable): a
  /// restart that finds the deployment still in health_checking finishes it.
  bool cleanup_begun = false;
  SwitchMarks switch_marks;  ///< what switch_report is computed from
  /// The start time in ns since the epoch: orders deployments started in one second (ids and
  /// started_at have whole seconds) when the history is read back from state_dir; 0 in records
  /// written before it was kept.
  std::int64_t started_ns = 0;
  /// The record ended and its terminal journal line may not be written yet (state_dir only, never
  /// the API): the next start writes the line of a record modeld was killed before logging.
  bool end_unlogged = false;

  bool ended() const { return state != State::running; }
};

/// The API's "progress" object of a DEPLOYMENT.
nlohmann::json to_json(const Progress& p);

/// The API's "warm" object of a DEPLOYMENT (also in the warming phase's progress events).
nlohmann::json to_json(const WarmReport& w);

/// The API's DEPLOYMENT object (internal bookkeeping fields left out unless `internal`).
nlohmann::json to_json(const Deployment& d, bool internal = false);

/// Reads a deployment written by to_json(d, true); hub_bad_response-free: io errors are the
/// caller's; returns bad_request naming the field on a malformed object.
Result<Deployment> deployment_from_json(const nlohmann::json& j);

/// The API's error object {"code", "message"}.
nlohmann::json error_json(const Error& e);

}  // namespace modeld::deploy
