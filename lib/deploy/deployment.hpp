#pragma once
// The deployment record: what the API calls DEPLOYMENT (interface.md "Control API"), its
// phases and states, and its JSON form (the same in the API, the SSE stream and state_dir).

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
  planning, freeing_disk, downloading, verifying, stopping_old, launching, health_checking,
  benchmarking, rolling_back
};

/// What a deployment does: today only `deploy` (a model put into service); `pull` and `stop`
/// follow. Persisted as the internal field "kind"; a record without it is a deploy.
enum class Kind { deploy };

/// States: running, then exactly one terminal state.
enum class State { running, succeeded, failed, cancelled, rolled_back };

/// Stable names used in the API and the journal, e.g. "freeing_disk", "rolled_back".
std::string_view to_string(Phase p) noexcept;
std::string_view to_string(State s) noexcept;
/// Parses a name from to_string(); nullopt when unknown.
std::optional<Phase> phase_from_string(std::string_view s) noexcept;
std::optional<State> state_from_string(std::string_view s) noexcept;

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

/// One deployment, running or ended.
struct Deployment {
  std::string id;                     ///< "20261129T193942Z-kimi-k2-5", unique, sortable by start
  Kind kind = Kind::deploy;
  std::string model;
  std::optional<std::string> commit;  ///< null until planned
  bool allow_downtime = false;
  Phase phase = Phase::planning;
  State state = State::running;
  Progress progress;
  std::optional<Error> error;
  std::string started_at;             ///< RFC 3339 UTC
  std::optional<std::string> finished_at;
  std::optional<double> benchmark_ttft_s;
  std::optional<double> benchmark_decode_tokens_per_s;
  // Internal bookkeeping that lets a restarted daemon continue or roll back (also persisted).
  std::optional<std::string> previous_model;   ///< the model that served when it started
  std::optional<std::string> previous_commit;
  bool old_stopped = false;                    ///< stopping_old began: a failure or cancel now rolls back
  /// allow_downtime and the disk plan must evict the active model: stopping_old runs right after
  /// planning, before freeing_disk (interface.md "Deployment phases and states").
  bool downtime_first = false;
  bool cancel_requested = false;
  /// Cleanup of the model's older revisions began (after health_checking, not cancellable): a
  /// restart that finds the deployment still in health_checking finishes it.
  bool cleanup_begun = false;
  /// The start time in ns since the epoch: orders deployments started in one second (ids and
  /// started_at have whole seconds) when the history is read back from state_dir; 0 in records
  /// written before it was kept.
  std::int64_t started_ns = 0;

  bool ended() const { return state != State::running; }
};

/// The API's "progress" object of a DEPLOYMENT.
nlohmann::json to_json(const Progress& p);

/// The API's DEPLOYMENT object (internal bookkeeping fields left out unless `internal`).
nlohmann::json to_json(const Deployment& d, bool internal = false);

/// Reads a deployment written by to_json(d, true); hub_bad_response-free: io errors are the
/// caller's; returns bad_request naming the field on a malformed object.
Result<Deployment> deployment_from_json(const nlohmann::json& j);

/// The API's error object {"code", "message"}.
nlohmann::json error_json(const Error& e);

}  // namespace modeld::deploy
