// Boot recovery (load, recover: adopting what runs, settling conflicts, starting what is down,
// continuing an interrupted record) and configuration reload: members of the Deployer.
#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/phase_table.hpp"
#include "deploy/launch.hpp"
#include "deploy/maintenance.hpp"
#include "deploy/stop_old.hpp"
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
  co_await log_unlogged_ends();
  // A modeld killed inside switch_link or planning's hard links left its temporary (nothing makes one before here).
  auto& store = services_.store;
  const auto temps =
      co_await util::on_pool<std::vector<std::string>>(services_.disk_pool, [&] { return store.remove_link_temps(); });
  for (const auto& t : temps)
    sys::logf(sys::Level::notice, "state recovery: removed {}, a temporary link a killed modeld left", t);
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
  // The services an unfinished deployment's switch took its durable decision on (restart: began
  // to stop them) are its own to finish or bring back.
  std::set<std::string> owned;
  if (unfinished && switch_named(services_, unfinished->switch_method).committed(*unfinished)) {
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
      const std::chrono::milliseconds wait = stop_wait(m ? config::stop_budget(m->serve) : std::chrono::minutes(5));
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

asio::awaitable<void> Deployer::continue_unfinished(Deployment& d) {
  const auto first = resume_step(d, switch_named(services_, d.switch_method));
  sys::Fields f;
  f.deployment = d.id;
  f.model = d.model;
  f.phase = std::string(to_string(d.phase));
  const std::string from = first == Step::cleanup ? "health_checking (the cleanup of older revisions)"
                                                  : std::string(to_string(first));
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
    sys::Fields f = running_->fields();
    sys::logf(sys::Level::notice, f,
              "deployment {} of {} continues with the configuration it started with; the reloaded one applies "
              "to later deployments",
              running_->record().id, running_->record().model);
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

}  // namespace modeld::deploy
