#pragma once
// The owner of the daemon's state, the history and the one record that runs: starts a
// deployment, a pull or a stop as a RecordRun (record_run.hpp: it walks the plan through the phase
// table, applies each phase's result, records every transition durably before the next step
// starts, rolls back, ends the record) and answers it as its RunSink; continues an unfinished
// record after a daemon restart (boot.cpp). It is the deploy::Control the control plane talks to. Everything here runs on the event loop and never blocks it: disk work
// (records, state.json, store queries) goes to the disk pool.

#include "deploy/control.hpp"
#include "deploy/phase.hpp"
#include "deploy/state_store.hpp"
#include "deploy/steps.hpp"
#include "deploy/model_watcher.hpp"
#include "units/service_manager.hpp"
#include "util/single_flight.hpp"

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>

namespace modeld::deploy {

class RecordRun;

/// The deploy::Control: owns the running deployment, the history and the daemon state.
class Deployer final : public Control {
 public:
  /// `services` must outlive the Deployer; `states` is its durable store.
  Deployer(boost::asio::io_context& io, Services services, StateStore& states);
  /// The same with the post-deploy watchdog's timing (backoff) set, for tests.
  Deployer(boost::asio::io_context& io, Services services, StateStore& states, ModelWatcher::Options watchdog);
  ~Deployer() override;

  /// Loads the daemon state (state.json, else state.json.prev, else none: StateStore::
  /// load_or_fall_back, the journal saying which) and the history; never fails on a bad file (a
  /// restart would not fix it), recover() reconciles what it read with the units. Blocks (reads
  /// state_dir): call it at start.
  Result<void> load();

  /// At daemon start: adopts (or reports) the model services that run without a line in the
  /// state (reconcile.hpp); then rewrites the drop-in of every service in service and starts those that are
  /// not running (of two that today's configuration makes conflict, the one put into service later
  /// starts and the journal names the other, which leaves service), except those an unfinished
  /// deployment began to stop, which is then continued. Each service is watched by its own model
  /// watcher, except while a continued deployment owns it.
  boost::asio::awaitable<void> recover();

  /// Stops the watchdog and the running deployment for a daemon shutdown, leaving the deployment
  /// recorded as running so the next start continues it; calls `done` once nothing runs any more.
  void shutdown(std::function<void()> done);

  /// Hangs the Deployer off a cancellation tree (the daemon's stop): an emit on `slot` runs
  /// shutdown(`done`). Returns at once.
  void shutdown_on(boost::asio::cancellation_slot slot, std::function<void()> done);

  /// Takes over a reloaded configuration (SIGHUP): new deployments, plans, verify, rm, the model
  /// list and the watchdog use `config` from now on. A running deployment is not interrupted: it
  /// finishes (or rolls back) with the configuration it started with. When no deployment runs,
  /// each service whose model's table changed gets its drop-in rewritten (the server keeps
  /// running with its old settings until its next start) and its watcher starts over with the new
  /// intervals. Settings that need a restart must already be set back (keep_fixed_settings).
  /// Logs what changed; never fails.
  void reconfigure(std::shared_ptr<const config::Config> config);

  /// The configuration in use now (the one of the last successful reload).
  std::shared_ptr<const config::Config> config() const { return services_.config; }

  /// A one-line summary for sd_notify STATUS=, e.g. "downloading kimi-k2-5: 37% of 547.0 GB, ...".
  std::string status_line() const;

  // Control
  std::optional<Active> active() const override;
  std::vector<ServiceInfo> services() const override;
  Result<Deployment> stop(const std::string& model) override;
  std::optional<Deployment> current() const override;
  std::vector<Deployment> history(std::size_t limit) const override;
  Result<Deployment> get(const std::string& id) const override;
  Result<Deployment> start(const DeployRequest& request) override;
  Result<Deployment> cancel(const std::string& id) override;
  /// Walks the store on a pool of its own (one thread, never the disk pool, so a long deletion
  /// there cannot delay it; concurrent calls share one walk), then fills in the configuration and
  /// the daemon state on the event loop. While modeld itself links or deletes files (an rm, an
  /// eviction, the clean-up of old revisions: Store::read_if_settled), it answers the list as of
  /// the last walk instead of waiting for that to end. Only a stalled disk delays it (readdir,
  /// stat), and never the event loop. A revision never verified is "partial", one whose files no
  /// longer match its manifest "corrupt".
  boost::asio::awaitable<std::vector<ModelInfo>> models() override;
  boost::asio::awaitable<Result<PlanReport>> plan(std::string model, bool allow_downtime,
                                                  std::optional<std::string> commit) override;
  boost::asio::awaitable<Result<VerifyReport>> verify(std::string model) override;
  boost::asio::awaitable<Result<Removal>> remove(std::string model) override;
  boost::asio::awaitable<Result<Removal>> remove_revision(std::string model, std::string commit) override;
  std::uint64_t subscribe(std::function<void(const Event&)> listener) override;
  void unsubscribe(std::uint64_t token) override;
  double uptime_s() const override;
  std::vector<WatchdogStatus> watchdogs() const override;

 private:
  class Sink;
  // Whether the daemon's state has `model` in service at `commit`.
  bool in_service(const std::string& model, const std::optional<std::string>& commit) const;
  // Writes state.json on the disk pool (awaited), logging under `f` (not failing) when it cannot.
  boost::asio::awaitable<void> save_state(const sys::Fields& f);
  // The service of `model`, in service, was started with `settings` (nullopt: unknown):
  // recorded in state.json (written in the background).
  void record_started(const std::string& model, const std::optional<StartedSettings>& settings);
  // The no-op rule for deployment `d` (a deploy of run.model at d.commit), which both a deployment
  // and a plan decide with: nullopt when it would change nothing, else why not ("" when the model
  // does not serve that commit at all). Probes the serving model once.
  boost::asio::awaitable<std::optional<std::string>> why_not_noop(const Deployment& d, const Run& run);
  // At start: each model service that runs without a line in the state is adopted or reported;
  // the state is saved when that changed it or it came from a fallback.
  // Models in `skip` belong to an interrupted deployment.
  boost::asio::awaitable<void> reconcile_with_units(const std::set<std::string>& skip);
  // rm's last check, with systemd: model_active when the unit of `model` is up and modeld has no
  // service of it in state (or `whole_model`); the status error when systemd cannot be asked.
  boost::asio::awaitable<std::optional<Error>> unit_runs(const std::string& model, bool whole_model);
  // At start: the services that today's configuration makes conflict leave service (the later
  // one stays), except those in `owned` (an unfinished deployment's); returns each unit's status.
  boost::asio::awaitable<std::map<std::string, Result<units::UnitStatus>>> settle_conflicts_at_boot(
      const std::set<std::string>& owned);
  // At start: service `a`'s drop-in rewritten and its unit (status `st`) started unless it runs;
  // sets `watch` (it may be watched) and `started_unit` (readiness comes before the first probe).
  boost::asio::awaitable<void> recover_service(const ActiveRecord& a, const Result<units::UnitStatus>& st, bool& watch,
                                               bool& started_unit);
  // Reload: the drop-in of service `model` rewritten when its table changed, its watcher restarted.
  void reconfigure_service(const std::string& model, const config::Config& old);
  // Why no new record may start now (one runs, one is about to continue, shutdown, verify or rm).
  std::optional<Error> refuse_new_record() const;
  /// deployment_running while a record a restart interrupted waits for recover() to take it up
  /// (deploy, pull, stop, verify, rm and rm --commit all refuse then).
  std::optional<Error> refuse_while_recovering() const;
  // A new record of `kind` for `model`, not started.
  Deployment new_record(const std::string& model, Kind kind) const;
  // At start: continues the interrupted deployment `d` (or fails it when its model went).
  boost::asio::awaitable<void> continue_unfinished(Deployment& d);
  // Makes record `d` the running one and starts its run from step `first` (RecordRun::start).
  void begin(Deployment d, Step first);
  /// Writes the terminal journal line of every ended record that modeld was killed before logging
  /// (end_unlogged), noting so, and persists it logged (awaited); recover() calls it first.
  boost::asio::awaitable<void> log_unlogged_ends();
  // Queues a write of record `d` on the disk pool after every write queued before; returns at once.
  void persist(const Deployment& d);
  // Writes record `d` on the disk pool after every write queued before, and waits for it.
  boost::asio::awaitable<void> persist_now(const Deployment& d);
  // Tells every listener about deployment `d` as an event of `kind`.
  void emit(EventKind kind, const Deployment& d);
  // Calls every listener with `e`.
  void publish(const Event& e);
  // Sends STATUS= (status_line) to systemd.
  void announce_status();
  // What a watcher restarts `model` with: nullopt (today's settings), or the settings it ran with
  // when today's would make it conflict with a service in service or the one a running deploy is
  // about to start (logged); model_active naming both when those conflict too (no restart).
  Result<std::optional<StartedSettings>> settings_for_restart(const std::string& model) const;
  // Of the services in service (all but `except`) and the one a running deploy is about to start
  // (unless its model is in `except`), the first that `p` conflicts with: "MODEL (why)".
  std::optional<std::string> placement_taken(const Placement& p, const std::set<std::string>& except) const;
  // The model watcher of `model`, made on first use (its counters are kept across watches).
  ModelWatcher& watcher_for(const std::string& model);
  // Starts watching service `model` unless it is not in service, already watched, or owned by the
  // running deployment.
  void watch_service(const std::string& model, bool wait_ready_first);
  // Watches every service in service but those in `except`.
  void watch_services(const std::set<std::string>& except = {});
  // Stops the watchers of `models` (cancelled, awaited).
  boost::asio::awaitable<void> stop_watching(std::set<std::string> models);
  // Whether any watcher runs.
  bool any_watching() const;
  // After `modelctl verify` found the files of `model` at `commit` intact: when that revision is
  // the active one and the watchdog had stopped (it gives up on changed files), watches it again.
  void rewatch_verified(const std::string& model, const std::string& commit, const sys::Fields& f);
  std::string new_id(const std::string& model, std::chrono::system_clock::time_point now) const;
  // unknown_model when `model` is neither configured nor on disk (a stat on the disk pool).
  boost::asio::awaitable<std::optional<Error>> unknown_model(const std::string& model);
  std::optional<Error> disk_conflict(const std::string& model, std::string_view action) const;
  // What one walk of the store found (models()).
  struct DiskModels;
  // One walk of the store on status_pool_, or the last one while modeld's own links or unlinks run.
  boost::asio::awaitable<Result<std::shared_ptr<const DiskModels>>> walk_store();
  // The configured models with what `disk` found of them; on the event loop, never blocks.
  std::vector<ModelInfo> model_list(const DiskModels& disk) const;
  // The revisions of `model` that a walk found (commit, state), with their marks from the daemon's state.
  std::vector<RevisionInfo> revisions_of(const std::string& model,
                                         const std::vector<std::pair<std::string, std::string>>& on_disk) const;
  // The dry run of plan() for model `m` of the configuration plan() holds while it runs.
  boost::asio::awaitable<Result<PlanReport>> plan_now(const config::ModelConfig& m, bool allow_downtime,
                                                      std::optional<std::string> commit);

  boost::asio::io_context& io_;
  Services services_;
  StateStore& states_;
  /// Record and state writes run here one at a time, in the order they were asked for.
  boost::asio::strand<boost::asio::thread_pool::executor_type> writes_;
  DaemonState state_;
  std::deque<Deployment> history_;  ///< ended deployments, newest first
  /// The Deployer's side of the running record (RunSink); declared before running_, so it goes last.
  std::unique_ptr<Sink> sink_;
  std::shared_ptr<RecordRun> running_;  ///< the record that runs now, if any
  std::map<std::uint64_t, std::function<void(const Event&)>> listeners_;
  std::uint64_t next_listener_ = 1;
  /// Models that a verify or rm works on now (model -> "verify" or "rm"): a deployment does not
  /// start meanwhile, so no phase links from, evicts or rewrites a revision under them.
  std::map<std::string, std::string> busy_;
  bool shutting_down_ = false;
  /// Plans running now, by model, allow_downtime and configuration: a plan asked for while the
  /// same one runs shares its result (and its Hub listing).
  util::SingleFlight<PlanReport> plans_;
  std::size_t plans_waiting_ = 0;  ///< callers of plan() now, leaders and waiters
  // "ID of MODEL" of the deployment a restart interrupted, from load() until recover() takes it
  // up: start() refuses meanwhile, so a new deployment cannot race its continuation.
  std::optional<std::string> interrupted_;
  /// Where load() found the state (after a fallback recover() saves it at once).
  StateSource state_source_ = StateSource::fresh;
  std::function<void()> on_idle_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  /// The store walks of models(): one at a time, shared by concurrent callers, the last one kept.
  util::SingleFlight<std::shared_ptr<const DiskModels>> walks_;
  std::shared_ptr<const DiskModels> last_walk_;
  /// Runs models()'s store walks, apart from the disk pool's long jobs (hashing, deletions).
  boost::asio::thread_pool status_pool_{1};
  /// The watchers' timing (tests shorten it).
  ModelWatcher::Options watch_options_;
  /// One model watcher per model that served since the daemon started, each watching its service
  /// while no deployment owns it; declared last so they go first.
  std::map<std::string, std::unique_ptr<ModelWatcher>> watchers_;
};

}  // namespace modeld::deploy
