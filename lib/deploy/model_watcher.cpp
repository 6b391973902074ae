#include "deploy/model_watcher.hpp"

#include "health/health.hpp"
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
  if (d < std::chrono::seconds(10)) return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
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
  if (on_change_) on_change_();
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
                 asio::bind_cancellation_slot(run->signal.slot(), [this, run](std::exception_ptr e) {
                   if (e) {
                     try {
                       std::rethrow_exception(e);
                     } catch (const boost::system::system_error& ex) {
                       if (ex.code() != asio::error::operation_aborted)
                         sys::logf(sys::Level::error, "watchdog ended with an error: {}", ex.what());
                     } catch (const std::exception& ex) {
                       sys::logf(sys::Level::error, "watchdog ended with an exception: {}", ex.what());
                     }
                   }
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
  co_return co_await wait_model_ready(services_, m, f);
}

asio::awaitable<Result<void>> ModelWatcher::probe(const config::ModelConfig& m) {
  if (options_.probe) co_return co_await options_.probe(m);
  co_return co_await default_probe(services_, m);
}

asio::awaitable<void> ModelWatcher::watch(std::string model, bool wait_ready_first, std::shared_ptr<WatchRun> run) {
  const auto* found = services_.config->find_model(model);
  if (!found) co_return;
  const config::ModelConfig m = *found;  // the configuration may be replaced meanwhile
  const auto unit = units::serve_unit(model);
  sys::Fields f;
  f.model = model;
  f.extra.emplace_back("MODELD_UNIT", unit);
  const unsigned k = std::max(1u, m.health.watch_failures);
  const milliseconds interval = std::max<milliseconds>(m.health.watch_interval, milliseconds(100));
  auto& rec = record(model);
  rec.consecutive_failures = 0;

  auto set_state = [this, &rec](const char* state) {
    rec.state = state;
    changed();
  };

  unsigned streak = 0;                   // restarts in the current run of restarts
  std::optional<Clock::time_point> last_restart;  // when the last restart became ready
  std::optional<std::string> pending;   // why a restart is due now

  if (wait_ready_first) {
    auto r = co_await ready(m, f);
    if (run->stop) co_return;
    if (!r) pending = fmt::format("{} is not ready after the daemon started it: {}", unit, r.error().message);
  }
  set_state("watching");
  sys::logf(sys::Level::info, f, "watchdog: watching {} every {}, restarting it when it leaves the active state or "
            "after {} failed probe{} in a row", unit, seconds_text(interval), k, k == 1 ? "" : "s");

  for (;;) {
    if (!pending) {
      if (!co_await pause(interval) || run->stop) break;
      auto st = co_await services_.units.status(unit);
      if (run->stop) break;
      if (!st) {
        // A bus problem says nothing about the server: no restart for it.
        sys::logf(sys::Level::warning, f, "watchdog: cannot query {}: {}", unit, st.error().message);
        continue;
      }
      if (!units::is_up(st->active_state)) {
        pending = describe_down(unit, *st);
      } else if (st->active_state != units::ActiveState::active) {
        continue;  // starting or reloading: on its way
      } else {
        const auto t0 = Clock::now();
        auto r = co_await probe(m);
        if (run->stop) break;
        rec.last_probe_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        rec.last_probe_at = util::rfc3339(std::chrono::system_clock::now());
        rec.last_probe_ok = static_cast<bool>(r);
        if (r) {
          if (rec.consecutive_failures > 0)
            sys::logf(sys::Level::notice, f, "watchdog: {} answers again after {} failed probe{}", unit,
                      rec.consecutive_failures, rec.consecutive_failures == 1 ? "" : "s");
          rec.consecutive_failures = 0;
          if (streak > 0 && last_restart && Clock::now() - *last_restart >= options_.healthy_reset) {
            sys::logf(sys::Level::info, f, "watchdog: {} stayed healthy for {} after its last restart; backoff reset",
                      unit, seconds_text(options_.healthy_reset));
            streak = 0;
          }
          changed();
          continue;
        }
        ++rec.consecutive_failures;
        ++rec.probe_failures;
        sys::logf(sys::Level::warning, f, "watchdog: probe {} of {} of {} failed: {}", rec.consecutive_failures, k,
                  unit, r.error().message);
        changed();
        if (rec.consecutive_failures < k) continue;
        pending = fmt::format("{} probe{} in a row failed, the last: {}", rec.consecutive_failures,
                              rec.consecutive_failures == 1 ? "" : "s", r.error().message);
      }
    }

    // A restart is due. Back off first when restarts follow each other.
    const auto delay = watchdog_backoff(streak, options_.backoff_base, options_.backoff_max);
    if (delay.count() > 0) {
      set_state("backoff");
      sys::logf(sys::Level::notice, f, "watchdog: {} needs a restart ({}); waiting {} first (restart {} in a row)",
                unit, *pending, seconds_text(delay), streak + 1);
      if (!co_await pause(delay) || run->stop) break;
    }
    auto st = co_await services_.units.status(unit);
    if (run->stop) break;
    const bool up = st && units::is_up(st->active_state);
    if (delay.count() > 0 && up && st->active_state == units::ActiveState::active) {
      // Something (an operator, say) brought it back during the backoff: probe before restarting.
      auto r = co_await probe(m);
      if (run->stop) break;
      if (r) {
        sys::logf(sys::Level::notice, f, "watchdog: {} answers again; no restart needed", unit);
        pending.reset();
        rec.consecutive_failures = 0;
        set_state("watching");
        continue;
      }
    }
    if (!up) {
      // Never start a checkpoint whose files changed since their verification.
      auto commit = services_.store.linked_commit(model);
      bool trusted = false;
      if (commit) trusted = co_await files_still_trusted(services_, model, *commit, f, false);
      if (run->stop) break;
      if (!trusted) {
        sys::logf(sys::Level::error, f,
                  "watchdog: {} is down ({}), but the files of model {} {}: not restarting it ({})", unit, *pending,
                  model, commit ? "changed since their verification" : "are no longer linked in models_dir",
                  commit ? fmt::format("`modelctl verify {}` re-hashes them and, if they are intact, has it "
                                       "watched and restarted again; or deploy it again", model)
                         : std::string("deploy it again"));
        break;
      }
    }

    const std::string reason = *pending;
    pending.reset();
    ++streak;
    ++rec.restarts;
    rec.consecutive_failures = 0;
    rec.last_restart_at = util::rfc3339(std::chrono::system_clock::now());
    rec.last_restart_reason = reason;
    set_state("restarting");
    {
      sys::Fields rf = f;
      rf.message_id = watchdog_restart_message_id;
      rf.extra.emplace_back("MODELD_WATCHDOG_RESTARTS", std::to_string(rec.restarts));
      sys::logf(sys::Level::warning, rf, "watchdog: restarting {} of model {}: {}", unit, model, reason);
    }
    if (up) {
      if (auto s = co_await services_.units.stop(unit); !s)
        sys::logf(sys::Level::error, f, "watchdog: cannot stop {}: {}", unit, s.error().message);
      else if (auto w = co_await units::wait_inactive(services_.units, unit, stop_wait(m.serve.stop_timeout)); !w)
        sys::logf(sys::Level::error, f, "watchdog: {}", w.error().message);
      if (run->stop) break;
    }
    if (auto s = co_await units::reset_failed_and_start(services_.units, unit); !s) {
      if (run->stop) break;
      pending = fmt::format("cannot start {}: {}", unit, s.error().message);
      sys::logf(sys::Level::error, f, "watchdog: {}", *pending);
      continue;
    }
    auto r = co_await ready(m, f);
    if (run->stop) break;
    if (!r) {
      pending = fmt::format("{} is not ready after the restart: {}", unit, r.error().message);
      sys::logf(sys::Level::error, f, "watchdog: {}", *pending);
      continue;
    }
    last_restart = Clock::now();
    sys::logf(sys::Level::notice, f, "watchdog: {} serves again after restart {} ({} in a row)", unit, rec.restarts,
              streak);
    set_state("watching");
  }
}

}  // namespace modeld::deploy
