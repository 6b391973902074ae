#include "deploy/deployer.hpp"
#include "deploy/preflight.hpp"
#include "deploy/reconcile.hpp"
#include "deploy/redeploy.hpp"
#include "util/json.hpp"

#include "fetch/fetch.hpp"
#include "store/store.hpp"
#include "sys/notify.hpp"
#include "sys/task.hpp"
#include "units/service_manager.hpp"
#include "util/memory.hpp"
#include "util/on_pool.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include <sys/stat.h>

namespace modeld::deploy {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

/// The live part of the running deployment.
struct Deployer::Running {
  explicit Running(Services s) : services(std::move(s)) {}
  /// The services with the configuration this deployment started with: a reload never changes
  /// what a running deployment does.
  Services services;
  Deployment record;
  std::unique_ptr<Run> run;                  ///< what the phases read; changed by the driver only
  std::unique_ptr<Decisions> decisions;      ///< the phases' sink (RunDecisions)
  std::vector<PlannedStep> steps;            ///< the plan, from the record (kind, downtime_first)
  std::optional<PlannedStep> step;           ///< the step that runs now; nullopt before the first
  bool rolling_back = false;                 ///< rolling_back runs (not a step of the plan)
  bool new_serves = false;                   ///< health_checking passed: this deployment's model serves
  bool interrupted = false;                  ///< a shutdown cut it short: left running for the next start
  /// A stop of a model no longer configured: the table its phase reads (name, port from its settings).
  std::optional<config::ModelConfig> own_model;
  std::set<std::string> not_restored;        ///< models a failed rollback could not bring back: not watched
  asio::cancellation_signal cancel;  ///< bound to the phase that runs now
  Clock::time_point last_journal_progress{};
  Clock::time_point last_status{};
};

/// The decisions of the running deployment, recorded and persisted by the Deployer.
class Deployer::RunDecisions final : public Decisions {
 public:
  RunDecisions(Deployer& deployer, Running& r) : deployer_(deployer), r_(r) {}
  asio::awaitable<void> commit_chosen(const std::string& commit) override {
    r_.record.commit = commit;
    co_await deployer_.persist_now(r_.record);
  }
  asio::awaitable<void> stopping_old() override {
    r_.record.old_stopped = true;
    // A restart mid-switch keeps the first request's time: the outage began there.
    auto& marks = r_.record.switch_marks;
    if (!marks.stop_requested_ns) marks.stop_requested_ns = wall_clock_ns();
    co_await deployer_.persist_now(r_.record);
    // A stop decided: from here on the model is out of service, neither watched nor started at boot.
    if (r_.record.kind == Kind::stop) co_await deployer_.take_out_of_service(r_);
  }
  void progress(const fetch::Progress& p) override { deployer_.on_progress(r_, p); }
  void warm_progress(const WarmReport& w) override { deployer_.on_warm_progress(r_, w); }

 private:
  Deployer& deployer_;
  Running& r_;
};

namespace {

// Whether anything of `model` is under models_dir: its link (or whatever is at its name) or its
// store folder. A name that is not a valid model name never is.
bool on_disk(const store::Store& st, const std::string& model) {
  if (!util::valid_model_name(model)) return false;
  struct stat sb {};
  if (::lstat(st.model_path(model).c_str(), &sb) == 0) return true;
  const auto dir = st.models_dir() / ".store" / model;
  return ::lstat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

}  // namespace

// What the journal and refusals call a record of kind `k`: "deployment" or "pull".
std::string_view noun_of(Kind k) {
  switch (k) {
    case Kind::pull: return "pull";
    case Kind::stop: return "stop";
    case Kind::deploy: break;
  }
  return "deployment";
}

std::string_view phase_verb(Phase p) {
  switch (p) {
    case Phase::planning: return "planning";
    case Phase::freeing_disk: return "freeing disk for";
    case Phase::downloading: return "downloading";
    case Phase::verifying: return "verifying";
    case Phase::warming: return "warming the page cache for";
    case Phase::stopping_old: return "stopping the old model for";
    case Phase::launching: return "launching";
    case Phase::health_checking: return "waiting for readiness of";
    case Phase::benchmarking: return "benchmarking";
    case Phase::rolling_back: return "rolling back";
  }
  return "";
}

sys::Fields Run::fields() const {
  sys::Fields f;
  f.deployment = record.id;
  f.model = record.model;
  f.phase = std::string(to_string(record.phase));
  return f;
}

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states)
    : Deployer(io, std::move(services), states, ModelWatcher::Options{}) {}

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states, ModelWatcher::Options watchdog)
    : io_(io),
      services_(std::move(services)),
      states_(states),
      writes_(asio::make_strand(services_.disk_pool)),
      watch_options_(std::move(watchdog)) {}

ModelWatcher& Deployer::watcher_for(const std::string& model) {
  auto& w = watchers_[model];
  if (w) return *w;
  w = std::make_unique<ModelWatcher>(io_, services_, watch_options_);
  w->on_change([this](const WatchdogStatus& st) {
    announce_status();
    Event e;
    e.kind = EventKind::watcher;
    e.model = st.model;
    e.watcher = st;
    publish(e);
  });
  w->on_started([this](const std::string& m, const std::optional<StartedSettings>& settings) {
    record_started(m, settings);
  });
  w->restart_settings([this](const std::string& m) { return settings_for_restart(m); });
  return *w;
}

std::optional<std::string> Deployer::placement_taken(const Placement& p, const std::set<std::string>& except) const {
  const auto& cfg = *services_.config;
  for (const auto& other : state_.active.services) {
    if (except.contains(other.model)) continue;
    if (auto why = conflict_between(p, placement_of(other, cfg.find_model(other.model))))
      return fmt::format("{}, which serves ({})", other.model, *why);
  }
  // The model a running deploy is about to start is in no state yet: its placement counts too.
  if (running_ && running_->record.kind == Kind::deploy && !except.contains(running_->record.model))
    if (const auto* target = running_->services.config->find_model(running_->record.model))
      if (auto why = conflict_between(p, placement_of(*target)))
        return fmt::format("{}, which deployment {} is about to start ({})", target->name, running_->record.id, *why);
  return std::nullopt;
}

Result<std::optional<StartedSettings>> Deployer::settings_for_restart(const std::string& model) const {
  const auto* a = state_.active.find(model);
  const auto* m = services_.config->find_model(model);
  if (!a || !m) return std::optional<StartedSettings>();
  // A service the running deploy replaces serves until that deploy stops it: the model it is
  // about to start does not count against it.
  std::set<std::string> except{model};
  if (running_ && models_of(running_->record.previous).contains(model)) except.insert(running_->record.model);
  const auto today = placement_taken(placement_of(*m), except);
  if (!today) return std::optional<StartedSettings>();
  sys::Fields f;
  f.model = model;
  if (a->started && !placement_taken(placement_of(*a, m), except)) {
    sys::logf(sys::Level::warning, f,
              "watchdog: today's configuration of {} conflicts with {}: starting it with the settings it ran with; "
              "deploy {} to apply the configuration",
              model, *today, model);
    return a->started;
  }
  return make_error(Errc::model_active,
                    fmt::format("not restarting {}: its placement conflicts with {}; it stays down until that "
                                "service leaves or {} is deployed again",
                                model, *today, model));
}

std::optional<Error> Deployer::switch_conflict(const Running& r) const {
  const auto& d = r.record;
  if (d.kind != Kind::deploy) return std::nullopt;
  const auto* m = r.services.config->find_model(d.model);
  if (!m) return std::nullopt;
  std::set<std::string> except = models_of(d.previous);
  except.insert(d.model);
  const auto taken = placement_taken(placement_of(*m), except);
  if (!taken) return std::nullopt;
  return make_error(Errc::model_active,
                    fmt::format("not starting {} beside {}: that service came into its place after this deployment "
                                "began (it stops only the services in conflict when it starts); deploy {} again to "
                                "stop it first",
                                d.model, *taken, d.model));
}

void Deployer::watch_service(const std::string& model, bool wait_ready_first) {
  if (!state_.active.find(model) || shutting_down_) return;
  if (running_ && owns_service(*running_) && touched_models(*running_).contains(model)) return;
  auto& w = watcher_for(model);
  if (!w.running()) w.start(model, wait_ready_first);
}

void Deployer::watch_services(const std::set<std::string>& except) {
  for (const auto& a : state_.active.services)
    if (!except.contains(a.model)) watch_service(a.model, false);
}

asio::awaitable<void> Deployer::stop_watching(std::set<std::string> models) {
  for (const auto& m : models)
    if (auto it = watchers_.find(m); it != watchers_.end() && it->second->running()) co_await it->second->stop();
}

bool Deployer::any_watching() const {
  return std::any_of(watchers_.begin(), watchers_.end(), [](const auto& w) { return w.second->running(); });
}

Deployer::~Deployer() = default;

Result<void> Deployer::load() {
  auto loaded = states_.load_or_fall_back();
  state_ = std::move(loaded.state);
  state_source_ = loaded.source;
  for (const auto& p : loaded.problems) sys::logf(sys::Level::warning, "state recovery: {}", p);
  if (loaded.source == StateSource::previous)
    sys::logf(sys::Level::warning,
              "state recovery: starting from {}/state.json.prev, the copy of the last state saved, reconciled with "
              "the model services that run (a bad state.json is kept as state.json.bad)",
              states_.dir().string());
  else if (loaded.source == StateSource::rebuilt)
    sys::logf(sys::Level::warning,
              "state recovery: neither state.json nor state.json.prev in {} reads: rebuilding the state from the model "
              "services that run and the store (a bad state.json is kept as state.json.bad); pulled marks and "
              "last-active times are lost",
              states_.dir().string());
  for (auto& d : states_.load_history(200)) history_.push_back(std::move(d));
  for (const auto& d : history_)
    if (d.state == State::running) {
      interrupted_ = d.id + " of " + d.model;
      break;
    }
  return {};
}

asio::awaitable<void> Deployer::recover() {
  // The newest deployment that never reached a terminal state was interrupted by a restart. It
  // stays in the history (state running, as the API shows it) until it continues below.
  std::optional<Deployment> unfinished;
  for (const auto& d : history_) {
    if (d.state == State::running) {
      unfinished = d;
      break;
    }
  }
  // start() refuses until here, the end of recover(): from the erase in continue_unfinished to
  // the end nothing awaits, and begin() has set running_ by then.
  struct Recovered {
    std::optional<std::string>& interrupted;
    ~Recovered() { interrupted.reset(); }
  } recovered{interrupted_};
  // The services an unfinished deployment began to stop are its own to finish or bring back.
  std::set<std::string> owned;
  if (unfinished && unfinished->old_stopped) {
    owned = models_of(unfinished->previous);
    owned.insert(unfinished->model);
  }
  std::set<std::string> skip = owned;
  if (unfinished) skip.insert(unfinished->model);
  co_await reconcile_with_units(skip);
  auto statuses = co_await settle_conflicts_at_boot(owned);
  std::map<std::string, bool> to_watch;  // model -> its unit was just started (readiness first)
  const auto serving = state_.active.services;  // a copy: recover_service awaits
  for (const auto& a : serving) {
    if (owned.contains(a.model)) continue;
    bool watch = false, started_unit = false;
    co_await recover_service(a, statuses.at(a.model), watch, started_unit);
    if (watch) to_watch[a.model] = started_unit;
  }
  if (unfinished) co_await continue_unfinished(*unfinished);
  // Also while a continued deployment plans, downloads and verifies (watch_service() decides).
  for (const auto& [model, started_unit] : to_watch)
    if (!shutting_down_) watch_service(model, started_unit);
  announce_status();
}

asio::awaitable<void> Deployer::reconcile_with_units(const std::set<std::string>& skip) {
  const sys::Fields none;
  bool changed = state_source_ == StateSource::previous || state_source_ == StateSource::rebuilt;
  const auto now = util::rfc3339(std::chrono::system_clock::now());
  auto found = co_await find_unrecorded_units(services_, models_of(state_.active.services), skip, now);
  if (!found)
    sys::logf(sys::Level::error, none,
              "state recovery: cannot list the model services that run ({}): one missing from state.json stays "
              "unwatched",
              found.error().message);
  for (auto& u : found ? *found : std::vector<UnrecordedUnit>{}) {
    sys::Fields f;
    f.model = u.model;
    if (!u.adopt) {
      sys::logf(sys::Level::warning, f, "state recovery: {} runs and state.json has no service of model {}: {}",
                u.unit, u.model, u.why);
      continue;
    }
    sys::logf(sys::Level::warning, f,
              "state recovery: {} runs and state.json has no service of model {}: adopted, serving {}", u.unit, u.model,
              u.why);
    // First in the order of service: a conflict with a recorded service leaves the adopted one out.
    state_.active.services.insert(state_.active.services.begin(), std::move(*u.adopt));
    changed = true;
  }
  if (changed) co_await save_state(none);
}

asio::awaitable<std::map<std::string, Result<units::UnitStatus>>> Deployer::settle_conflicts_at_boot(
    const std::set<std::string>& owned) {
  std::map<std::string, Result<units::UnitStatus>> statuses;
  const auto cfg = services_.config;
  std::vector<Placement> kept;  // of the services that stay, the latest first
  std::vector<std::string> leaving;
  const auto services = state_.active.services;
  for (auto it = services.rbegin(); it != services.rend(); ++it) {
    const auto* m = cfg->find_model(it->model);
    const auto unit = units::serve_unit(it->model);
    auto st = co_await services_.units.status(unit);
    // A server that runs keeps its recorded settings; one that is started gets today's drop-in.
    const bool up = st && units::is_up(st->active_state);
    const Placement p = up || !m || owned.contains(it->model) ? placement_of(*it, m) : placement_of(*m);
    statuses.emplace(it->model, std::move(st));
    std::optional<std::string> why;
    const Placement* winner = nullptr;
    for (const auto& k : kept)
      if ((why = conflict_between(p, k))) {
        winner = &k;
        break;
      }
    if (!winner || owned.contains(it->model)) {
      kept.push_back(p);
      continue;
    }
    sys::Fields f;
    f.model = it->model;
    sys::logf(sys::Level::warning, f,
              "model {} leaves service: the configuration now makes it conflict with {} ({}), put into service "
              "later, which starts instead; deploy {} again once the configuration lets both serve",
              it->model, winner->model, *why, it->model);
    if (up) {
      const std::chrono::milliseconds wait = stop_wait(m ? m->serve.stop_timeout : std::chrono::minutes(5));
      if (auto r = co_await services_.units.stop(unit); !r)
        sys::logf(sys::Level::error, f, "cannot stop {}: {}", unit, r.error().message);
      else if (auto w = co_await units::wait_inactive(services_.units, unit, wait); !w)
        sys::logf(sys::Level::error, f, "{} did not stop: {}", unit, w.error().message);
    }
    state_.last_active[it->model] = util::rfc3339(std::chrono::system_clock::now());
    state_.active.erase(it->model);
    leaving.push_back(it->model);
  }
  const sys::Fields none;
  if (!leaving.empty()) co_await save_state(none);
  co_return statuses;
}

asio::awaitable<void> Deployer::recover_service(const ActiveRecord& a, const Result<units::UnitStatus>& status,
                                                bool& watch, bool& started_unit) {
  // A reload while this runs must not free the model tables it reads.
  const auto cfg = services_.config;
  const auto* m = cfg->find_model(a.model);
  sys::Fields f;
  f.model = a.model;
  if (!m) {
    sys::logf(sys::Level::warning, f, "active model {} is no longer configured; leaving its service alone",
              a.model);
    co_return;
  }
  const auto unit = units::serve_unit(m->name);
  // A server that runs keeps the settings it was started with (recorded): only the file changes.
  auto installed = co_await install_dropin(services_, *m);
  Result<units::UnitStatus> st = status;
  if (!installed) st = installed.error();
  watch = true;
  if (!st) {
    sys::logf(sys::Level::error, f, "cannot check {}: {}", unit, st.error().message);
    co_return;
  }
  if (units::is_up(st->active_state)) {
    sys::logf(sys::Level::info, f, "active model {} is served by {} ({})", m->name, unit,
              units::to_string(st->active_state));
    // It serves already: a changed file is reported, not re-hashed under the running server.
    const bool unchanged = co_await files_still_trusted(services_, m->name, a.commit, f, false);
    (void)unchanged;
    co_return;
  }
  // Never start a checkpoint whose files changed since their verification without re-hashing.
  const bool trusted = co_await files_still_trusted(services_, m->name, a.commit, f, true);
  if (!trusted) {
    sys::logf(sys::Level::error, f,
              "active model {} is not running and its files fail verification: not starting {} (deploy it "
              "again to download what is damaged)",
              m->name, unit);
    watch = false;
    co_return;
  }
  sys::logf(sys::Level::notice, f, "active model {} is not running ({}): starting {}", m->name,
            units::to_string(st->active_state), unit);
  if (auto s = co_await units::reset_failed_and_start(services_.units, unit); !s) {
    sys::logf(sys::Level::error, f, "cannot start {}: {}", unit, s.error().message);
    co_return;
  }
  started_unit = true;
  record_started(m->name, *installed);
}

std::optional<Step> Deployer::resume_step(const Deployment& d) {
  if (d.kind == Kind::stop) return Step::stopping_old;  // stopping is idempotent; a stop never rolls back
  if (d.phase == Phase::rolling_back) return std::nullopt;
  // Cleanup began after the health check: the new model serves, only the cleanup is left to finish.
  if (d.cleanup_begun && d.phase == Phase::health_checking) return Step::cleanup;
  // Stopping is idempotent ("nothing to stop" once inactive), and a stop cut short by the
  // restart must finish before the new server may take the port and the GPUs.
  // (With stopping_old first, planning comes before it and re-reads what the later steps need.)
  if (d.old_stopped && !d.downtime_first) return Step::stopping_old;
  return Step::planning;
}

asio::awaitable<void> Deployer::continue_unfinished(Deployment& d) {
  const auto first = resume_step(d);
  sys::Fields f;
  f.deployment = d.id;
  f.model = d.model;
  f.phase = std::string(to_string(d.phase));
  const std::string from = !first ? std::string("rolling_back")
                                  : *first == Step::cleanup ? "health_checking (the cleanup of older revisions)"
                                                            : std::string(to_string(*first));
  sys::logf(sys::Level::notice, f, "continuing deployment {} of {} interrupted in phase {}, from phase {}", d.id,
            d.model, to_string(d.phase), from);
  std::erase_if(history_, [&](const Deployment& h) { return h.id == d.id; });
  if (services_.config->find_model(d.model) || d.kind == Kind::stop) {
    begin(std::move(d), first);
    co_return;
  }
  d.state = State::failed;
  d.error = make_error(Errc::unknown_model, "model " + d.model + " is no longer configured");
  d.finished_at = util::rfc3339(std::chrono::system_clock::now());
  history_.push_front(d);
  co_await persist_now(d);
}

void Deployer::reconfigure(std::shared_ptr<const config::Config> config) {
  const auto old = services_.config;  // kept alive until every service is reconfigured
  services_.config = std::move(config);
  const auto& fresh = *services_.config;

  std::vector<std::string> added, removed, changed;
  for (const auto& [name, m] : fresh.models) {
    const auto* before = old->find_model(name);
    if (!before) added.push_back(name);
    else if (!(*before == m)) changed.push_back(name);
  }
  for (const auto& [name, m] : old->models)
    if (!fresh.find_model(name)) removed.push_back(name);
  auto list = [](const std::vector<std::string>& v) {
    return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", "));
  };
  sys::logf(sys::Level::notice, "configuration reloaded: {} model(s); added: {}; removed: {}; changed: {}",
            fresh.models.size(), list(added), list(removed), list(changed));

  if (running_) {
    sys::Fields f = running_->run->fields();
    sys::logf(sys::Level::notice, f,
              "deployment {} of {} continues with the configuration it started with; the reloaded one applies "
              "to later deployments",
              running_->record.id, running_->record.model);
  }
  if (shutting_down_) return;
  for (const auto& a : state_.active.services) reconfigure_service(a.model, *old);
}

void Deployer::reconfigure_service(const std::string& model, const config::Config& old) {
  const auto& fresh = *services_.config;
  sys::Fields f;
  f.model = model;
  const auto* now = fresh.find_model(model);
  const auto* before = old.find_model(model);
  auto& watcher = watcher_for(model);
  if (!now) {
    if (before)
      sys::logf(sys::Level::warning, f,
                "active model {} is no longer configured: {} keeps running, but it is not watched any more",
                model, units::serve_unit(model));
    watcher.cancel();
    return;
  }
  if (before && *before == *now) return;
  if (running_) return;  // the deployment owns the drop-ins and the watchdog until it ends
  // The service's table changed: rewrite its drop-in (the server picks it up at its next start)
  // and watch it again with the new intervals. A model configured again after a reload had
  // removed it is watched again too.
  const bool rewatch = watcher.running() || !before;
  asio::co_spawn(io_, [this, model, f, rewatch]() -> asio::awaitable<void> {
    auto cfg = services_.config;
    const auto* m = cfg->find_model(model);
    if (!m || running_ || shutting_down_) co_return;
    if (auto r = co_await install_dropin(services_, *m); !r)
      sys::logf(sys::Level::error, f, "reload: cannot rewrite the drop-in of {}: {}", units::serve_unit(model),
                r.error().message);
    else
      sys::logf(sys::Level::info, f,
                "reload: rewrote the drop-in of {}; the running server keeps its settings until it restarts",
                units::serve_unit(model));
    co_await watcher_for(model).stop();
    if (rewatch && !running_ && !shutting_down_) watch_service(model, false);
  }, sys::log_failure("reload: rewriting the drop-in of " + units::serve_unit(model), f));
}

bool Deployer::owns_service(const Running& r) {
  return r.record.old_stopped || r.rolling_back || (r.step && r.step->touches_service);
}

std::set<std::string> Deployer::touched_models(const Running& r) {
  auto out = models_of(r.record.previous);
  out.insert(r.record.model);
  return out;
}

void Deployer::shutdown(std::function<void()> done) {
  shutting_down_ = true;
  if (any_watching()) {
    // A watcher may be in the middle of a restart: they end first (cancelled, awaited).
    std::set<std::string> all;
    for (auto& [model, w] : watchers_) {
      w->cancel();
      all.insert(model);
    }
    asio::co_spawn(io_, stop_watching(all),
                   [this, done = std::move(done), log = sys::log_failure("stopping the watchdog")](
                       std::exception_ptr e) mutable {
                     log(e);
                     shutdown(std::move(done));
                   });
    return;
  }
  if (!running_) {
    if (done) done();
    return;
  }
  on_idle_ = std::move(done);
  running_->cancel.emit(asio::cancellation_type::terminal);
}

void Deployer::shutdown_on(asio::cancellation_slot slot, std::function<void()> done) {
  slot.assign([this, done = std::move(done)](asio::cancellation_type) { shutdown(done); });
}

std::string Deployer::new_id(const std::string& model, std::chrono::system_clock::time_point now) const {
  std::string base = fmt::format("{}-{}", util::compact_utc_stamp(now), model);
  std::string id = base;
  for (int n = 2; get(id); ++n) id = fmt::format("{}-{}", base, n);
  return id;
}

std::optional<Error> Deployer::refuse_while_recovering() const {
  if (interrupted_)
    return make_error(Errc::deployment_running,
                      fmt::format("deployment {}, interrupted by modeld's restart, is about to continue", *interrupted_));
  return std::nullopt;
}

std::optional<Error> Deployer::refuse_new_record() const {
  if (running_)
    return make_error(Errc::deployment_running,
                      fmt::format("{} {} of {} is running (phase {})", noun_of(running_->record.kind), running_->record.id,
                                  running_->record.model, to_string(running_->record.phase)));
  if (auto r = refuse_while_recovering()) return r;
  if (shutting_down_) return make_error(Errc::cancelled, "modeld is shutting down");
  if (!busy_.empty())
    return make_error(Errc::deployment_running,
                      fmt::format("a {} of model {} is in progress; deploy when it has ended", busy_.begin()->second,
                                  busy_.begin()->first));
  return std::nullopt;
}

Deployment Deployer::new_record(const std::string& model, Kind kind) const {
  Deployment d;
  const auto now = std::chrono::system_clock::now();
  d.id = new_id(model, now);
  d.model = model;
  d.kind = kind;
  d.started_at = util::rfc3339(now);
  d.started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  return d;
}

Result<Deployment> Deployer::start(const DeployRequest& request) {
  const std::string& model = request.model;
  const auto* m = services_.config->find_model(model);
  if (!m) return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  if (auto refused = refuse_new_record()) return *refused;
  Deployment d = new_record(model, request.kind);
  d.commit = request.commit;  // planning lists the Hub at this commit, never the branch
  d.allow_downtime = request.kind == Kind::deploy && request.allow_downtime;
  d.restart = request.restart;
  // A deploy stops exactly the services in conflict with its model; a pull touches none.
  if (d.kind == Kind::deploy) d.previous = conflicting(state_.active.services, placement_of(*m), *services_.config);
  sys::Fields f;
  f.deployment = d.id;
  f.model = model;
  f.phase = "planning";
  f.message_id = message_id::started;
  std::vector<std::string> stops;
  for (const auto& a : d.previous) stops.push_back(a.model);
  if (d.kind == Kind::pull)
    sys::logf(sys::Level::notice, f, "pull {} of model {} started{}: no service is touched", d.id, model,
              d.commit ? " at " + *d.commit : std::string());
  else
    sys::logf(sys::Level::notice, f, "deployment {} of model {} started{}{}", d.id, model,
              d.commit ? " at " + *d.commit : std::string(),
              !stops.empty() ? fmt::format(" (replacing {})", fmt::join(stops, ", "))
              : state_.active ? std::string(" (no model in service conflicts with it)")
                              : std::string(" (no model active)"));
  // The watchdog keeps watching the services in service through planning, downloading and
  // verifying (hours for a large checkpoint); drive() stops those it stops before the first
  // phase that touches them.
  begin(d, Step::planning);
  return running_->record;
}

Result<Deployment> Deployer::stop(const std::string& model) {
  const auto* a = state_.active.find(model);
  if (!services_.config->find_model(model) && !a)
    return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or in service", model));
  if (auto refused = refuse_new_record()) return *refused;
  Deployment d = new_record(model, Kind::stop);
  d.phase = Phase::stopping_old;
  sys::Fields f;
  f.deployment = d.id;
  f.model = model;
  f.phase = "stopping_old";
  f.message_id = message_id::started;
  if (!a) {
    // Nothing to stop: a record that says so, ended at once.
    d.state = State::succeeded;
    d.changed = false;
    d.finished_at = d.started_at;
    f.message_id = message_id::succeeded;
    sys::logf(sys::Level::notice, f, "stop {}: model {} is not in service, nothing to do", d.id, model);
    history_.push_front(d);
    persist(d);
    emit(EventKind::state, d);
    return d;
  }
  d.commit = a->commit;
  d.previous = {*a};
  sys::logf(sys::Level::notice, f, "stop {} of model {} started: {} leaves service, its files stay on disk", d.id,
            model, units::serve_unit(model));
  begin(d, Step::stopping_old);
  return running_->record;
}

void Deployer::begin(Deployment d, std::optional<Step> first) {
  auto r = std::make_shared<Running>(services_);
  r->record = std::move(d);
  const auto& cfg = *r->services.config;
  const auto* model = cfg.find_model(r->record.model);
  if (!model) {
    // A stop of a model that left the configuration: its name, and the port it was started on.
    r->own_model = config::ModelConfig{};
    r->own_model->name = r->record.model;
    if (!r->record.previous.empty()) r->own_model->serve.port = placement_of(r->record.previous.front(), nullptr).port;
    model = &*r->own_model;
  }
  Serving serving{models_of(state_.active.services), models_of(r->record.previous)};
  std::vector<Placement> staying;
  for (const auto& a : state_.active.services)
    if (!serving.stopped.contains(a.model) && a.model != r->record.model)
      staying.push_back(placement_of(a, cfg.find_model(a.model)));
  r->run = std::make_unique<Run>(Run{.record = r->record,
                                     .model = *model,
                                     .serving = std::move(serving),
                                     .staying = std::move(staying),
                                     .last_active = state_.last_active,
                                     .pulled = state_.pulled});
  r->decisions = std::make_unique<RunDecisions>(*this, *r);
  r->steps = plan_steps(r->record.kind, r->record.downtime_first);
  r->new_serves = first == Step::cleanup;  // resumed after its health check
  running_ = r;
  asio::co_spawn(io_, drive(r, first), sys::log_failure("deployment coroutine"));
}

namespace {

// Runs `body`, the phase of `step`, as a child coroutine bound to `slot` (the deployment's
// cancellation signal), so a cancel (or SIGTERM) reaches every operation inside it, and an
// exception thrown by a bug in a phase ends the deployment with an error instead of the daemon.
template <class T>
asio::awaitable<Result<T>> in_child(asio::io_context& io, asio::cancellation_slot slot, asio::awaitable<Result<T>>& body,
                                    std::string_view step) {
  auto [ex, result] =
      co_await asio::co_spawn(io, std::move(body), asio::bind_cancellation_slot(slot, asio::as_tuple(asio::use_awaitable)));
  if (!ex) co_return std::move(result);
  try {
    std::rethrow_exception(ex);
  } catch (const boost::system::system_error& e) {
    if (e.code() == asio::error::operation_aborted) co_return make_error(Errc::cancelled, "cancelled");
    co_return make_error(Errc::internal, fmt::format("phase {}: {}", step, e.what()));
  } catch (const std::exception& e) {
    co_return make_error(Errc::internal, fmt::format("phase {}: {}", step, e.what()));
  }
}

}  // namespace

asio::awaitable<void> Deployer::enter_step(Running& r, Step s) {
  auto& d = r.record;
  if (s == Step::cleanup) {
    // Recorded before it starts, so a restart finishes it; the API still shows health_checking.
    d.cleanup_begun = true;
    co_await persist_now(d);
    test_hooks::crash_point("cleanup_begun");
    co_return;
  }
  d.phase = phase_of(s);
  co_await persist_now(d);
  emit(EventKind::phase, d);
  announce_status();
}

asio::awaitable<Result<void>> Deployer::run_step(Running& r, Step s) {
  auto& sv = r.services;
  const auto& run = *r.run;
  auto& decisions = *r.decisions;
  const auto slot = r.cancel.slot();
  const auto name = to_string(s);
  co_await enter_step(r, s);
  // Each phase returns what it found; the driver applies it (GCC 12: no co_await in a conditional expression).
  switch (s) {
    case Step::planning: {
      auto body = run_planning(sv, run, decisions);
      auto p = co_await in_child(io_, slot, body, name);
      if (!p) co_return p.error();
      if (!r.record.cancel_requested) co_await apply_planned(r, *p);
      co_return Result<void>{};
    }
    case Step::freeing_disk: {
      auto body = run_freeing_disk(sv, run);
      auto f = co_await in_child(io_, slot, body, name);
      if (!f) co_return f.error();
      if (!r.record.cancel_requested) co_await apply_freed(r, *f);
      co_return Result<void>{};
    }
    case Step::downloading: {
      auto body = run_downloading(sv, run, decisions);
      auto got = co_await in_child(io_, slot, body, name);
      if (!got) co_return got.error();
      r.run->fetched.insert(got->fetched.begin(), got->fetched.end());
      co_return Result<void>{};
    }
    case Step::verifying: {
      auto body = run_verifying(sv, run);
      co_return co_await in_child(io_, slot, body, name);
    }
    case Step::warming: {
      auto body = run_warming(sv, run, decisions);
      auto w = co_await in_child(io_, slot, body, name);
      if (w) co_await apply_warm(r, w->report, std::nullopt);
      co_return w ? Result<void>{} : Result<void>{w.error()};
    }
    case Step::stopping_old:
    case Step::launching:
    case Step::health_checking: co_return co_await run_switch_step(r, s);
    case Step::cleanup: {
      // Not cancellable: bound to a signal nothing emits. A failure is logged; the model serves.
      asio::cancellation_signal never;
      auto body = run_cleanup(sv, run, *r.record.commit);
      auto c = co_await in_child(io_, never.slot(), body, name);
      if (!c) sys::logf(sys::Level::warning, run.fields(), "cannot remove older revisions: {}", c.error().message);
      co_return Result<void>{};
    }
    case Step::benchmarking: {
      auto body = run_benchmarking(sv, run);
      auto b = co_await in_child(io_, slot, body, name);
      if (!b) co_return b.error();
      r.record.benchmark_ttft_s = b->ttft_s;
      r.record.benchmark_decode_tokens_per_s = b->decode_tokens_per_s;
      co_await persist_now(r.record);
      co_return Result<void>{};
    }
  }
  co_return make_error(Errc::internal, "unknown step");
}

// The steps of the switch, each applying the marks of the outage it returns (DEPLOYMENT.switch).
asio::awaitable<Result<void>> Deployer::run_switch_step(Running& r, Step s) {
  auto& sv = r.services;
  const auto& run = *r.run;
  const auto slot = r.cancel.slot();
  const auto name = to_string(s);
  switch (s) {
    case Step::stopping_old: {
      if (auto taken = switch_conflict(r)) co_return *taken;
      auto body = run_stopping_old(sv, run, *r.decisions);
      auto stopped = co_await in_child(io_, slot, body, name);
      if (!stopped) co_return stopped.error();
      co_await apply_stopped(r, *stopped);
      co_return Result<void>{};
    }
    case Step::launching: {
      if (auto taken = switch_conflict(r)) co_return *taken;
      auto body = run_launching(sv, run);
      auto launched = co_await in_child(io_, slot, body, name);
      if (!launched) co_return launched.error();
      co_await apply_warm(r, std::nullopt, launched->bytes_resident_at_launch);
      const std::optional<Readiness> not_yet;
      co_await apply_started(r, launched->start_requested_ns, not_yet);
      co_return Result<void>{};
    }
    case Step::health_checking: {
      auto body = run_health_checking(sv, run);
      auto ready = co_await in_child(io_, slot, body, name);
      if (!ready) co_return ready.error();
      const std::optional<Readiness> seen = *ready;
      co_await apply_started(r, r.record.switch_marks.start_requested_ns, seen);
      if (!r.record.cancel_requested) co_await apply_healthy(r);
      co_return Result<void>{};
    }
    default: break;
  }
  co_return make_error(Errc::internal, "not a step of the switch");
}

asio::awaitable<void> Deployer::apply_planned(Running& r, Planned& p) {
  auto& d = r.record;
  auto& run = *r.run;
  run.missing = std::move(p.missing);
  run.fetched.insert(p.adopted.begin(), p.adopted.end());
  run.snapshot = std::move(p.snapshot);
  d.commit = run.snapshot->commit;
  d.progress.files_total = p.files_total;
  d.progress.bytes_total = p.bytes_total;
  d.downtime_first = p.downtime_first;
  // A pull of a commit already verified on disk changes nothing.
  if (d.kind == Kind::pull && p.already_verified) d.changed = false;
  // The plan is data from here on: computed once, from what the record keeps.
  r.steps = plan_steps(d.kind, d.downtime_first);
  co_await persist_now(d);
  test_hooks::crash_point("order_decided");
}

asio::awaitable<void> Deployer::apply_warm(Running& r, const std::optional<WarmReport>& warmed,
                                           std::optional<std::uint64_t> resident_at_launch) {
  auto& d = r.record;
  if (warmed) d.warm = warmed;
  if (resident_at_launch) {
    if (!d.warm) d.warm = WarmReport{};
    d.warm->bytes_resident_at_launch = resident_at_launch;
  }
  if (warmed || resident_at_launch) co_await persist_now(d);
}

asio::awaitable<void> Deployer::apply_freed(Running& r, const Freed& freed) {
  if (!freed.active_evicted) co_return;
  for (const auto& name : freed.evicted) {
    if (!state_.active.erase(name)) continue;
    sys::logf(sys::Level::warning, r.run->fields(), "model {} was evicted: it is out of service, {} serves in its place",
              name, r.record.model);
    state_.last_active[name] = util::rfc3339(std::chrono::system_clock::now());
  }
  co_await save_state(r);
}

asio::awaitable<void> Deployer::take_out_of_service(Running& r) {
  if (!state_.active.erase(r.record.model)) co_return;
  state_.last_active[r.record.model] = util::rfc3339(std::chrono::system_clock::now());
  co_await save_state(r);
}

asio::awaitable<void> Deployer::apply_stopped(Running& r, const Stopped& stopped) {
  // Kept from before a restart: a stop found done again is not when it was done.
  auto& marks = r.record.switch_marks;
  if (stopped.stop_done_ns && !marks.stop_done_ns) marks.stop_done_ns = stopped.stop_done_ns;
  co_await persist_now(r.record);
}

asio::awaitable<void> Deployer::apply_started(Running& r, std::int64_t start_requested_ns,
                                              const std::optional<Readiness>& ready) {
  auto& d = r.record;
  auto& marks = d.switch_marks;
  marks.start_requested_ns = start_requested_ns;
  marks.port_ns = ready ? ready->port_ns : 0;
  marks.ready_ns = ready ? ready->ready_ns : 0;
  d.switch_report = switch_report_of(marks);
  if (d.switch_report) {
    const auto& w = *d.switch_report;
    sys::Fields f = r.run->fields();
    auto field = [&](const char* name, double v) { f.extra.emplace_back(name, fmt::format("{:.3f}", v)); };
    field("MODELD_DOWNTIME_S", w.downtime_s);
    field("MODELD_STOP_S", w.stop_s);
    field("MODELD_LAUNCH_S", w.launch_s);
    field("MODELD_LOAD_S", w.start_to_port_s);
    field("MODELD_READINESS_S", w.port_to_ready_s);
    sys::logf(sys::Level::notice, f, "switch {}",
              util::describe_switch(w.downtime_s, w.stop_s, w.launch_s, w.start_to_port_s, w.port_to_ready_s));
  }
  co_await persist_now(d);
}

asio::awaitable<void> Deployer::apply_healthy(Running& r) {
  const auto& d = r.record;
  auto now = util::rfc3339(std::chrono::system_clock::now());
  // The services it stopped are out of service now; every other one serves on beside it.
  for (const auto& a : d.previous) {
    state_.last_active[a.model] = now;
    state_.active.erase(a.model);
  }
  // What launching's drop-in holds: rendered from the same configuration by the same code.
  state_.active.put(ActiveRecord{d.model, *d.commit, now, started_settings(r.services, r.run->model)});
  state_.last_active[d.model] = now;
  forget_pulled(d.model, *d.commit);  // deployed: the revision in service needs no mark
  r.new_serves = true;
  co_await save_state(r);
}

bool Deployer::serves_new(const Deployment& d) const {
  // A restart of the commit that serves (its settings changed, or asked for) finds the state
  // naming that commit from the start: only its own health check says the new server serves.
  for (const auto& a : d.previous)
    if (a.model == d.model && a.commit == d.commit) return false;
  return in_service(d.model, d.commit);
}

bool Deployer::in_service(const std::string& model, const std::optional<std::string>& commit) const {
  const auto* a = state_.active.find(model);
  return a && a->commit == commit;
}

bool Deployer::is_pulled(const std::string& model, const std::string& commit) const {
  const auto it = state_.pulled.find(model);
  return it != state_.pulled.end() && std::find(it->second.begin(), it->second.end(), commit) != it->second.end();
}

asio::awaitable<void> Deployer::save_state(Running& r) {
  const sys::Fields f = r.run->fields();
  co_await save_state(f);
}

asio::awaitable<void> Deployer::save_state(const sys::Fields& f) {
  const DaemonState copy = state_;
  auto& states = states_;
  auto s = co_await util::on_executor<Result<void>>(writes_, [&] { return states.save(copy); });
  if (!s) sys::logf(sys::Level::error, f, "cannot record the active model: {}", s.error().message);
}

void Deployer::record_started(const std::string& model, const std::optional<StartedSettings>& settings) {
  auto* a = state_.active.find(model);
  if (!a) return;
  a->started = settings;
  // The watchdog restarted it while a deployment still downloads: a rollback restores this one.
  if (running_ && !running_->record.old_stopped)
    for (auto& p : running_->record.previous)
      if (p.model == model) {
        p.started = settings;
        persist(running_->record);
      }
  sys::Fields f;
  f.model = model;
  asio::co_spawn(io_, [this, f]() -> asio::awaitable<void> { co_await save_state(f); },
                 sys::log_failure("recording the settings of " + model, f));
}

asio::awaitable<std::optional<std::string>> Deployer::why_not_noop(const Deployment& d, const Run& run) {
  std::optional<ActiveRecord> active;
  if (const auto* a = state_.active.find(d.model)) active = *a;
  const auto check = compare_with_serving(d, active, started_settings(services_, run.model));
  if (check.verdict == Redeploy::not_serving) co_return std::string();
  if (check.verdict != Redeploy::noop) co_return check.why;
  // One readiness check, the watchdog's probe: a model that does not answer is restarted.
  auto probe = [this](const config::ModelConfig& m) { return watcher_for(m.name).probe_once(m); };
  if (auto why = co_await not_ready_reason(services_, run, probe))
    co_return fmt::format("it serves commit {} but is not ready ({})", d.commit->substr(0, 12), *why);
  co_return std::nullopt;
}

asio::awaitable<bool> Deployer::already_serves(Running& r) {
  auto& d = r.record;
  if (d.kind != Kind::deploy) co_return false;  // a pull never touches the service
  if (auto why = co_await why_not_noop(d, *r.run)) {
    if (!why->empty()) sys::logf(sys::Level::notice, r.run->fields(), "restarting {}: {}", d.model, *why);
    co_return false;
  }
  d.changed = false;
  co_await persist_now(d);
  co_return true;
}

void Deployer::log_nothing_to_do(const Running& r, std::size_t next) const {
  const auto& d = r.record;
  for (std::size_t i = next; i < r.steps.size(); ++i) {
    sys::Fields f = r.run->fields();
    f.phase = std::string(to_string(phase_of(r.steps[i].step)));
    sys::logf(sys::Level::info, f, "{}: nothing to do: {} already serves commit {} with the same settings",
              to_string(r.steps[i].step), d.model, d.commit->substr(0, 12));
  }
}

asio::awaitable<void> Deployer::apply_pulled(Running& r) {
  const auto& d = r.record;
  // The commit in service is marked too: the cleanup after the next deployment of its model
  // then spares it (a fleet keeps the old revision until its rollout is finalized).
  if (is_pulled(d.model, *d.commit)) co_return;
  state_.pulled[d.model].push_back(*d.commit);
  co_await save_state(r);
}

bool Deployer::forget_pulled(const std::string& model, const std::optional<std::string>& commit) {
  auto it = state_.pulled.find(model);
  if (it == state_.pulled.end()) return false;
  const auto before = it->second.size();
  if (commit) std::erase(it->second, *commit);
  else it->second.clear();
  const bool changed = it->second.size() != before;
  if (it->second.empty()) state_.pulled.erase(it);
  return changed;
}

asio::awaitable<std::optional<Error>> Deployer::run_steps(Running& r, Step first) {
  auto& d = r.record;
  bool started = false;
  // Planning comes first in every plan and may change the steps after it: indexes stay valid.
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const PlannedStep step = r.steps[i];
    if (step.step == first) started = true;
    if (!started) continue;
    // Once the new model serves, a cancel only skips what is left but the cleanup.
    if (d.cancel_requested && !r.new_serves) co_return make_error(Errc::cancelled, "cancelled by the user");
    if (d.cancel_requested && step.step != Step::cleanup) {
      sys::logf(sys::Level::notice, r.run->fields(), "cancelled once {} served: benchmark skipped", d.model);
      break;
    }
    r.step = step;
    if (owns_service(r)) {
      auto touched = touched_models(r);
      co_await stop_watching(touched);
    }
    auto res = co_await run_step(r, step.step);
    if (shutting_down_) {
      // Left recorded as running: the next daemon start continues it from this step.
      sys::logf(sys::Level::notice, r.run->fields(), "deployment {} interrupted by shutdown in phase {}", d.id,
                to_string(d.phase));
      r.interrupted = true;
      co_return std::nullopt;
    }
    // A phase cut short by a cancel once the new model serves (the benchmark) skips only itself.
    if (!res && !(d.cancel_requested && r.new_serves))
      co_return d.cancel_requested ? make_error(Errc::cancelled, "cancelled by the user") : res.error();
    // Planning resolved the commit: the model that serves it with the same settings stays as it is.
    // (GCC 12: no co_await in a conditional expression.)
    if (step.step == Step::planning && res && !d.cancel_requested) {
      const bool serves = co_await already_serves(r);
      if (serves) {
        log_nothing_to_do(r, i + 1);
        co_return std::nullopt;
      }
    }
  }
  // A cancel that came as the last step began found nothing to stop: it ends the deployment now.
  if (d.cancel_requested && !r.new_serves) co_return make_error(Errc::cancelled, "cancelled by the user");
  co_return std::nullopt;
}

asio::awaitable<bool> Deployer::must_roll_back(Running& r, const Error& failure) {
  auto& d = r.record;
  if (!d.old_stopped || d.previous.empty() || d.kind == Kind::stop || r.new_serves || serves_new(d)) {
    const std::optional<Error> why = failure;
    co_await finish(r, failure.code == Errc::cancelled ? State::cancelled : State::failed, why);
    co_return false;
  }
  // Whether the revision that served is still on disk. Not the link: a redeploy of the same
  // model at a new commit has switched models_dir/NAME to the new revision already, and the
  // rollback switches it back. A stat: on the disk pool (by reference only: GCC 12).
  auto& st = services_.store;
  const auto& previous = d.previous;
  const bool any_on_disk = co_await util::on_pool<bool>(services_.disk_pool, [&] {
    return std::any_of(previous.begin(), previous.end(), [&](const ActiveRecord& a) {
      std::error_code ec;
      return std::filesystem::is_directory(st.revision_dir(a.model, a.commit), ec);
    });
  });
  if (!any_on_disk) {
    // allow_downtime evicted them: there is nothing to bring back.
    std::vector<std::string> names;
    for (const auto& a : previous) names.push_back(a.model);
    const std::optional<Error> why = make_error(
        Errc::rollback_failed,
        fmt::format("{}; model{} {} {} evicted to make room (allow_downtime) and cannot be restored{}", failure.message,
                    names.size() == 1 ? "" : "s", fmt::join(names, ", "), names.size() == 1 ? "was" : "were",
                    state_.active ? "" : ": no model serves"));
    co_await finish(r, State::failed, why);
    co_return false;
  }
  sys::logf(sys::Level::error, r.run->fields(), "phase {} failed after the old model was stopped: {}; rolling back",
            to_string(d.phase), failure.message);
  d.error = failure;
  co_return true;
}

asio::awaitable<void> Deployer::drive(std::shared_ptr<Running> rp, std::optional<Step> first) {
  Running& r = *rp;
  if (first) {
    auto failure = co_await run_steps(r, *first);
    if (r.interrupted) {
      co_await persist_now(r.record);
      running_.reset();
      if (on_idle_) on_idle_();
      co_return;
    }
    if (!failure) {
      if (r.record.kind == Kind::pull) co_await apply_pulled(r);
      const std::optional<Error> none;
      co_await finish(r, State::succeeded, none);
      co_return;
    }
    if (!co_await must_roll_back(r, *failure)) co_return;
  }
  co_await roll_back(r);
}

asio::awaitable<void> Deployer::roll_back(Running& r) {
  auto& d = r.record;
  // rolling_back is not cancellable: leaving the host with nothing serving is worse.
  r.step.reset();
  r.rolling_back = true;
  auto touched = touched_models(r);
  co_await stop_watching(touched);
  d.phase = Phase::rolling_back;
  co_await persist_now(d);
  emit(EventKind::phase, d);
  announce_status();
  asio::cancellation_signal never;
  auto body = run_rolling_back(r.services, *r.run);
  auto res = co_await in_child(io_, never.slot(), body, "rolling_back");
  // The outage lasts until the old models serve again.
  if (res && res->readiness.ready_ns) {
    const std::optional<Readiness> back = res->readiness;
    co_await apply_started(r, res->launched.start_requested_ns, back);
  }
  const std::string first_reason = d.error ? d.error->message : "interrupted by a daemon restart";
  if (!res) {
    r.not_restored = models_of(d.previous);
    const bool bug = res.error().code == Errc::internal;
    std::string why = bug ? "an internal error" : res.error().message;
    const std::optional<Error> failed =
        make_error(Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, why));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  const auto& back = res->restored;
  const std::string serve_again =
      back.empty() ? std::string()
                   : fmt::format("{} serve{} again", fmt::join(back, ", "), back.size() == 1 ? "s" : "");
  if (res->failed.size() == 1 && back.empty()) {
    r.not_restored.insert(res->failed.front().first);
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, res->failed.front().second));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  if (!res->failed.empty()) {
    std::vector<std::string> failures;
    for (const auto& [model, why] : res->failed) {
      r.not_restored.insert(model);
      failures.push_back(fmt::format("{}: {}", model, why));
    }
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed for {}{}", first_reason, fmt::join(failures, "; "),
                                           serve_again.empty() ? std::string() : "; " + serve_again));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  const std::optional<Error> rolled_back =
      Error{d.error ? d.error->code : Errc::internal, fmt::format("{}; rolled back: {}", first_reason, serve_again)};
  co_await finish(r, State::rolled_back, rolled_back);
}

asio::awaitable<void> Deployer::finish(Running& r, State state, const std::optional<Error>& error) {
  // The ended record is durable before anyone sees it ended.
  Deployment done = r.record;
  done.state = state;
  done.error = error;
  done.finished_at = util::rfc3339(std::chrono::system_clock::now());
  // Nothing moves any more: a rate or an ETA would mislead whoever reads the record later.
  done.progress.rate_bytes_per_s = 0;
  done.progress.eta_s.reset();
  co_await persist_now(done);
  r.record = std::move(done);
  auto& d = r.record;
  sys::Fields f = r.run->fields();
  f.state = std::string(to_string(state));
  switch (state) {
    case State::succeeded: f.message_id = message_id::succeeded; break;
    case State::rolled_back: f.message_id = message_id::rolled_back; break;
    case State::cancelled: f.message_id = message_id::cancelled; break;
    default: f.message_id = message_id::failed; break;
  }
  if (state == State::succeeded && d.kind == Kind::stop)
    sys::logf(sys::Level::notice, f, "stop {} succeeded: model {} is out of service; its files stay on disk", d.id,
              d.model);
  else if (state == State::succeeded && d.kind == Kind::pull)
    sys::logf(sys::Level::notice, f, "pull {} succeeded: model {} at {} is on disk and verified{}", d.id, d.model,
              d.commit->substr(0, 12), d.changed ? "" : " (it already was: nothing changed)");
  else if (state == State::succeeded)
    sys::logf(sys::Level::notice, f, "deployment {} succeeded: model {} at {} serves on port {}{}", d.id, d.model,
              d.commit->substr(0, 12), r.run->model.serve.port, d.changed ? "" : " (nothing changed)");
  else {
    if (d.error)
      for (const auto& file : d.error->files) f.extra.emplace_back("MODELD_FILE", file);
    sys::logf(sys::Level::error, f, "deployment {} {} in phase {}: {}", d.id, to_string(state), to_string(d.phase),
              d.error ? d.error->message : "");
  }
  history_.push_front(d);
  while (history_.size() > 200) history_.pop_back();
  emit(EventKind::state, d);
  running_.reset();
  // Whatever serves now is watched again, except what a failed rollback could not bring back: it is
  // not known to work, and a loop of restarts would only hide that from the operator.
  watch_services(r.not_restored);
  announce_status();
}

void Deployer::persist(const Deployment& d) {
  // A copy travels to the pool; the StateStore outlives the pool's jobs (main, the tests).
  asio::post(writes_, [&states = states_, d] {
    if (auto r = states.save_deployment(d); !r)
      sys::logf(sys::Level::error, "cannot record deployment {}: {}", d.id, r.error().message);
  });
}

asio::awaitable<void> Deployer::persist_now(const Deployment& d) {
  const Deployment copy = d;
  auto& states = states_;
  // By reference only (GCC 12 mis-copies class objects captured by value in a coroutine).
  auto r = co_await util::on_executor<Result<void>>(writes_, [&] { return states.save_deployment(copy); });
  if (!r) sys::logf(sys::Level::error, "cannot record deployment {}: {}", copy.id, r.error().message);
}

void Deployer::emit(EventKind kind, const Deployment& d) { publish(deployment_event(kind, d)); }

void Deployer::publish(const Event& e) {
  // Copy first: a listener may unsubscribe itself while being called.
  auto ls = listeners_;
  for (auto& [_, l] : ls) l(e);
}

void Deployer::on_progress(Running& r, const fetch::Progress& p) {
  auto& d = r.record;
  d.progress.bytes_done = p.bytes_done;
  d.progress.bytes_total = p.bytes_total;
  d.progress.files_done = p.files_done;
  d.progress.files_total = p.files_total;
  d.progress.rate_bytes_per_s = p.rate_bytes_per_s;
  if (p.rate_bytes_per_s > 0 && p.bytes_total >= p.bytes_done)
    d.progress.eta_s = static_cast<double>(p.bytes_total - p.bytes_done) / p.rate_bytes_per_s;
  else
    d.progress.eta_s.reset();
  d.progress.files.clear();
  for (const auto& f : p.files) {
    FileProgress fp{f.path, f.bytes_done, f.bytes_total, f.rate_bytes_per_s, std::nullopt, f.connections};
    if (f.rate_bytes_per_s > 0 && f.bytes_total >= f.bytes_done)
      fp.eta_s = static_cast<double>(f.bytes_total - f.bytes_done) / f.rate_bytes_per_s;
    d.progress.files.push_back(std::move(fp));
  }
  emit(EventKind::progress, d);
  auto now = Clock::now();
  if (now - r.last_status >= std::chrono::seconds(1)) {
    r.last_status = now;
    announce_status();
  }
  // The journal gets at most one progress line every 5 s (the API and SSE get every update),
  // naming the files in flight so a stuck shard stands out.
  if (now - r.last_journal_progress >= std::chrono::seconds(5) || p.bytes_done == p.bytes_total) {
    r.last_journal_progress = now;
    sys::Fields f = r.run->fields();
    f.extra.emplace_back("MODELD_BYTES", std::to_string(p.bytes_done));
    std::string line = status_line();
    std::string files;
    for (std::size_t i = 0; i < d.progress.files.size(); ++i) {
      const auto& fp = d.progress.files[i];
      if (i == 4) {
        files += fmt::format(", and {} more", d.progress.files.size() - i);
        break;
      }
      files += fmt::format("{}{} {}%", files.empty() ? "" : ", ", fp.path,
                           fp.bytes_total ? fp.bytes_done * 100 / fp.bytes_total : 100);
      if (fp.rate_bytes_per_s > 0) files += " at " + util::format_rate(fp.rate_bytes_per_s);
      if (fp.connections > 1) files += fmt::format(" over {} connections", fp.connections);
    }
    if (!files.empty()) line += "; in flight: " + files;
    sys::log(sys::Level::info, f, line);
  }
}

void Deployer::on_warm_progress(Running& r, const WarmReport& w) {
  r.record.warm = w;
  emit(EventKind::progress, r.record);
  if (auto now = Clock::now(); now - r.last_status >= std::chrono::seconds(1)) {
    r.last_status = now;
    announce_status();
  }
}

std::string Deployer::status_line() const {
  if (running_) {
    const auto& d = running_->record;
    std::string s = fmt::format("{} {}", phase_verb(d.phase), d.model);
    if (d.phase == Phase::warming && d.warm && d.warm->bytes_total > 0) {
      const auto in_cache = d.warm->bytes_resident_before + d.warm->bytes_warmed;
      s += fmt::format(": {}% of {} in memory", std::min<std::uint64_t>(100, in_cache * 100 / d.warm->bytes_total),
                       util::format_bytes(d.warm->bytes_total));
    }
    if (d.phase == Phase::downloading && d.progress.bytes_total > 0) {
      const auto& p = d.progress;
      s += fmt::format(": {}% of {}", p.bytes_done * 100 / p.bytes_total, util::format_bytes(p.bytes_total));
      if (p.rate_bytes_per_s > 0) s += ", " + util::format_rate(p.rate_bytes_per_s);
      if (p.eta_s)
        s += ", " + util::format_duration(std::chrono::seconds(static_cast<long long>(*p.eta_s))) + " left";
    }
    return s;
  }
  std::vector<std::string> serving;
  for (const auto& a : state_.active.services) serving.push_back(fmt::format("{} ({})", a.model, a.commit.substr(0, 12)));
  std::string s = serving.empty() ? std::string("idle, no model active") : fmt::format("serving {}", fmt::join(serving, ", "));
  if (!history_.empty() && history_.front().state != State::succeeded)
    s += fmt::format("; last deployment {} {}", history_.front().id, to_string(history_.front().state));
  for (const auto& r : watchdogs()) {
    if (!state_.active.find(r.model)) continue;
    const std::string who = serving.size() > 1 ? " of " + r.model : std::string();
    if (r.state != "watching" || r.restarts > 0 || r.consecutive_failures > 0)
      s += fmt::format("; watchdog{} {}, {} restart{}", who, r.state, r.restarts, r.restarts == 1 ? "" : "s");
    if (r.consecutive_failures > 0)
      s += fmt::format(", {} failed probe{} in a row", r.consecutive_failures, r.consecutive_failures == 1 ? "" : "s");
  }
  return s;
}

void Deployer::announce_status() { sys::notify_status(status_line()); }

std::optional<Active> Deployer::active() const {
  const auto* last = state_.active.last();
  if (!last) return std::nullopt;
  Active a;
  a.model = last->model;
  a.commit = last->commit;
  a.unit = units::serve_unit(a.model);
  a.port = placement_of(*last, services_.config->find_model(a.model)).port;
  a.since = last->since;
  return a;
}

std::vector<ServiceInfo> Deployer::services() const {
  std::vector<ServiceInfo> out;
  const auto watched = watchdogs();
  for (const auto& a : state_.active.services) {
    ServiceInfo i{a.model, a.commit, units::serve_unit(a.model)};
    const auto* m = services_.config->find_model(a.model);
    const auto p = placement_of(a, m);
    i.port = p.port;
    i.gpu_ids = p.gpu_ids;
    i.since = a.since;
    for (const auto& w : watched)
      if (w.model == a.model) i.watchdog = w;
    out.push_back(std::move(i));
  }
  return out;
}

std::optional<Deployment> Deployer::current() const {
  if (running_) return running_->record;
  if (!history_.empty()) return history_.front();
  return std::nullopt;
}

std::vector<Deployment> Deployer::history(std::size_t limit) const {
  std::vector<Deployment> out;
  if (running_ && limit > 0) out.push_back(running_->record);
  for (const auto& d : history_) {
    if (out.size() >= limit) break;
    out.push_back(d);
  }
  return out;
}

Result<Deployment> Deployer::get(const std::string& id) const {
  if (running_ && running_->record.id == id) return running_->record;
  for (const auto& d : history_)
    if (d.id == id) return d;
  return make_error(Errc::not_found, fmt::format("no deployment with id '{}'", id));
}

Result<Deployment> Deployer::cancel(const std::string& id) {
  if (!running_ || running_->record.id != id) {
    auto d = get(id);
    if (!d) return d.error();
    return make_error(Errc::deployment_ended, fmt::format("deployment {} already ended ({})", id, to_string(d->state)));
  }
  auto& d = running_->record;
  if (d.phase == Phase::rolling_back)
    return make_error(Errc::deployment_ended, fmt::format("deployment {} is rolling back and cannot be cancelled", id));
  d.cancel_requested = true;
  persist(d);
  sys::Fields f = running_->run->fields();
  sys::logf(sys::Level::notice, f, "cancel requested for deployment {} in phase {}", id, to_string(d.phase));
  running_->cancel.emit(asio::cancellation_type::terminal);
  return d;
}

namespace {

// What a walk of the store found of one model: its size, the revision GET /v1/models reports (the
// linked one, else the newest) and that revision's state.
struct DiskModel {
  std::uint64_t size_bytes = 0;
  std::optional<std::string> commit;
  std::string state = "partial";
  std::vector<std::pair<std::string, std::string>> revisions;  ///< every revision on disk: commit, state
};

// A revision's state as GET /v1/models names it. Blocks (reads the manifest, a stat per file).
std::string revision_state(const store::Store& st, const std::string& name, const std::string& commit) {
  const auto check = st.check_manifest(name, commit);
  if (check == store::ManifestCheck::matches) return "verified";
  if (check == store::ManifestCheck::changed) return "corrupt";
  return "partial";
}

// Walks the store: every model on disk. Blocks (readdir, a stat per file).
std::map<std::string, DiskModel> models_on_disk(const store::Store& st) {
  std::map<std::string, DiskModel> out;
  for (const auto& s : st.list()) {
    DiskModel m;
    m.size_bytes = s.size_bytes;
    m.commit = s.linked_commit;
    if (!m.commit && !s.commits.empty()) m.commit = s.commits.back();
    for (const auto& c : s.commits) m.revisions.emplace_back(c, revision_state(st, s.name, c));
    if (m.commit) {
      auto known = std::find_if(m.revisions.begin(), m.revisions.end(), [&](const auto& r) { return r.first == *m.commit; });
      m.state = known != m.revisions.end() ? known->second : revision_state(st, s.name, *m.commit);
    }
    out[s.name] = std::move(m);
  }
  return out;
}

}  // namespace

struct Deployer::DiskModels {
  std::map<std::string, DiskModel> by_name;
};

asio::awaitable<Result<std::shared_ptr<const Deployer::DiskModels>>> Deployer::walk_store() {
  const auto& st = services_.store;
  auto settled = co_await util::on_pool<std::optional<DiskModels>>(status_pool_, [&st]() -> std::optional<DiskModels> {
    DiskModels d;
    if (st.read_if_settled([&] { d.by_name = models_on_disk(st); })) return d;
    return std::nullopt;
  });
  if (settled) {
    last_walk_ = std::make_shared<const DiskModels>(std::move(*settled));
    co_return last_walk_;
  }
  // modeld links or deletes files now (on the disk pool, perhaps for long): the last walk's list.
  if (last_walk_) co_return last_walk_;
  auto now = co_await util::on_pool<DiskModels>(status_pool_, [&st] { return DiskModels{models_on_disk(st)}; });
  co_return std::make_shared<const DiskModels>(std::move(now));
}

asio::awaitable<std::vector<ModelInfo>> Deployer::models() {
  auto disk = co_await walks_.run("store", [this] { return walk_store(); });
  static const DiskModels none;
  co_return model_list(disk ? **disk : none);
}

std::vector<ModelInfo> Deployer::model_list(const DiskModels& disk) const {
  std::vector<ModelInfo> out;
  for (const auto& [name, m] : services_.config->models) {
    ModelInfo i;
    i.name = name;
    i.repo = m.repo;
    i.revision = m.revision;
    i.pinned = m.pinned;
    i.active = state_.active.find(name) != nullptr;
    if (auto la = state_.last_active.find(name); la != state_.last_active.end()) i.last_active = la->second;
    i.state = "absent";
    if (auto s = disk.by_name.find(name); s != disk.by_name.end()) {
      i.size_bytes = s->second.size_bytes;
      i.commit = s->second.commit;
      i.state = s->second.state;
      i.revisions = revisions_of(name, s->second.revisions);
    }
    out.push_back(std::move(i));
  }
  return out;
}

std::vector<RevisionInfo> Deployer::revisions_of(const std::string& model,
                                                const std::vector<std::pair<std::string, std::string>>& on_disk) const {
  std::vector<RevisionInfo> out;
  for (const auto& [commit, state] : on_disk) {
    RevisionInfo r{commit, state};
    r.pulled = is_pulled(model, commit);
    r.in_service = in_service(model, commit);
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<Error> Deployer::disk_conflict(const std::string& model, std::string_view action) const {
  if (auto r = refuse_while_recovering()) return r;
  if (auto b = busy_.find(model); b != busy_.end())
    return make_error(Errc::deployment_running, fmt::format("a {} of model {} is in progress", b->second, model));
  if (action == "rm" && state_.active.find(model))
    return make_error(Errc::model_active,
                      fmt::format("model {} is active (served by {}); deploy another model before removing it", model,
                                  units::serve_unit(model)));
  if (running_) {
    const auto& d = running_->record;
    // Verifying reads every file while a deployment may link, download or evict; rm only
    // conflicts with the deployment's own target and the model it replaces.
    if (action == "verify" || touched_models(*running_).contains(model))
    {
      // "rm --commit" is written "rm NAME --commit ...": the model right after the command.
      const auto space = action.find(' ');
      const auto command = space == std::string_view::npos
                               ? fmt::format("{} {}", action, model)
                               : fmt::format("{} {}{} ...", action.substr(0, space), model, action.substr(space));
      return make_error(Errc::deployment_running,
                        fmt::format("{} {} of {} is running (phase {}); {} when it has ended", noun_of(d.kind), d.id,
                                    d.model, to_string(d.phase), command));
    }
  }
  if (shutting_down_) return make_error(Errc::cancelled, "modeld is shutting down");
  return std::nullopt;
}

namespace {

// Holds a model in Deployer::busy_ for the lifetime of one verify or rm.
struct BusyGuard {
  std::map<std::string, std::string>& busy;
  std::string model;
  BusyGuard(std::map<std::string, std::string>& b, std::string m, std::string what) : busy(b), model(std::move(m)) {
    busy[model] = std::move(what);
  }
  ~BusyGuard() { busy.erase(model); }
};

}  // namespace

asio::awaitable<Result<PlanReport>> Deployer::plan(std::string model, bool allow_downtime,
                                                   std::optional<std::string> commit) {
  // The configuration and the state may change while the Hub answers; the plan keeps its copies.
  auto cfg = services_.config;
  const auto* m = cfg->find_model(model);
  if (!m) co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  // Concurrent plans of one model under one configuration share one dry run (one listing, one
  // filtered copy of it). The key holds the configuration's address, alive while its flight runs.
  const std::string key = fmt::format("{}\n{}\n{}\n{}", model, allow_downtime, commit.value_or(""),
                                      static_cast<const void*>(cfg.get()));
  ++plans_waiting_;
  auto report = co_await plans_.run(key, [&] { return plan_now(*m, allow_downtime, commit); });
  // The listing's records and the plans' copies of them are freed by now: give the pages back
  // (on the event loop: a few ms), once, when the last plan of a burst has its answer.
  if (--plans_waiting_ == 0) util::release_free_memory();
  co_return report;
}

asio::awaitable<Result<PlanReport>> Deployer::plan_now(const config::ModelConfig& m, bool allow_downtime,
                                                       std::optional<std::string> commit) {
  std::optional<std::string> active;
  if (const auto* last = state_.active.last()) active = last->model;
  const auto stopped = conflicting(state_.active.services, placement_of(m), *services_.config);
  const Serving serving{models_of(state_.active.services), models_of(stopped)};
  const auto last_active = state_.last_active;
  const auto pulled = state_.pulled;
  const std::string revision = commit.value_or(m.revision);
  auto report = co_await dry_run_plan(services_, m, revision, allow_downtime, serving, active, last_active, pulled);
  if (!report) co_return report;
  // What a deployment of the planned commit would decide after its planning.
  Deployment d;
  d.model = m.name;
  d.commit = report->commit;
  const Run run{.record = d, .model = m};
  report->already_serving = !(co_await why_not_noop(d, run));
  std::vector<Placement> stops;
  for (const auto& a : stopped) stops.push_back(placement_of(a, services_.config->find_model(a.model)));
  report->preflight = co_await run_preflight(services_, m, stops);
  co_return report;
}

asio::awaitable<std::optional<Error>> Deployer::unknown_model(const std::string& model) {
  if (services_.config->find_model(model)) co_return std::nullopt;
  // Two lstat calls (blocking: on the disk pool).
  auto& st = services_.store;
  const bool there = co_await util::on_pool<bool>(services_.disk_pool, [&] { return on_disk(st, model); });
  if (there) co_return std::nullopt;
  co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or on disk", model));
}

asio::awaitable<Result<VerifyReport>> Deployer::verify(std::string model) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (auto c = disk_conflict(model, "verify")) co_return *c;
  BusyGuard guard(busy_, model, "verify");
  sys::Fields f;
  f.model = model;
  sys::logf(sys::Level::info, f, "verifying model {} on disk", model);
  auto r = co_await verify_on_disk(services_, model);
  if (!r) co_return r.error();
  f.extra.emplace_back("MODELD_COMMIT", r->commit);
  if (r->ok()) {
    sys::logf(sys::Level::notice, f, "model {} at {} verified: {} files, {}, no problems", model,
              r->commit.substr(0, 12), r->files, util::format_bytes(r->bytes));
    rewatch_verified(model, r->commit, f);
  } else {
    for (const auto& p : r->problems) {
      sys::Fields pf = f;
      pf.extra.emplace_back("MODELD_FILE", p.file);
      if (!p.tensor.empty()) pf.extra.emplace_back("MODELD_TENSOR", p.tensor);
      sys::log(sys::Level::error, pf, p.message);
    }
    sys::logf(sys::Level::error, f, "model {} at {}: {} problem{} found", model, r->commit.substr(0, 12),
              r->problems.size(), r->problems.size() == 1 ? "" : "s");
  }
  co_return r;
}

void Deployer::rewatch_verified(const std::string& model, const std::string& commit, const sys::Fields& f) {
  if (!in_service(model, commit) || watcher_for(model).running()) return;
  // The watchdog stops for good when it finds the files changed; now they hash clean again, it
  // watches (and restarts a server that is down) once more.
  sys::logf(sys::Level::notice, f, "model {} is active and its files are intact: the watchdog watches it again", model);
  watch_service(model, false);
}

asio::awaitable<std::optional<Error>> Deployer::unit_runs(const std::string& model, bool whole_model) {
  const auto unit = units::serve_unit(model);
  auto st = co_await services_.units.status(unit);
  if (!st)
    co_return make_error(st.error().code,
                         fmt::format("cannot tell whether {} runs ({}): not removing model {}", unit,
                                     st.error().message, model));
  if (!units::is_up(st->active_state)) co_return std::nullopt;
  // A service in state serves its recorded revision: the others may go (rm --commit).
  if (!whole_model && state_.active.find(model)) co_return std::nullopt;
  co_return make_error(Errc::model_active,
                       fmt::format("{} is {} (systemd), though modeld has no service of model {} in its state: what it "
                                   "serves is unknown, so no revision of {} is removed; stop it first (systemctl stop "
                                   "{}), or deploy {} to put it under modeld",
                                   unit, units::to_string(st->active_state), model, model, unit, model));
}

asio::awaitable<Result<Removal>> Deployer::remove(std::string model) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (auto c = disk_conflict(model, "rm")) co_return *c;
  BusyGuard guard(busy_, model, "rm");
  if (auto e = co_await unit_runs(model, true)) co_return *e;
  auto r = co_await remove_from_disk(services_, model);
  if (!r) co_return r.error();
  sys::Fields f;
  f.model = model;
  sys::logf(sys::Level::notice, f, "removed model {} ({} revision{}, {} freed)", model, r->commits.size(),
            r->commits.size() == 1 ? "" : "s", util::format_bytes(r->bytes_freed));
  if (forget_pulled(model, std::nullopt)) co_await save_state(f);
  co_return r;
}

asio::awaitable<Result<Removal>> Deployer::remove_revision(std::string model, std::string commit) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (in_service(model, commit))
    co_return make_error(Errc::model_active,
                         fmt::format("revision {} of model {} is in service (served by {}); deploy another revision "
                                     "or model before removing it",
                                     commit, model, units::serve_unit(model)));
  if (auto c = disk_conflict(model, "rm --commit")) co_return *c;
  BusyGuard guard(busy_, model, "rm");
  if (auto e = co_await unit_runs(model, false)) co_return *e;
  auto r = co_await remove_revision_from_disk(services_, model, commit);
  if (!r) co_return r.error();
  sys::Fields f;
  f.model = model;
  f.extra.emplace_back("MODELD_COMMIT", commit);
  sys::logf(sys::Level::notice, f, "removed revision {} of model {} ({} freed)", commit, model,
            util::format_bytes(r->bytes_freed));
  if (forget_pulled(model, commit)) co_await save_state(f);
  co_return r;
}

std::uint64_t Deployer::subscribe(std::function<void(const Event&)> listener) {
  auto t = next_listener_++;
  listeners_[t] = std::move(listener);
  return t;
}

void Deployer::unsubscribe(std::uint64_t token) { listeners_.erase(token); }

std::vector<WatchdogStatus> Deployer::watchdogs() const {
  // The active service's watcher first (the API's "watchdog"), then the others by model name.
  std::vector<WatchdogStatus> out;
  const auto* last = state_.active.last();
  auto add = [&](const ModelWatcher& w) {
    for (auto& st : w.statuses()) out.push_back(std::move(st));
  };
  if (last)
    if (auto it = watchers_.find(last->model); it != watchers_.end()) add(*it->second);
  for (const auto& [model, w] : watchers_)
    if (!last || model != last->model) add(*w);
  return out;
}

double Deployer::uptime_s() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

}  // namespace modeld::deploy
