#include "deploy/deployer.hpp"
#include "util/json.hpp"

#include "fetch/fetch.hpp"
#include "store/store.hpp"
#include "sys/notify.hpp"
#include "sys/task.hpp"
#include "units/service_manager.hpp"
#include "util/memory.hpp"
#include "util/on_pool.hpp"
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
  std::unique_ptr<Run> run;
  asio::cancellation_signal cancel;  ///< bound to the phase that runs now
  Clock::time_point last_journal_progress{};
  Clock::time_point last_status{};
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

std::string_view phase_verb(Phase p) {
  switch (p) {
    case Phase::planning: return "planning";
    case Phase::freeing_disk: return "freeing disk for";
    case Phase::downloading: return "downloading";
    case Phase::verifying: return "verifying";
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
    : io_(io), services_(std::move(services)), states_(states) {
  watcher_ = std::make_unique<ModelWatcher>(io_, services_, std::move(watchdog));
  watcher_->on_change([this](const WatchdogStatus& w) {
    announce_status();
    Event e;
    e.kind = EventKind::watcher;
    e.model = w.model;
    e.watcher = w;
    publish(e);
  });
}

Deployer::~Deployer() = default;

Result<void> Deployer::load() {
  auto st = states_.load();
  if (!st) return st.error();
  state_ = std::move(*st);
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
  // start() refuses until here, the end of recover(): from the erase below to the end nothing
  // awaits, and begin() has set running_ by then.
  struct Recovered {
    std::optional<std::string>& interrupted;
    ~Recovered() { interrupted.reset(); }
  } recovered{interrupted_};
  const bool takes_over = unfinished && unfinished->old_stopped;
  bool watch = false;           // the active model may be watched when no deployment continues
  bool started_unit = false;    // recover started its unit: readiness comes before the first probe
  // A reload while this runs must not free the model tables it reads.
  const auto cfg = services_.config;
  if (state_.active && !takes_over) {
    const auto* m = cfg->find_model(state_.active->model);
    sys::Fields f;
    f.model = state_.active->model;
    if (!m) {
      sys::logf(sys::Level::warning, f, "active model {} is no longer configured; leaving its service alone",
                state_.active->model);
    } else {
      const auto unit = units::serve_unit(m->name);
      // GCC 12 miscompiles co_await inside a conditional expression: keep them as statements.
      Result<units::UnitStatus> st = make_error(Errc::internal, "not queried");
      auto installed = co_await install_dropin(services_, *m);
      if (installed)
        st = co_await services_.units.status(unit);
      else
        st = installed.error();
      if (!st) {
        sys::logf(sys::Level::error, f, "cannot check {}: {}", unit, st.error().message);
        watch = true;
      } else if (units::is_up(st->active_state)) {
        sys::logf(sys::Level::info, f, "active model {} is served by {} ({})", m->name, unit,
                  units::to_string(st->active_state));
        // It serves already: a changed file is reported, not re-hashed under the running server.
        const bool unchanged = co_await files_still_trusted(services_, m->name, state_.active->commit, f, false);
        (void)unchanged;
        watch = true;
      } else {
        // Never start a checkpoint whose files changed since their verification without re-hashing.
        const bool trusted = co_await files_still_trusted(services_, m->name, state_.active->commit, f, true);
        if (!trusted) {
          sys::logf(sys::Level::error, f,
                    "active model {} is not running and its files fail verification: not starting {} (deploy it "
                    "again to download what is damaged)",
                    m->name, unit);
        } else {
          sys::logf(sys::Level::notice, f, "active model {} is not running ({}): starting {}", m->name,
                    units::to_string(st->active_state), unit);
          if (auto s = co_await units::reset_failed_and_start(services_.units, unit); !s)
            sys::logf(sys::Level::error, f, "cannot start {}: {}", unit, s.error().message);
          else
            started_unit = true;
          watch = true;
        }
      }
    }
  }
  if (unfinished) {
    Phase first = Phase::planning;
    if (unfinished->phase == Phase::rolling_back) first = Phase::rolling_back;
    // Stopping is idempotent ("nothing to stop" once inactive), and a stop cut short by the
    // restart must finish before the new server may take the port and the GPUs.
    // (With stopping_old first, planning comes before it and re-reads what the later phases need.)
    else if (unfinished->old_stopped && !unfinished->downtime_first) first = Phase::stopping_old;
    sys::Fields f;
    f.deployment = unfinished->id;
    f.model = unfinished->model;
    f.phase = std::string(to_string(unfinished->phase));
    sys::logf(sys::Level::notice, f, "continuing deployment {} of {} interrupted in phase {}, from phase {}",
              unfinished->id, unfinished->model, to_string(unfinished->phase), to_string(first));
    std::erase_if(history_, [&](const Deployment& d) { return d.id == unfinished->id; });
    if (!services_.config->find_model(unfinished->model)) {
      unfinished->state = State::failed;
      unfinished->error = make_error(Errc::unknown_model, "model " + unfinished->model + " is no longer configured");
      unfinished->finished_at = util::rfc3339(std::chrono::system_clock::now());
      persist(*unfinished);
      history_.push_front(*unfinished);
    } else {
      begin(std::move(*unfinished), first);
    }
  }
  // Also while a continued deployment plans, downloads and verifies (watch_active() decides).
  if (watch && !shutting_down_) watch_active(started_unit);
  announce_status();
}

void Deployer::reconfigure(std::shared_ptr<const config::Config> config) {
  const auto old = services_.config;
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
  if (!state_.active || shutting_down_) return;
  const std::string active = state_.active->model;
  sys::Fields f;
  f.model = active;
  const auto* now = fresh.find_model(active);
  const auto* before = old->find_model(active);
  if (!now) {
    if (before)
      sys::logf(sys::Level::warning, f,
                "active model {} is no longer configured: {} keeps running, but it is not watched any more",
                active, units::serve_unit(active));
    watcher_->cancel();
    return;
  }
  if (before && *before == *now) return;
  if (running_) return;  // the deployment owns the drop-ins and the watchdog until it ends
  // The active model's table changed: rewrite its drop-in (the server picks it up at its next
  // start) and watch it again with the new intervals. A model configured again after a reload
  // had removed it is watched again too.
  const bool rewatch = watcher_->running() || !before;
  asio::co_spawn(io_, [this, active, f, rewatch]() -> asio::awaitable<void> {
    auto cfg = services_.config;
    const auto* m = cfg->find_model(active);
    if (!m || running_ || shutting_down_) co_return;
    if (auto r = co_await install_dropin(services_, *m); !r)
      sys::logf(sys::Level::error, f, "reload: cannot rewrite the drop-in of {}: {}", units::serve_unit(active),
                r.error().message);
    else
      sys::logf(sys::Level::info, f,
                "reload: rewrote the drop-in of {}; the running server keeps its settings until it restarts",
                units::serve_unit(active));
    co_await watcher_->stop();
    if (rewatch && !running_ && !shutting_down_ && state_.active && state_.active->model == active)
      watch_active(false);
  }, sys::log_failure("reload: rewriting the drop-in of " + units::serve_unit(active), f));
}

bool Deployer::owns_service(const Deployment& d, Phase p) {
  return d.old_stopped || p == Phase::stopping_old || p == Phase::launching || p == Phase::health_checking ||
         p == Phase::benchmarking || p == Phase::rolling_back;
}

void Deployer::watch_active(bool wait_ready_first) {
  if (!state_.active || shutting_down_ || (running_ && owns_service(running_->record, running_->record.phase))) return;
  watcher_->start(state_.active->model, wait_ready_first);
}

void Deployer::shutdown(std::function<void()> done) {
  shutting_down_ = true;
  if (watcher_->running()) {
    // The watchdog may be in the middle of a restart: it ends first (cancelled, awaited).
    watcher_->cancel();
    asio::co_spawn(io_, watcher_->stop(),
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

Result<Deployment> Deployer::start(const std::string& model, bool allow_downtime) {
  if (!services_.config->find_model(model))
    return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  if (running_)
    return make_error(Errc::deployment_running,
                      fmt::format("deployment {} of {} is running (phase {})", running_->record.id,
                                  running_->record.model, to_string(running_->record.phase)));
  if (interrupted_)
    return make_error(Errc::deployment_running,
                      fmt::format("deployment {}, interrupted by modeld's restart, is about to continue", *interrupted_));
  if (shutting_down_) return make_error(Errc::cancelled, "modeld is shutting down");
  if (!busy_.empty())
    return make_error(Errc::deployment_running,
                      fmt::format("a {} of model {} is in progress; deploy when it has ended", busy_.begin()->second,
                                  busy_.begin()->first));
  Deployment d;
  const auto now = std::chrono::system_clock::now();
  d.id = new_id(model, now);
  d.model = model;
  d.allow_downtime = allow_downtime;
  d.started_at = util::rfc3339(now);
  d.started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  if (state_.active) {
    d.previous_model = state_.active->model;
    d.previous_commit = state_.active->commit;
  }
  sys::Fields f;
  f.deployment = d.id;
  f.model = model;
  f.phase = "planning";
  f.message_id = message_id::started;
  sys::logf(sys::Level::notice, f, "deployment {} of model {} started{}", d.id, model,
            d.previous_model ? fmt::format(" (replacing {})", *d.previous_model) : std::string(" (no model active)"));
  // The watchdog keeps watching the model in service through planning, downloading and
  // verifying (hours for a large checkpoint); drive() stops it before the first phase that
  // touches the service.
  begin(d, Phase::planning);
  return running_->record;
}

void Deployer::begin(Deployment d, Phase first) {
  auto r = std::make_shared<Running>(services_);
  r->record = std::move(d);
  const auto* model = r->services.config->find_model(r->record.model);
  r->run = std::make_unique<Run>(Run{r->record, *model, {}, state_.last_active, {}, {}, {}, {}, {}});
  if (r->record.previous_model && r->record.previous_commit)
    r->run->previous = ActiveRecord{*r->record.previous_model, *r->record.previous_commit, ""};
  Running* raw = r.get();
  r->run->changed = [this, raw] { persist(raw->record); };
  r->run->on_progress = [this, raw](const fetch::Progress& p) { on_progress(*raw, p); };
  running_ = r;
  asio::co_spawn(io_, drive(r, first), sys::log_failure("deployment coroutine"));
}

asio::awaitable<Result<void>> Deployer::run_phase(Running& r, Phase p) {
  auto& s = r.services;
  auto& run = *r.run;
  auto body = [&]() -> asio::awaitable<Result<void>> {
    switch (p) {
      case Phase::planning: return run_planning(s, run);
      case Phase::freeing_disk: return run_freeing_disk(s, run);
      case Phase::downloading: return run_downloading(s, run);
      case Phase::verifying: return run_verifying(s, run);
      case Phase::stopping_old: return run_stopping_old(s, run);
      case Phase::launching: return run_launching(s, run);
      case Phase::health_checking: return run_health_checking(s, run);
      case Phase::benchmarking: return run_benchmarking(s, run);
      case Phase::rolling_back: return run_rolling_back(s, run);
    }
    return run_planning(s, run);
  };
  // Each phase runs as a child coroutine bound to the deployment's cancellation signal, so a
  // cancel (or SIGTERM) reaches every operation inside it, and an exception thrown by a bug in
  // a phase ends the deployment with an error instead of the daemon.
  auto [ex, result] = co_await asio::co_spawn(
      io_, body(), asio::bind_cancellation_slot(r.cancel.slot(), asio::as_tuple(asio::use_awaitable)));
  if (ex) {
    try {
      std::rethrow_exception(ex);
    } catch (const boost::system::system_error& e) {
      if (e.code() == asio::error::operation_aborted) co_return make_error(Errc::cancelled, "cancelled");
      co_return make_error(Errc::internal, std::string("phase ") + std::string(to_string(p)) + ": " + e.what());
    } catch (const std::exception& e) {
      co_return make_error(Errc::internal, std::string("phase ") + std::string(to_string(p)) + ": " + e.what());
    }
  }
  co_return result;
}

// What the daemon's state learns from a phase that succeeded: after freeing_disk, whether
// allow_downtime evicted the model that served; after health_checking, that the new model serves
// (recorded before the optional benchmark), and its older revisions go.
asio::awaitable<void> Deployer::after_phase(Running& r, Phase p) {
  auto& d = r.record;
  if (p == Phase::freeing_disk && state_.active && !services_.store.linked_commit(state_.active->model)) {
    sys::logf(sys::Level::warning, r.run->fields(), "model {} was evicted: no model is active until {} serves",
              state_.active->model, d.model);
    state_.last_active[state_.active->model] = util::rfc3339(std::chrono::system_clock::now());
    state_.active.reset();
    save_state(r);
  }
  if (p != Phase::health_checking) co_return;
  auto now = util::rfc3339(std::chrono::system_clock::now());
  if (state_.active) state_.last_active[state_.active->model] = now;
  state_.active = ActiveRecord{d.model, *d.commit, now};
  state_.last_active[d.model] = now;
  save_state(r);
  // On the disk pool: deleting a revision of hundreds of GB takes time. By reference only
  // (GCC 12 mis-copies class objects captured by value in a coroutine).
  auto rm = co_await util::on_pool<Result<std::uint64_t>>(
      services_.disk_pool, [&] { return services_.store.remove_other_revisions(d.model, *d.commit); });
  if (rm && *rm > 0)
    sys::logf(sys::Level::info, r.run->fields(), "removed older revisions of {} ({})", d.model, util::format_bytes(*rm));
}

void Deployer::save_state(Running& r) {
  if (auto s = states_.save(state_); !s)
    sys::logf(sys::Level::error, r.run->fields(), "cannot record the active model: {}", s.error().message);
}

asio::awaitable<void> Deployer::drive(std::shared_ptr<Running> rp, Phase first) {
  Running& r = *rp;
  auto& d = r.record;
  // Planning may put stopping_old first (allow_downtime with a plan that evicts the active
  // model); both orders start with planning, so the order is re-read after it.
  auto order_of = [](bool downtime_first) -> std::vector<Phase> {
    if (downtime_first)
      return {Phase::planning,  Phase::stopping_old, Phase::freeing_disk,    Phase::downloading,
              Phase::verifying, Phase::launching,    Phase::health_checking, Phase::benchmarking};
    return {Phase::planning,     Phase::freeing_disk, Phase::downloading,     Phase::verifying,
            Phase::stopping_old, Phase::launching,    Phase::health_checking, Phase::benchmarking};
  };
  std::vector<Phase> order = order_of(d.downtime_first);
  std::optional<Error> failure;
  bool rolling_back = first == Phase::rolling_back;
  if (!rolling_back) {
    bool started = false;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Phase p = order[i];
      if (p == first) started = true;
      if (!started) continue;
      if (d.cancel_requested) {
        failure = make_error(Errc::cancelled, "cancelled by the user");
        break;
      }
      if (owns_service(d, p) && watcher_->running()) co_await watcher_->stop();
      d.phase = p;
      persist(d);
      emit(EventKind::phase, d);
      announce_status();
      auto res = co_await run_phase(r, p);
      if (shutting_down_) {
        // Left recorded as running: the next daemon start continues it from this phase.
        sys::logf(sys::Level::notice, r.run->fields(), "deployment {} interrupted by shutdown in phase {}", d.id,
                  to_string(p));
        persist(d);
        running_.reset();
        if (on_idle_) on_idle_();
        co_return;
      }
      // A cancel that came as the phase began found nothing to stop yet: it ends the deployment
      // now. In benchmarking the new model has passed its health check and serves (older
      // revisions are gone): nothing is undone, only the benchmark is skipped.
      if (d.cancel_requested && p == Phase::benchmarking) {
        sys::logf(sys::Level::notice, r.run->fields(), "cancelled while benchmarking: {} serves, benchmark skipped", d.model);
        break;
      }
      if (!res || d.cancel_requested) {
        failure = d.cancel_requested ? make_error(Errc::cancelled, "cancelled by the user") : res.error();
        break;
      }
      if (p == Phase::planning) order = order_of(d.downtime_first);
      co_await after_phase(r, p);
    }
    if (!failure) {
      finish(r, State::succeeded, std::nullopt);
      co_return;
    }
    const bool need_rollback = d.old_stopped && d.previous_model && !(state_.active && state_.active->model == d.model &&
                                                                       state_.active->commit == d.commit);
    if (!need_rollback) {
      finish(r, failure->code == Errc::cancelled ? State::cancelled : State::failed, failure);
      co_return;
    }
    // Whether the revision that served is still on disk. Not the link: a redeploy of the same
    // model at a new commit has switched models_dir/NAME to the new revision already, and the
    // rollback switches it back.
    auto previous_on_disk = [&] {
      std::error_code ec;
      return std::filesystem::is_directory(services_.store.revision_dir(*d.previous_model, *d.previous_commit), ec);
    };
    if (d.previous_commit && !previous_on_disk()) {
      // allow_downtime evicted it: there is nothing to bring back.
      finish(r, State::failed,
             make_error(Errc::rollback_failed,
                        fmt::format("{}; model {} was evicted to make room (allow_downtime) and cannot be restored: "
                                    "no model serves",
                                    failure->message, *d.previous_model)));
      co_return;
    }
    sys::Fields f = r.run->fields();
    sys::logf(sys::Level::error, f, "phase {} failed after the old model was stopped: {}; rolling back",
              to_string(d.phase), failure->message);
    d.error = failure;
  }
  // rolling_back is not cancellable: leaving the host with nothing serving is worse.
  if (watcher_->running()) co_await watcher_->stop();
  d.phase = Phase::rolling_back;
  persist(d);
  emit(EventKind::phase, d);
  announce_status();
  asio::cancellation_signal never;
  auto [ex, res] = co_await asio::co_spawn(io_, run_rolling_back(r.services, *r.run),
                                           asio::bind_cancellation_slot(never.slot(), asio::as_tuple(asio::use_awaitable)));
  const std::string first_reason = d.error ? d.error->message : "interrupted by a daemon restart";
  if (ex || !res) {
    std::string why = ex ? "an internal error" : res.error().message;
    finish(r, State::failed,
           make_error(Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, why)));
    co_return;
  }
  finish(r, State::rolled_back,
         Error{d.error ? d.error->code : Errc::internal,
               fmt::format("{}; rolled back: {} serves again", first_reason, d.previous_model.value_or("?"))});
}

void Deployer::finish(Running& r, State state, std::optional<Error> error) {
  auto& d = r.record;
  d.state = state;
  d.error = std::move(error);
  d.finished_at = util::rfc3339(std::chrono::system_clock::now());
  // Nothing moves any more: a rate or an ETA would mislead whoever reads the record later.
  d.progress.rate_bytes_per_s = 0;
  d.progress.eta_s.reset();
  persist(d);
  sys::Fields f = r.run->fields();
  f.state = std::string(to_string(state));
  switch (state) {
    case State::succeeded: f.message_id = message_id::succeeded; break;
    case State::rolled_back: f.message_id = message_id::rolled_back; break;
    case State::cancelled: f.message_id = message_id::cancelled; break;
    default: f.message_id = message_id::failed; break;
  }
  if (state == State::succeeded)
    sys::logf(sys::Level::notice, f, "deployment {} succeeded: model {} at {} serves on port {}", d.id, d.model,
              d.commit->substr(0, 12), r.run->model.serve.port);
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
  // Whatever serves now is watched again, except after a failed rollback: then nothing known to
  // work serves, and a loop of restarts would only hide that from the operator.
  if (!(d.error && d.error->code == Errc::rollback_failed)) watch_active(false);
  announce_status();
}

void Deployer::persist(const Deployment& d) {
  if (auto r = states_.save_deployment(d); !r)
    sys::logf(sys::Level::error, "cannot record deployment {}: {}", d.id, r.error().message);
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

std::string Deployer::status_line() const {
  if (running_) {
    const auto& d = running_->record;
    std::string s = fmt::format("{} {}", phase_verb(d.phase), d.model);
    if (d.phase == Phase::downloading && d.progress.bytes_total > 0) {
      const auto& p = d.progress;
      s += fmt::format(": {}% of {}", p.bytes_done * 100 / p.bytes_total, util::format_bytes(p.bytes_total));
      if (p.rate_bytes_per_s > 0) s += ", " + util::format_rate(p.rate_bytes_per_s);
      if (p.eta_s)
        s += ", " + util::format_duration(std::chrono::seconds(static_cast<long long>(*p.eta_s))) + " left";
    }
    return s;
  }
  std::string s = state_.active ? fmt::format("serving {} ({})", state_.active->model, state_.active->commit.substr(0, 12))
                                : std::string("idle, no model active");
  if (!history_.empty() && history_.front().state != State::succeeded)
    s += fmt::format("; last deployment {} {}", history_.front().id, to_string(history_.front().state));
  if (state_.active) {
    auto w = watcher_->statuses();
    if (!w.empty() && w.front().model == state_.active->model) {
      const auto& r = w.front();
      if (r.state != "watching" || r.restarts > 0 || r.consecutive_failures > 0)
        s += fmt::format("; watchdog {}, {} restart{}", r.state, r.restarts, r.restarts == 1 ? "" : "s");
      if (r.consecutive_failures > 0) s += fmt::format(", {} failed probe{} in a row", r.consecutive_failures,
                                                       r.consecutive_failures == 1 ? "" : "s");
    }
  }
  return s;
}

void Deployer::announce_status() { sys::notify_status(status_line()); }

std::optional<Active> Deployer::active() const {
  if (!state_.active) return std::nullopt;
  Active a;
  a.model = state_.active->model;
  a.commit = state_.active->commit;
  a.unit = units::serve_unit(a.model);
  if (const auto* m = services_.config->find_model(a.model)) a.port = m->serve.port;
  a.since = state_.active->since;
  return a;
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
};

// Walks the store: every model on disk. Blocks (readdir, a stat per file).
std::map<std::string, DiskModel> models_on_disk(const store::Store& st) {
  std::map<std::string, DiskModel> out;
  for (const auto& s : st.list()) {
    DiskModel m;
    m.size_bytes = s.size_bytes;
    m.commit = s.linked_commit;
    if (!m.commit && !s.commits.empty()) m.commit = s.commits.back();
    if (m.commit) {
      const auto check = st.check_manifest(s.name, *m.commit);
      if (check == store::ManifestCheck::matches) m.state = "verified";
      if (check == store::ManifestCheck::changed) m.state = "corrupt";
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
    i.active = state_.active && state_.active->model == name;
    if (auto la = state_.last_active.find(name); la != state_.last_active.end()) i.last_active = la->second;
    i.state = "absent";
    if (auto s = disk.by_name.find(name); s != disk.by_name.end()) {
      i.size_bytes = s->second.size_bytes;
      i.commit = s->second.commit;
      i.state = s->second.state;
    }
    out.push_back(std::move(i));
  }
  return out;
}

std::optional<Error> Deployer::disk_conflict(const std::string& model, std::string_view action) const {
  if (auto b = busy_.find(model); b != busy_.end())
    return make_error(Errc::deployment_running, fmt::format("a {} of model {} is in progress", b->second, model));
  if (action == "rm" && state_.active && state_.active->model == model)
    return make_error(Errc::model_active,
                      fmt::format("model {} is active (served by {}); deploy another model before removing it", model,
                                  units::serve_unit(model)));
  if (running_) {
    const auto& d = running_->record;
    // Verifying reads every file while a deployment may link, download or evict; rm only
    // conflicts with the deployment's own target and the model it replaces.
    if (action == "verify" || d.model == model || d.previous_model == model)
      return make_error(Errc::deployment_running,
                        fmt::format("deployment {} of {} is running (phase {}); {} {} when it has ended", d.id, d.model,
                                    to_string(d.phase), action, model));
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

asio::awaitable<Result<PlanReport>> Deployer::plan(std::string model, bool allow_downtime) {
  // The configuration and the state may change while the Hub answers; the plan keeps its copies.
  auto cfg = services_.config;
  const auto* m = cfg->find_model(model);
  if (!m) co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  // Concurrent plans of one model under one configuration share one dry run (one listing, one
  // filtered copy of it). The key holds the configuration's address, alive while its flight runs.
  const std::string key = fmt::format("{}\n{}\n{}", model, allow_downtime, static_cast<const void*>(cfg.get()));
  ++plans_waiting_;
  auto report = co_await plans_.run(key, [&] { return plan_now(*m, allow_downtime); });
  // The listing's records and the plans' copies of them are freed by now: give the pages back
  // (on the event loop: a few ms), once, when the last plan of a burst has its answer.
  if (--plans_waiting_ == 0) util::release_free_memory();
  co_return report;
}

asio::awaitable<Result<PlanReport>> Deployer::plan_now(const config::ModelConfig& m, bool allow_downtime) {
  std::optional<std::string> active;
  if (state_.active) active = state_.active->model;
  const auto last_active = state_.last_active;
  co_return co_await dry_run_plan(services_, m, allow_downtime, active, last_active);
}

asio::awaitable<Result<VerifyReport>> Deployer::verify(std::string model) {
  if (!services_.config->find_model(model) && !on_disk(services_.store, model))
    co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or on disk", model));
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
  if (!state_.active || state_.active->model != model || state_.active->commit != commit || watcher_->running())
    return;
  // The watchdog stops for good when it finds the files changed; now they hash clean again, it
  // watches (and restarts a server that is down) once more.
  sys::logf(sys::Level::notice, f, "model {} is active and its files are intact: the watchdog watches it again", model);
  watch_active(false);
}

asio::awaitable<Result<Removal>> Deployer::remove(std::string model) {
  if (!services_.config->find_model(model) && !on_disk(services_.store, model))
    co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or on disk", model));
  if (auto c = disk_conflict(model, "rm")) co_return *c;
  BusyGuard guard(busy_, model, "rm");
  auto r = co_await remove_from_disk(services_, model);
  if (!r) co_return r.error();
  sys::Fields f;
  f.model = model;
  sys::logf(sys::Level::notice, f, "removed model {} ({} revision{}, {} freed)", model, r->commits.size(),
            r->commits.size() == 1 ? "" : "s", util::format_bytes(r->bytes_freed));
  co_return r;
}

std::uint64_t Deployer::subscribe(std::function<void(const Event&)> listener) {
  auto t = next_listener_++;
  listeners_[t] = std::move(listener);
  return t;
}

void Deployer::unsubscribe(std::uint64_t token) { listeners_.erase(token); }

std::vector<WatchdogStatus> Deployer::watchdogs() const { return watcher_->statuses(); }

double Deployer::uptime_s() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

}  // namespace modeld::deploy
