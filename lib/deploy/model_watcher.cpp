#include "deploy/model_watcher.hpp"
#include "deploy/health_check.hpp"
#include "deploy/launch.hpp"
#include "deploy/maintenance.hpp"
#include "deploy/stop_old.hpp"

#include "health/health.hpp"
#include "sys/task.hpp"
#include "units/service_manager.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace modeld::deploy {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// What one watch coroutine shares with the ModelWatcher: its cancellation and whether it was asked
/// to end (probes and readiness waits turn a cancellation into a value, so the flag is checked
/// after each of them).
struct WatchRun {
  asio::cancellation_signal signal;
  bool stop = false;
};

milliseconds watchdog_backoff(unsigned streak, milliseconds base, milliseconds cap) {
  if (streak == 0) return milliseconds(0);
  milliseconds d = base;
  for (unsigned i = 1; i < streak && d < cap; ++i) d *= 2;
  return std::min(d, cap);
}

namespace {

// Why a unit that is not active counts as down, from what systemd says about its last run.
std::string describe_down(const std::string& unit, const units::UnitStatus& st) {
  std::string how;
  if (st.result == "signal" || st.result == "core-dump")
    how = fmt::format("its main process was killed by signal {}", st.exec_main_status);
  else if (st.result == "success" || st.result.empty())
    how = fmt::format("its main process exited with status {} on its own", st.exec_main_status);
  else
    how = fmt::format("its main process exited with status {}", st.exec_main_status);
  return fmt::format("{} left the active state: it is {} ({}), result {}, {}", unit, units::to_string(st.active_state),
                     st.sub_state.empty() ? std::string("?") : st.sub_state,
                     st.result.empty() ? std::string("unknown") : st.result, how);
}

std::string seconds_text(milliseconds d) {
  if (d < std::chrono::seconds(10)) return util::format_seconds(d);
  return util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(d));
}

// The cheap probe: health::probe_once (health path, models list, and a max_tokens=1 completion
// when health.completion) against the model's port.
asio::awaitable<Result<void>> default_probe(Services& s, const config::ModelConfig& m) {
  auto t = target_of(m);
  if (!t) co_return t.error();
  co_return co_await health::probe_once(s.local_client, *t);
}

// Waits `d`; false when the wait was cancelled.
asio::awaitable<bool> pause(milliseconds d) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(d);
  auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  co_return !ec;
}

}  // namespace

ModelWatcher::ModelWatcher(asio::io_context& io, Services& services, Options options)
    : io_(io), services_(services), options_(std::move(options)) {}

ModelWatcher::ModelWatcher(asio::io_context& io, Services& services) : ModelWatcher(io, services, Options{}) {}

ModelWatcher::~ModelWatcher() {
  // The coroutine, if any, is destroyed with the io_context; it must not call back into us.
  if (run_) run_->stop = true;
  on_stopped_.clear();
}

WatchdogStatus& ModelWatcher::record(const std::string& model) {
  auto [it, fresh] = records_.try_emplace(model);
  if (fresh) {
    it->second.model = model;
    it->second.unit = units::serve_unit(model);
  }
  return it->second;
}

void ModelWatcher::changed() {
  if (!on_change_) return;
  if (auto it = records_.find(current_); it != records_.end()) on_change_(it->second);
}

void ModelWatcher::start(const std::string& model, bool wait_ready_first) {
  if (running_) return;
  if (!services_.config->find_model(model)) return;
  running_ = true;
  current_ = model;
  auto run = std::make_shared<WatchRun>();
  run_ = run;
  record(model).state = wait_ready_first ? "restarting" : "watching";
  asio::co_spawn(io_, watch(model, wait_ready_first, run),
                 asio::bind_cancellation_slot(run->signal.slot(), [this, run, log = sys::log_failure("watchdog")](
                                                                      std::exception_ptr e) {
                   log(e);
                   if (run != run_) return;  // a ModelWatcher being destroyed dropped it
                   running_ = false;
                   record(current_).state = "stopped";
                   changed();
                   auto waiting = std::move(on_stopped_);
                   on_stopped_.clear();
                   for (auto& w : waiting) w();
                 }));
  changed();
}

void ModelWatcher::cancel() {
  if (!run_ || run_->stop) return;
  run_->stop = true;
  run_->signal.emit(asio::cancellation_type::terminal);
}

asio::awaitable<void> ModelWatcher::stop() {
  cancel();
  if (!running_) co_return;
  asio::steady_timer done(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
  on_stopped_.push_back([&done] { done.cancel(); });
  auto [ec] = co_await done.async_wait(asio::as_tuple(asio::use_awaitable));
  (void)ec;
}

std::vector<WatchdogStatus> ModelWatcher::statuses() const {
  std::vector<WatchdogStatus> out;
  if (auto it = records_.find(current_); it != records_.end()) out.push_back(it->second);
  for (const auto& [name, r] : records_)
    if (name != current_) out.push_back(r);
  return out;
}

asio::awaitable<Result<void>> ModelWatcher::ready(const config::ModelConfig& m, const sys::Fields& f) {
  if (options_.wait_ready) co_return co_await options_.wait_ready(m, f);
  if (auto r = co_await wait_model_ready(services_, m, f); !r) co_return r.error();
  co_return Result<void>{};
}

asio::awaitable<Result<void>> ModelWatcher::probe(const config::ModelConfig& m) {
  if (options_.probe) co_return co_await options_.probe(m);
  co_return co_await default_probe(services_, m);
}

/// One watch's state: the model, its unit, the run of restarts and why a restart is due.
struct Watched {
  std::string model;
  config::ModelConfig m;  // a copy: the configuration may be replaced meanwhile
  std::string unit;
  sys::Fields f;
  unsigned k;              // failed probes in a row that call for a restart
  milliseconds interval;   // between checks
  WatchdogStatus& rec;
  WatchRun& run;
  unsigned streak = 0;                            // restarts in the current run of restarts
  std::optional<Clock::time_point> last_restart;  // when the last restart became ready
  std::optional<std::string> pending;             // why a restart is due now
  std::string refused;                            // why the last restart was refused (logged once)
};

/// What a restart that came due amounts to once backoff and a second look are over.
enum class ModelWatcher::Due : int { end, healed, restart_live, restart_down };

void ModelWatcher::set_state(WatchdogStatus& rec, const char* state) {
  rec.state = state;
  changed();
}

asio::awaitable<void> ModelWatcher::watch(std::string model, bool wait_ready_first, std::shared_ptr<WatchRun> run) {
  const auto* found = services_.config->find_model(model);
  if (!found) co_return;
  Watched w{model, *found, units::serve_unit(model), {}, std::max(1u, found->health.watch_failures),
            std::max<milliseconds>(found->health.watch_interval, milliseconds(100)), record(model), *run};
  w.f.model = model;
  w.f.extra.emplace_back("MODELD_UNIT", w.unit);
  w.rec.consecutive_failures = 0;

  if (wait_ready_first) {
    auto r = co_await ready(w.m, w.f);
    if (run->stop) co_return;
    if (!r) w.pending = fmt::format("{} is not ready after the daemon started it: {}", w.unit, r.error().message);
  }
  set_state(w.rec, "watching");
  sys::logf(sys::Level::info, w.f, "watchdog: watching {} every {}, restarting it when it leaves the active state or "
            "after {} failed probe{} in a row", w.unit, seconds_text(w.interval), w.k, w.k == 1 ? "" : "s");

  // Statements, not && or ?: around co_await (GCC 12 miscompiles those).
  for (;;) {
    if (!w.pending) {
      const bool go_on = co_await check(w);
      if (!go_on) break;
      if (!w.pending) continue;
    }
    const Due due = co_await confirm_restart(w);
    if (due == Due::end) break;
    if (due == Due::healed) continue;
    const bool restarted = co_await restart(w, due == Due::restart_live);
    if (!restarted) break;
  }
}

asio::awaitable<bool> ModelWatcher::check(Watched& w) {
  if (!co_await pause(w.interval) || w.run.stop) co_return false;
  auto st = co_await services_.units.status(w.unit);
  if (w.run.stop) co_return false;
  if (!st) {
    // A bus problem says nothing about the server: no restart for it.
    sys::logf(sys::Level::warning, w.f, "watchdog: cannot query {}: {}", w.unit, st.error().message);
    co_return true;
  }
  if (!units::is_up(st->active_state)) {
    w.pending = describe_down(w.unit, *st);
    co_return true;
  }
  if (st->active_state != units::ActiveState::active) co_return true;  // starting or reloading: on its way
  auto& rec = w.rec;
  const auto t0 = Clock::now();
  auto r = co_await probe(w.m);
  if (w.run.stop) co_return false;
  rec.last_probe_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  rec.last_probe_at = util::rfc3339(std::chrono::system_clock::now());
  rec.last_probe_ok = static_cast<bool>(r);
  if (r) {
    if (rec.consecutive_failures > 0)
      sys::logf(sys::Level::notice, w.f, "watchdog: {} answers again after {} failed probe{}", w.unit,
                rec.consecutive_failures, rec.consecutive_failures == 1 ? "" : "s");
    rec.consecutive_failures = 0;
    if (w.streak > 0 && w.last_restart && Clock::now() - *w.last_restart >= options_.healthy_reset) {
      sys::logf(sys::Level::info, w.f, "watchdog: {} stayed healthy for {} after its last restart; backoff reset",
                w.unit, seconds_text(options_.healthy_reset));
      w.streak = 0;
    }
    changed();
    co_return true;
  }
  ++rec.consecutive_failures;
  ++rec.probe_failures;
  sys::logf(sys::Level::warning, w.f, "watchdog: probe {} of {} of {} failed: {}", rec.consecutive_failures, w.k,
            w.unit, r.error().message);
  changed();
  if (rec.consecutive_failures < w.k) co_return true;
  w.pending = fmt::format("{} probe{} in a row failed, the last: {}", rec.consecutive_failures,
                          rec.consecutive_failures == 1 ? "" : "s", r.error().message);
  co_return true;
}

asio::awaitable<ModelWatcher::Due> ModelWatcher::confirm_restart(Watched& w) {
  // Back off first when restarts follow each other.
  const auto delay = watchdog_backoff(w.streak, options_.backoff_base, options_.backoff_max);
  if (delay.count() > 0) {
    set_state(w.rec, "backoff");
    sys::logf(sys::Level::notice, w.f, "watchdog: {} needs a restart ({}); waiting {} first (restart {} in a row)",
              w.unit, *w.pending, seconds_text(delay), w.streak + 1);
    if (!co_await pause(delay) || w.run.stop) co_return Due::end;
  }
  auto st = co_await services_.units.status(w.unit);
  if (w.run.stop) co_return Due::end;
  const bool up = st && units::is_up(st->active_state);
  if (delay.count() > 0 && up && st->active_state == units::ActiveState::active) {
    // Something (an operator, say) brought it back during the backoff: probe before restarting.
    auto r = co_await probe(w.m);
    if (w.run.stop) co_return Due::end;
    if (r) {
      sys::logf(sys::Level::notice, w.f, "watchdog: {} answers again; no restart needed", w.unit);
      w.pending.reset();
      w.rec.consecutive_failures = 0;
      set_state(w.rec, "watching");
      co_return Due::healed;
    }
  }
  if (up) co_return Due::restart_live;
  // Never start a checkpoint whose files changed since their verification.
  auto commit = services_.store.linked_commit(w.model);
  bool trusted = false;
  if (commit) trusted = co_await files_still_trusted(services_, w.model, *commit, w.f, false);
  if (w.run.stop) co_return Due::end;
  if (trusted) co_return Due::restart_down;
  sys::logf(sys::Level::error, w.f,
            "watchdog: {} is down ({}), but the files of model {} {}: not restarting it ({})", w.unit, *w.pending,
            w.model, commit ? "changed since their verification" : "are no longer linked in models_dir",
            commit ? fmt::format("`modelctl verify {}` re-hashes them and, if they are intact, has it "
                                 "watched and restarted again; or deploy it again", w.model)
                   : std::string("deploy it again"));
  co_return Due::end;
}

asio::awaitable<bool> ModelWatcher::restart(Watched& w, bool up) {
  auto& rec = w.rec;
  // Decided before anything is stopped or counted: a restart that would share another service's
  // GPUs or port does not happen (the service is left as it is, and the check comes again).
  auto asked = restart_settings_ ? restart_settings_(w.model) : Result<std::optional<StartedSettings>>();
  if (!asked) {
    if (asked.error().message != w.refused)
      sys::logf(sys::Level::error, w.f, "watchdog: {} ({})", asked.error().message, *w.pending);
    w.refused = asked.error().message;
    co_return true;
  }
  w.refused.clear();
  const std::string reason = *w.pending;
  w.pending.reset();
  ++w.streak;
  ++rec.restarts;
  rec.consecutive_failures = 0;
  rec.last_restart_at = util::rfc3339(std::chrono::system_clock::now());
  rec.last_restart_reason = reason;
  set_state(rec, "restarting");
  {
    sys::Fields rf = w.f;
    rf.message_id = watchdog_restart_message_id;
    rf.extra.emplace_back("MODELD_WATCHDOG_RESTARTS", std::to_string(rec.restarts));
    sys::logf(sys::Level::warning, rf, "watchdog: restarting {} of model {}: {}", w.unit, w.model, reason);
  }
  if (up) {
    if (auto s = co_await services_.units.stop(w.unit); !s)
      sys::logf(sys::Level::error, w.f, "watchdog: cannot stop {}: {}", w.unit, s.error().message);
    else if (auto r = co_await units::wait_inactive(services_.units, w.unit, stop_wait(config::stop_budget(w.m.serve))); !r)
      sys::logf(sys::Level::error, w.f, "watchdog: {}", r.error().message);
    if (w.run.stop) co_return false;
  }
  // Started from today's drop-in (or the one the owner asks for), whose settings are recorded as
  // what the server runs with.
  std::optional<StartedSettings> settings;
  if (auto d = co_await install_dropin(services_, w.m, *asked); d)
    settings = std::move(*d);
  else
    sys::logf(sys::Level::error, w.f, "watchdog: cannot rewrite the drop-in of {}: {}", w.unit, d.error().message);
  if (w.run.stop) co_return false;
  if (auto s = co_await units::reset_failed_and_start(services_.units, w.unit); !s) {
    if (w.run.stop) co_return false;
    w.pending = fmt::format("cannot start {}: {}", w.unit, s.error().message);
    sys::logf(sys::Level::error, w.f, "watchdog: {}", *w.pending);
    co_return true;
  }
  if (on_started_) on_started_(w.model, settings);
  auto r = co_await ready(w.m, w.f);
  if (w.run.stop) co_return false;
  if (!r) {
    w.pending = fmt::format("{} is not ready after the restart: {}", w.unit, r.error().message);
    sys::logf(sys::Level::error, w.f, "watchdog: {}", *w.pending);
    co_return true;
  }
  w.last_restart = Clock::now();
  sys::logf(sys::Level::notice, w.f, "watchdog: {} serves again after restart {} ({} in a row)", w.unit, rec.restarts,
            w.streak);
  set_state(rec, "watching");
  co_return true;
}

}  // namespace modeld::deploy
