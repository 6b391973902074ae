#pragma once
// The narrow interface through which the control plane reads and drives deployments
// (design.md: "control reads deployment state through one narrow interface").

#include "deploy/deployment.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

/// The model in service now.
struct Active {
  std::string model;
  std::string commit;
  std::string unit;
  std::uint16_t port = 0;
  std::string since;  ///< RFC 3339
};

/// One revision of a model on disk (GET /v1/models "revisions").
struct RevisionInfo {
  std::string commit;
  std::string state;        ///< "partial", "verified" or "corrupt"
  bool pulled = false;      ///< pulled ahead and not deployed or removed since
  bool in_service = false;  ///< the commit of the model in service
};

/// One configured model and what is on disk for it (GET /v1/models).
struct ModelInfo {
  std::string name, repo, revision;
  std::optional<std::string> commit;  ///< the verified commit on disk, if any
  std::string state;                  ///< "absent", "partial", "verified", "corrupt"
  std::uint64_t size_bytes = 0;
  bool active = false;
  bool pinned = false;
  std::optional<std::string> last_active;  ///< RFC 3339
  std::vector<RevisionInfo> revisions;     ///< every revision on disk, by commit
};

/// A model that a plan would delete to make room, in the order it would go.
struct PlannedEviction {
  std::string name;
  std::uint64_t bytes = 0;                 ///< what deleting it frees
  std::optional<std::string> last_active;  ///< RFC 3339; nullopt when it never served
  bool active = false;                     ///< a model in service that the deployment stops (only with allow_downtime)
};

/// One check of the pre-flight (interface.md "Pre-flight"): what a deployment checks before it
/// stops anything.
struct PreflightCheck {
  std::string check;    ///< "command", "gpus" or "port"
  bool ok = true;       ///< passed, or could not be checked (the message says which)
  std::string message;  ///< a sentence; a failure names the key (models.NAME.serve.port) and its file
};

/// The outcome of a dry run of planning and freeing_disk (GET /v1/models/{name}/plan).
/// All sizes in bytes.
struct PlanReport {
  std::string model, repo, revision;
  std::string commit;                 ///< what the revision resolves to now
  bool verified = false;              ///< that commit is on disk and verified: nothing to do
  std::uint64_t files_total = 0;      ///< files that pass include/exclude
  std::uint64_t bytes_total = 0;
  std::uint64_t files_to_fetch = 0;   ///< not on disk, and not hard-linkable from an older revision
  std::uint64_t bytes_to_fetch = 0;
  std::uint64_t bytes_local = 0;      ///< bytes_total - bytes_to_fetch: present or linkable
  std::uint64_t bytes_linkable = 0;   ///< part of bytes_local: hard links from older verified revisions
  std::uint64_t bytes_partial = 0;    ///< of partial downloads already on disk (resumed, not fetched again)
  std::optional<std::string> adopt_from;  ///< a folder made outside modeld at models_dir/NAME, when there is one
  std::uint64_t files_adoptable = 0;  ///< files there with the listed size, not known to differ (hashed at deployment)
  std::uint64_t bytes_adoptable = 0;  ///< part of bytes_local
  std::uint64_t bytes_needed = 0;     ///< bytes_to_fetch - bytes_partial: new disk space the download takes
  std::uint64_t bytes_free = 0;       ///< statvfs f_bavail of models_dir
  std::uint64_t disk_reserve = 0;
  std::vector<PlannedEviction> evictions;
  bool fits = false;
  std::uint64_t shortfall_bytes = 0;  ///< when it does not fit: what is missing even after every eviction
  bool allow_downtime = false;
  std::optional<std::string> active_model;  ///< the model in service when planned (of several, the one put into service last)
  /// The services a deployment would stop: those in conflict with the model (same model, GPUs
  /// that overlap, or the same port); every other keeps serving.
  std::vector<std::string> stops;
  bool rollback_possible = true;      ///< false when the plan evicts a model it stops
  /// When warming would run: "before_stop" (while the old model serves), "in_outage" (after
  /// allow_downtime stopped the evicted active model: it adds to the outage) or "off" (serve.warm).
  std::string warming = "before_stop";
  /// Without allow_downtime and not fitting: whether evicting the active model would make it fit.
  bool fits_with_allow_downtime = false;
  /// A deployment of this commit would end succeeded with changed false: the model serves it with
  /// the same started settings, its unit is active, its files match and its probe passes.
  bool already_serving = false;
  /// The pre-flight a deployment runs in planning and before stopping_old, in order.
  std::vector<PreflightCheck> preflight;
};

/// One thing wrong with a model on disk (POST /v1/models/{name}/verify).
struct VerifyProblem {
  std::string code;     ///< Errc name: checksum_mismatch, size_mismatch, checkpoint_incomplete, ...
  std::string file;     ///< repository-relative path
  std::string tensor;   ///< empty when not about one tensor
  std::string message;  ///< sentence naming file and tensor
};

/// The outcome of re-hashing and re-checking one revision on disk.
struct VerifyReport {
  std::string model, commit;
  std::uint64_t files = 0;  ///< files checked
  std::uint64_t bytes = 0;  ///< bytes hashed (hard-linked files counted once per path)
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

/// What rm deleted (DELETE /v1/models/{name}).
struct Removal {
  std::string model;
  std::uint64_t bytes_freed = 0;
  std::vector<std::string> commits;  ///< revisions deleted
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
  std::uint16_t port = 0;                           ///< the port it was started on
  std::optional<std::vector<unsigned>> gpu_ids;      ///< NVML indices it was given; nullopt: every GPU
  std::string since;                                ///< RFC 3339: when it was put into service
  std::optional<WatchdogStatus> watchdog;           ///< its model watcher's record; nullopt when never watched
};

/// What an Event reports: a deployment entered a phase, made download progress or changed
/// state (the SSE stream's "phase", "progress" and "state"), or the model watcher's record of the
/// active model changed ("watcher": not sent on the SSE stream, which the contract fixes).
enum class EventKind { phase, progress, state, watcher };

/// The SSE event name of `k`: "phase", "progress", "state" or "watcher".
std::string_view to_string(EventKind k) noexcept;

/// One event of the Deployer, as fields; JSON is made only where it leaves the daemon (event_json).
struct Event {
  EventKind kind = EventKind::phase;
  std::string id;     ///< the deployment's id; empty for watcher events
  std::string model;  ///< the deployment's model, or the watched model
  /// phase: the phase begun; progress: the phase the progress belongs to; state: the phase the
  /// deployment is in (or ended in).
  Phase phase = Phase::planning;
  State state = State::running;   ///< state events: the new state
  std::optional<Error> error;     ///< state events: why it failed, was cancelled or rolled back
  Progress progress;              ///< progress events: the download's progress
  std::optional<WarmReport> warm;  ///< progress events of the warming phase: its figures
  std::optional<WatchdogStatus> watcher;  ///< watcher events: the model watcher's record now
};

/// The watchdog record as GET /v1/status's "watchdog" shows it (interface.md).
nlohmann::json to_json(const WatchdogStatus& w);

/// The event `kind` of deployment `d`, its fields copied from the record.
Event deployment_event(EventKind kind, const Deployment& d);

/// The SSE stream's data of a phase, progress or state event, as the contract fixes it:
/// {id, model, phase}, {id, model, progress} (plus "phase" and "warm" in the warming phase) or
/// {id, model, state, phase, error}; a watcher
/// event gives {model, watchdog} (the record as GET /v1/status's "watchdog" has it, never sent).
nlohmann::json event_json(const Event& e);

/// What `POST /v1/deployments` asks for (interface.md "Control API"), or `POST
/// /v1/models/{name}/pull` (kind pull).
struct DeployRequest {
  std::string model;
  bool allow_downtime = false;
  bool restart = false;  ///< restart the model even when it already serves that commit with the same settings
  Kind kind = Kind::deploy;
  std::optional<std::string> commit;  ///< "commit": exactly this commit (40 lowercase hex), not the branch
};

/// What the control plane may ask of the Deployer; all calls happen on the io_context thread
/// (named Control, not Engine: in modeld "engine" means the inference server, vLLM or SGLang).
class Control {
 public:
  virtual ~Control() = default;
  /// The model in service, if any: of several, the one put into service last.
  virtual std::optional<Active> active() const = 0;
  /// Every service in service, in the order they were put into service (the last is active()).
  virtual std::vector<ServiceInfo> services() const = 0;
  /// The running deployment, else the most recent one, else nullopt.
  virtual std::optional<Deployment> current() const = 0;
  /// Deployments newest first, at most `limit`.
  virtual std::vector<Deployment> history(std::size_t limit) const = 0;
  /// One deployment by id; not_found when unknown.
  virtual Result<Deployment> get(const std::string& id) const = 0;
  /// Starts a deployment as `request` asks; unknown_model, deployment_running.
  virtual Result<Deployment> start(const DeployRequest& request) = 0;
  /// Takes `model` out of service (`modelctl stop`, POST /v1/models/{name}/stop): starts a
  /// record of kind stop whose one phase, stopping_old, stops its service and waits until nothing
  /// of it is left; from then on it is neither watched nor started at boot, and its files stay.
  /// A model that is not in service gives a record that ends succeeded at once, changed false.
  /// Errors: unknown_model; deployment_running as start().
  virtual Result<Deployment> stop(const std::string& model) = 0;
  /// Requests cancellation; not_found, deployment_ended.
  virtual Result<Deployment> cancel(const std::string& id) = 0;
  /// Configured models with their on-disk state; the store walk runs off the event loop (an
  /// Deployer answers without waiting behind its own disk work: see Deployer::models).
  virtual boost::asio::awaitable<std::vector<ModelInfo>> models() = 0;
  /// Dry run of planning and freeing_disk for `model` at `commit` (nullopt: its configured
  /// revision): lists the Hub, changes nothing on disk, and says whether deploying it would change
  /// nothing (PlanReport::already_serving: the no-op rule, with one probe of the serving model).
  /// Errors: unknown_model; the Hub's (hub_not_found, hub_unavailable, network_error, ...,
  /// messages naming the repository); plan_invalid for filters that drop needed files; io_error.
  virtual boost::asio::awaitable<Result<PlanReport>> plan(std::string model, bool allow_downtime,
                                                          std::optional<std::string> commit) = 0;
  /// Re-hashes and re-checks the on-disk revision of `model` (the one models_dir/NAME points to,
  /// else the newest verified one) on the disk pool; problems are a value, not an error. A clean
  /// result refreshes the manifest's file identities. Errors: unknown_model; not_found when no
  /// verified revision is on disk; deployment_running while a deployment runs, or another
  /// verify or rm is in progress; io_error when the manifest cannot be read or written.
  virtual boost::asio::awaitable<Result<VerifyReport>> verify(std::string model) = 0;
  /// Deletes the store folders and the link of `model` on the disk pool, never following a
  /// symlink out of models_dir. Errors: unknown_model (neither configured nor on disk);
  /// deployment_running when `model` is the active model (the message says so; the API answers
  /// it as 409 model_active), when a running deployment deploys or replaces it, or while a
  /// verify or rm is in progress; io_error (also when models_dir/NAME is a real folder, left alone).
  virtual boost::asio::awaitable<Result<Removal>> remove(std::string model) = 0;
  /// Deletes revision `commit` of `model` on the disk pool (and models_dir/NAME when it links
  /// there), and its pulled mark. Errors: unknown_model; model_active when it is the commit in
  /// service; not_found when that revision is not on disk; deployment_running as remove();
  /// bad_request for a commit that is not 40 hex digits; io_error.
  virtual boost::asio::awaitable<Result<Removal>> remove_revision(std::string model, std::string commit) = 0;
  /// Registers a listener for events; returns a token for unsubscribe().
  virtual std::uint64_t subscribe(std::function<void(const Event&)> listener) = 0;
  /// Removes a listener.
  virtual void unsubscribe(std::uint64_t token) = 0;
  /// Seconds since the daemon started.
  virtual double uptime_s() const = 0;
  /// The watchdog's records: the model watched now (or last) first, then every other model
  /// watched since the daemon started; empty when nothing was watched. Not pure, so engines
  /// without a watchdog (test fakes) need not implement it.
  virtual std::vector<WatchdogStatus> watchdogs() const { return {}; }
};

}  // namespace modeld::deploy
