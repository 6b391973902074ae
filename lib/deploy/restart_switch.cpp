// The restart switch strategy (switch_strategy.hpp), today's only one: stop the old service,
// start the new one, wait for its readiness, or roll back (stop the new one, restart the old
// ones). Its rows apply the marks of the outage their phases return and compute the switch
// report from them (DEPLOYMENT.switch). It always applies and falls back to nothing.
#include "deploy/phase_table.hpp"
#include "deploy/record_run.hpp"
#include "deploy/switch_strategy.hpp"

#include "deploy/health_check.hpp"
#include "deploy/launch.hpp"
#include "deploy/rollback.hpp"
#include "deploy/stop_old.hpp"
#include "util/text.hpp"
#include "wire/switch_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <chrono>

namespace modeld::deploy {

namespace asio = boost::asio;

namespace {

// A service was asked to start at `start_requested_ns` and, with `ready`, was ready: the switch's
// marks recorded and persisted; once ready, its report computed and its journal line written.
asio::awaitable<void> apply_started(RecordRun& r, std::int64_t start_requested_ns,
                                    const std::optional<Readiness>& ready) {
  auto& d = r.record();
  auto& marks = d.switch_marks;
  marks.start_requested_ns = start_requested_ns;
  marks.port_ns = ready ? ready->port_ns : 0;
  marks.ready_ns = ready ? ready->ready_ns : 0;
  d.switch_report = switch_report_of(marks);
  if (d.switch_report) {
    const auto& w = *d.switch_report;
    sys::Fields f = r.fields();
    auto field = [&](const char* name, double v) { f.extra.emplace_back(name, fmt::format("{:.3f}", v)); };
    field("MODELD_DOWNTIME_S", w.downtime_s);
    field("MODELD_STOP_S", w.stop_s);
    field("MODELD_LAUNCH_S", w.launch_s);
    field("MODELD_LOAD_S", w.start_to_port_s);
    field("MODELD_READINESS_S", w.port_to_ready_s);
    sys::logf(sys::Level::notice, f, "switch {}",
              wire::describe_switch(w.downtime_s, w.stop_s, w.launch_s, w.start_to_port_s, w.port_to_ready_s));
  }
  co_await r.persist();
}

asio::awaitable<Result<void>> stopping_old(RecordRun& r) {
  if (auto taken = r.switch_conflict()) co_return *taken;
  auto body = run_stopping_old(r.phase_services(), r.run(), r);
  auto stopped = co_await r.in_child(body);
  if (!stopped) co_return stopped.error();
  // Kept from before a restart: a stop found done again is not when it was done.
  auto& marks = r.record().switch_marks;
  if (stopped->stop_done_ns && !marks.stop_done_ns) marks.stop_done_ns = stopped->stop_done_ns;
  co_await r.persist();
  co_return Result<void>{};
}

asio::awaitable<Result<void>> launching(RecordRun& r) {
  if (auto taken = r.switch_conflict()) co_return *taken;
  auto body = run_launching(r.phase_services(), r.run());
  auto launched = co_await r.in_child(body);
  if (!launched) co_return launched.error();
  if (const auto resident = launched->bytes_resident_at_launch) {
    auto& d = r.record();
    if (!d.warm) d.warm = WarmReport{};
    d.warm->bytes_resident_at_launch = resident;
    co_await r.persist();
  }
  const std::optional<Readiness> not_yet;
  co_await apply_started(r, launched->start_requested_ns, not_yet);
  co_return Result<void>{};
}

// The new model serves: recorded in the daemon's state (before cleanup and the benchmark), saved.
asio::awaitable<void> apply_healthy(RecordRun& r) {
  const auto& d = r.record();
  auto& state = r.sink().state();
  auto now = util::rfc3339(std::chrono::system_clock::now());
  // The services it stopped are out of service now; every other one serves on beside it.
  for (const auto& a : d.previous) {
    state.last_active[a.model] = now;
    state.active.erase(a.model);
  }
  // What launching's drop-in holds: rendered from the same configuration by the same code.
  state.active.put(ActiveRecord{d.model, *d.commit, now, started_settings(r.phase_services(), r.run().model)});
  state.last_active[d.model] = now;
  forget_pulled(state.pulled, d.model, *d.commit);  // deployed: the revision in service needs no mark
  r.set_new_serves();
  co_await r.save_state();
}

asio::awaitable<Result<void>> health_checking(RecordRun& r) {
  auto body = run_health_checking(r.phase_services(), r.run());
  auto ready = co_await r.in_child(body);
  if (!ready) co_return ready.error();
  const std::optional<Readiness> seen = *ready;
  co_await apply_started(r, r.record().switch_marks.start_requested_ns, seen);
  if (!r.record().cancel_requested) co_await apply_healthy(r);
  co_return Result<void>{};
}

// The end a rollback that ran gives the record: rolled_back when every old service serves again,
// else failed naming those that did not come back (not watched any more).
asio::awaitable<void> end_rolled_back(RecordRun& r, const Restored& res, const std::string& first_reason) {
  const auto& d = r.record();
  const auto& back = res.restored;
  const std::string serve_again =
      back.empty() ? std::string()
                   : fmt::format("{} serve{} again", fmt::join(back, ", "), back.size() == 1 ? "s" : "");
  if (res.failed.size() == 1 && back.empty()) {
    r.not_restored().insert(res.failed.front().first);
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, res.failed.front().second));
    co_await r.finish(State::failed, failed);
    co_return;
  }
  if (!res.failed.empty()) {
    std::vector<std::string> failures;
    for (const auto& [model, why] : res.failed) {
      r.not_restored().insert(model);
      failures.push_back(fmt::format("{}: {}", model, why));
    }
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed for {}{}", first_reason, fmt::join(failures, "; "),
                                           serve_again.empty() ? std::string() : "; " + serve_again));
    co_await r.finish(State::failed, failed);
    co_return;
  }
  const std::optional<Error> rolled_back =
      Error{d.error ? d.error->code : Errc::internal, fmt::format("{}; rolled back: {}", first_reason, serve_again)};
  co_await r.finish(State::rolled_back, rolled_back);
}

// rolling_back, entered already and not cancellable (leaving the host with nothing serving is
// worse): always ends the record.
asio::awaitable<Result<void>> rolling_back(RecordRun& r) {
  auto body = run_rolling_back(r.phase_services(), r.run());
  auto res = co_await r.in_child(body, false);
  // The outage lasts until the old models serve again.
  if (res && res->readiness.ready_ns) {
    const std::optional<Readiness> back = res->readiness;
    co_await apply_started(r, res->launched.start_requested_ns, back);
  }
  const auto& d = r.record();
  const std::string first_reason = d.error ? d.error->message : "interrupted by a daemon restart";
  if (res) {
    co_await end_rolled_back(r, *res, first_reason);
    co_return Result<void>{};
  }
  r.not_restored() = models_of(d.previous);
  const bool bug = res.error().code == Errc::internal;
  std::string why = bug ? "an internal error" : res.error().message;
  const std::optional<Error> failed =
      make_error(Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, why));
  co_await r.finish(State::failed, failed);
  co_return Result<void>{};
}

// Stopping is idempotent ("nothing to stop" once inactive), and a stop cut short by the restart
// must finish before the new server may take the port and the GPUs. (With stopping_old first,
// planning comes before it and re-reads what the later steps need.) A stop always continues here.
bool old_stop_begun(const Deployment& d) { return d.kind == Kind::stop || (d.old_stopped && !d.downtime_first); }

// A record interrupted while rolling back rolls back again (a stop never rolls back).
bool was_rolling_back(const Deployment& d) { return d.kind != Kind::stop && d.phase == Phase::rolling_back; }

constexpr std::array rows{
    PhaseRow{Step::stopping_old, Phase::stopping_old, "stopping_old", "stopping the old model for", true, true,
             stopping_old, old_stop_begun},
    PhaseRow{Step::launching, Phase::launching, "launching", "launching", true, true, launching, nullptr},
    PhaseRow{Step::health_checking, Phase::health_checking, "health_checking", "waiting for readiness of", true, true,
             health_checking, nullptr},
    PhaseRow{Step::rolling_back, Phase::rolling_back, "rolling_back", "rolling back", true, true, rolling_back,
             was_rolling_back},
};

std::span<const PhaseRow> rows_of_restart() { return rows; }

SwitchVerdict always_applies(const SwitchQuery& q) {
  return {true, q.model.serve.switch_setting == "restart" ? "serve.switch is \"restart\"" : "restart always applies"};
}

// With downtime_first the old service stops right after planning, so warming runs while nothing serves.
SwitchSteps restart_steps(bool downtime_first) {
  if (downtime_first) return {{Step::stopping_old}, {Step::launching, Step::health_checking}};
  return {{}, {Step::stopping_old, Step::launching, Step::health_checking}};
}

// stopping_old's durable decision (Decisions::stopping_old): from here on the old service may be down.
bool old_stop_decided(const Deployment& d) { return d.old_stopped; }

constexpr SwitchStrategy restart{"restart", "restart", always_applies, restart_steps, rows_of_restart,
                                 Step::rolling_back, old_stop_decided, ""};

}  // namespace

const SwitchStrategy& restart_switch() { return restart; }

}  // namespace modeld::deploy
