// stopping_old: stop the model that serves now and wait until nothing of it is left: the unit
// inactive, its control group empty, its port and the new model's port no longer listened on.
// A leftover at the deadline fails the phase naming it, so the new server never starts on top.
#include "deploy/phases.hpp"

#include "deploy/gpu_watch.hpp"
#include "deploy/leftovers.hpp"
#include "units/service_manager.hpp"
#include "util/poll.hpp"
#include "util/quantities.hpp"
#include "util/test_hooks.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>

namespace modeld::deploy {

namespace asio = boost::asio;

std::chrono::milliseconds stop_wait(std::chrono::milliseconds stop_timeout) {
  return stop_timeout + std::chrono::seconds(15);
}

namespace {

// What is still there of a stopped service; empty() when nothing is.
struct Leftovers {
  std::vector<ProcessRef> in_cgroup;
  std::vector<std::pair<std::uint16_t, PortUse>> ports;
  bool empty() const { return in_cgroup.empty() && ports.empty(); }
  std::string describe(const std::string& unit) const {
    std::vector<std::string> parts;
    if (!in_cgroup.empty())
      parts.push_back(fmt::format("{} still in the control group of {}", describe_processes(in_cgroup), unit));
    for (const auto& [port, use] : ports)
      parts.push_back(fmt::format("port {} still listened on by {}", port,
                                  use.holders.empty() ? "a process modeld cannot see" : describe_processes(use.holders)));
    return fmt::format("{}", fmt::join(parts, "; "));
  }
};

// The processes of `unit`'s control group; none (with a warning) when systemd cannot list them,
// since the unit state and the ports are checked besides and a transient bus error must not cost
// the host its model.
asio::awaitable<Result<std::set<std::uint32_t>>> pids_of(Services& s, const std::string& unit) {
  auto pids = co_await s.units.pids(unit);
  if (!pids) {
    sys::logf(sys::Level::warning, "cannot list the processes of {}: {}; counting none", unit, pids.error().message);
    co_return std::set<std::uint32_t>{};
  }
  co_return std::set<std::uint32_t>(pids->begin(), pids->end());
}

// Listeners of `port` other than the processes in `ours`; nullopt when there are none. A
// listener whose holder modeld cannot see (another PID namespace) counts unless it `may_be_ours`.
std::optional<PortUse> other_listeners(std::uint16_t port, const std::set<std::uint32_t>& ours, bool may_be_ours) {
  auto use = port_use(port);
  if (!use.listening) return std::nullopt;
  if (use.holders.empty()) return may_be_ours ? std::nullopt : std::optional<PortUse>(use);
  std::erase_if(use.holders, [&](const ProcessRef& p) { return ours.contains(p.pid); });
  if (use.holders.empty()) return std::nullopt;
  return use;
}

// What is left of the stopped `unit`: processes in its control group, and listeners of `ports`
// other than the new model's own service (running already when a restarted daemon continues).
asio::awaitable<Result<Leftovers>> find_leftovers(Services& s, const std::string& unit, const std::string& new_unit,
                                                  const std::set<std::uint16_t>& ports) {
  Leftovers out;
  auto pids = co_await pids_of(s, unit);
  if (!pids) co_return pids.error();
  for (auto pid : *pids) out.in_cgroup.push_back({pid, process_name(pid)});
  std::set<std::uint32_t> ours;
  if (new_unit != unit) {
    auto n = co_await pids_of(s, new_unit);
    if (!n) co_return n.error();
    ours = std::move(*n);
  }
  for (auto port : ports)
    if (auto use = other_listeners(port, ours, !ours.empty())) out.ports.emplace_back(port, std::move(*use));
  co_return out;
}

// The new model's port held by a process that is neither the old model's service nor the new
// model's own: stopping the old model would not free it, so the host would lose its model for
// nothing.
asio::awaitable<Result<void>> refuse_foreign_port_holder(Services& s, const Run& run, const std::string& old_unit,
                                                         std::uint16_t old_port) {
  const auto port = run.model.serve.port;
  auto ours = co_await pids_of(s, units::serve_unit(run.model.name));
  if (!ours) co_return ours.error();
  // A holder modeld cannot see may be the new model's own service, or the old one serving there.
  bool may_be_ours = !ours->empty();
  if (!old_unit.empty()) {
    auto old = co_await pids_of(s, old_unit);
    if (!old) co_return old.error();
    may_be_ours = may_be_ours || (!old->empty() && old_port == port);
    ours->insert(old->begin(), old->end());
  }
  const auto others = other_listeners(port, *ours, may_be_ours);
  if (!others) co_return Result<void>{};
  co_return make_error(
      Errc::unit_failed,
      fmt::format("port {} that model {} is to serve on is held by {}, which is not a model service of modeld: {}",
                  port, run.model.name,
                  others->holders.empty() ? "a process modeld cannot see" : describe_processes(others->holders),
                  old_unit.empty() ? "stop it or change serve.port" : "not stopping the model that serves"));
}

// Polls until nothing of the stopped `unit` is left (control group, `ports`), noting what is
// left every 10 s; stop_timeout at `deadline`, cancelled on cancel.
asio::awaitable<Result<void>> wait_nothing_left(Services& s, const Run& run, const std::string& unit,
                                                const std::set<std::uint16_t>& ports,
                                                std::chrono::steady_clock::time_point t0,
                                                std::chrono::steady_clock::time_point deadline) {
  auto last_note = std::chrono::steady_clock::now();
  Result<Leftovers> left = make_error(Errc::internal, unit + ": not looked at");
  auto end = co_await util::poll_until(deadline, std::chrono::milliseconds(200), [&]() -> asio::awaitable<bool> {
    left = co_await find_leftovers(s, unit, units::serve_unit(run.model.name), ports);
    if (!left || left->empty()) co_return true;
    if (const auto now = std::chrono::steady_clock::now(); now - last_note >= std::chrono::seconds(10)) {
      sys::logf(sys::Level::notice, run.fields(), "waiting for what {} left: {}", unit, left->describe(unit));
      last_note = now;
    }
    co_return false;
  });
  if (end == util::PollEnd::cancelled)
    co_return make_error(Errc::cancelled, fmt::format("{}: cancelled while waiting for it to stop", unit));
  if (!left) co_return left.error();
  if (end == util::PollEnd::deadline)
    co_return make_error(Errc::stop_timeout,
                         fmt::format("{} is stopped but {} after {}: not starting model {} on top of it", unit,
                                     left->describe(unit),
                                     util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(
                                         std::chrono::steady_clock::now() - t0)),
                                     run.model.name));
  co_return Result<void>{};
}

}  // namespace

boost::asio::awaitable<Result<Stopped>> run_stopping_old(Services& s, const Run& run, Decisions& decisions) {
  // What can fail on the new revision's files fails here, while the old model still serves
  // (with downtime_first nothing is downloaded yet, and the old model is to go anyway).
  if (!run.record.downtime_first) {
    const auto refusing = run.previous ? fmt::format("not stopping {}", run.previous->model) : std::string("not launching");
    if (auto r = co_await check_still_verified(s, run, refusing); !r) co_return r.error();
  }
  if (!run.previous) {
    if (auto r = co_await refuse_foreign_port_holder(s, run, "", 0); !r) co_return r.error();
    sys::logf(sys::Level::info, run.fields(), "nothing to stop: no model is active");
    if (auto r = co_await wait_gpu_memory_back(s, run, std::chrono::steady_clock::now(), false); !r) co_return r.error();
    co_return Stopped{};
  }
  const auto unit = units::serve_unit(run.previous->model);
  const auto* old_cfg = s.config->find_model(run.previous->model);
  const auto timeout = old_cfg ? old_cfg->serve.stop_timeout : std::chrono::milliseconds(std::chrono::minutes(5));
  const std::uint16_t old_port = old_cfg ? old_cfg->serve.port : 0;
  if (auto r = co_await refuse_foreign_port_holder(s, run, unit, old_port); !r) co_return r.error();
  // From the moment StopUnit may be sent, the old model may be down: any failure or cancel from
  // here on must bring it back, so this is recorded durably before the stop.
  co_await decisions.stopping_old();
  test_hooks::crash_point("old_stopped_recorded");

  std::set<std::uint16_t> ports{run.model.serve.port};
  if (old_port) ports.insert(old_port);
  const auto t0 = std::chrono::steady_clock::now();
  auto st = co_await s.units.status(unit);
  if (st && units::is_stopped(st->active_state)) {
    sys::logf(sys::Level::info, run.fields(), "nothing to stop: {} is already {}", unit,
              units::to_string(st->active_state));
  } else {
    sys::logf(sys::Level::info, run.fields(), "stopping {} (model {}), waiting up to {}", unit, run.previous->model,
              util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(timeout)));
    if (auto r = co_await s.units.stop(unit); !r) co_return r.error();
    if (auto r = co_await units::wait_inactive(s.units, unit, stop_wait(timeout)); !r) co_return r.error();
  }

  // systemd calls the unit inactive once its main process and control group are gone, but a
  // process that left the cgroup, or a port released late, must not meet the new server.
  const auto deadline = t0 + stop_wait(timeout);
  if (auto r = co_await wait_nothing_left(s, run, unit, ports, t0, deadline); !r) co_return r.error();
  const Stopped stopped{wall_clock_ns()};
  sys::logf(sys::Level::info, run.fields(), "{} stopped: its control group is empty and port{} {} free", unit,
            ports.size() > 1 ? "s" : "", fmt::join(ports, ", "));
  // A daemon restarted during launching or health_checking finds the new server running: its GPU
  // memory is not the old one's, and no baseline can be measured under it.
  const auto new_unit = units::serve_unit(run.model.name);
  if (new_unit != unit) {
    auto running = co_await pids_of(s, new_unit);
    if (!running) co_return running.error();
    if (!running->empty()) {
      sys::logf(sys::Level::info, run.fields(), "{} runs already (a restarted daemon continues): not waiting for GPU "
                "memory", new_unit);
      co_return stopped;
    }
  }
  // Workers that outlive their parent keep GPU memory until they exit (gpu-facts.md).
  if (auto r = co_await wait_gpu_memory_back(s, run, deadline, true); !r) co_return r.error();
  co_return stopped;
}

}  // namespace modeld::deploy
