// stopping_old: stop the model that serves now and wait until nothing of it is left: the unit
// inactive, its control group empty, its port and the new model's port no longer listened on.
// A leftover at the deadline fails the phase naming it, so the new server never starts on top.
#include "deploy/stop_old.hpp"
#include "deploy/launch.hpp"

#include "deploy/gpu_watch.hpp"
#include "deploy/leftovers.hpp"
#include "deploy/preflight.hpp"
#include "units/service_manager.hpp"
#include "util/files.hpp"
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

// One service stopping_old stops: its unit, how long it may take to stop, the port it serves on.
struct OldService {
  std::string model;
  std::string unit;
  std::chrono::milliseconds stop_timeout{std::chrono::minutes(5)};
  std::uint16_t port = 0;
};

// The services of the run's record to stop, with their stop_timeout from the configuration the
// run started with and the port each was started on.
std::vector<OldService> old_services(const Services& s, const Run& run) {
  std::vector<OldService> out;
  for (const auto& a : run.record.previous) {
    const auto* cfg = s.config->find_model(a.model);
    OldService o{a.model, units::serve_unit(a.model)};
    if (cfg) o.stop_timeout = config::stop_budget(cfg->serve);
    o.port = placement_of(a, cfg).port;
    out.push_back(std::move(o));
  }
  return out;
}

// What is still there of stopped services; empty() when nothing is.
struct Leftovers {
  std::vector<std::pair<std::string, std::vector<ProcessRef>>> in_cgroup;  ///< unit -> its processes
  std::vector<std::pair<std::uint16_t, PortUse>> ports;
  bool empty() const { return in_cgroup.empty() && ports.empty(); }
  std::string describe() const {
    std::vector<std::string> parts;
    for (const auto& [unit, procs] : in_cgroup)
      parts.push_back(fmt::format("{} still in the control group of {}", describe_processes(procs), unit));
    for (const auto& [port, use] : ports)
      parts.push_back(fmt::format("port {} still listened on by {}", port,
                                  use.holders.empty() ? "a process modeld cannot see" : describe_processes(use.holders)));
    return fmt::format("{}", fmt::join(parts, "; "));
  }
};

// What is left of the stopped services `olds`: processes in their control groups, and listeners
// of `ports` other than the new model's own service (running already when a restarted daemon
// continues).
asio::awaitable<Result<Leftovers>> find_leftovers(Services& s, const std::vector<OldService>& olds,
                                                  const std::string& new_unit, const std::set<std::uint16_t>& ports) {
  Leftovers out;
  bool new_is_old = false;
  for (const auto& o : olds) {
    new_is_old = new_is_old || o.unit == new_unit;
    const auto pids = co_await pids_or_none(s.units, o.unit);
    std::vector<ProcessRef> procs;
    for (auto pid : pids) procs.push_back({pid, util::process_name(pid)});
    if (!procs.empty()) out.in_cgroup.emplace_back(o.unit, std::move(procs));
  }
  std::set<std::uint32_t> ours;
  if (!new_is_old) ours = co_await pids_or_none(s.units, new_unit);
  for (auto port : ports)
    if (auto use = other_listeners(port, ours, !ours.empty())) out.ports.emplace_back(port, std::move(*use));
  co_return out;
}

// Polls until nothing of the stopped services is left (control groups, `ports`), noting what is
// left every 10 s; stop_timeout at `deadline`, cancelled on cancel.
asio::awaitable<Result<void>> wait_nothing_left(Services& s, const Run& run, const std::vector<OldService>& olds,
                                                const std::set<std::uint16_t>& ports,
                                                std::chrono::steady_clock::time_point t0,
                                                std::chrono::steady_clock::time_point deadline) {
  auto last_note = std::chrono::steady_clock::now();
  Result<Leftovers> left = make_error(Errc::internal, "not looked at");
  auto end = co_await util::poll_until(deadline, std::chrono::milliseconds(200), [&]() -> asio::awaitable<bool> {
    left = co_await find_leftovers(s, olds, units::serve_unit(run.model.name), ports);
    if (!left || left->empty()) co_return true;
    if (const auto now = std::chrono::steady_clock::now(); now - last_note >= std::chrono::seconds(10)) {
      sys::logf(sys::Level::notice, run.fields(), "waiting for what the stopped services left: {}", left->describe());
      last_note = now;
    }
    co_return false;
  });
  if (end == util::PollEnd::cancelled) co_return make_error(Errc::cancelled, "cancelled while waiting for the stop");
  if (!left) co_return left.error();
  if (end == util::PollEnd::deadline)
    co_return make_error(Errc::stop_timeout,
                         fmt::format("{} stopped but {} after {}: not starting model {} on top of it",
                                     olds.size() == 1 ? olds.front().unit + " is" : std::string("the services are"),
                                     left->describe(),
                                     util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(
                                         std::chrono::steady_clock::now() - t0)),
                                     run.model.name));
  co_return Result<void>{};
}

// StopUnit of every service in `olds` that is not stopped already, then the wait until each
// unit is inactive (they stop side by side).
asio::awaitable<Result<void>> stop_units(Services& s, const Run& run, const std::vector<OldService>& olds) {
  std::vector<const OldService*> asked;
  for (const auto& o : olds) {
    auto st = co_await s.units.status(o.unit);
    if (st && units::is_stopped(st->active_state)) {
      sys::logf(sys::Level::info, run.fields(), "nothing to stop: {} is already {}", o.unit,
                units::to_string(st->active_state));
      continue;
    }
    sys::logf(sys::Level::info, run.fields(), "stopping {} (model {}), waiting up to {}", o.unit, o.model,
              util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(o.stop_timeout)));
    if (auto r = co_await s.units.stop(o.unit); !r) co_return r.error();
    asked.push_back(&o);
  }
  for (const auto* o : asked)
    if (auto r = co_await units::wait_inactive(s.units, o->unit, stop_wait(o->stop_timeout)); !r) co_return r.error();
  co_return Result<void>{};
}

// The GPU sets of the services that keep serving: their GPUs are neither waited for nor re-measured.
std::vector<config::GpuSet> busy_gpus(const Run& run) {
  std::vector<config::GpuSet> out;
  for (const auto& p : run.staying) out.push_back(p.gpu_ids);
  return out;
}

// Nothing is to be stopped (the pre-flight checked the port): the baseline measured on the GPUs
// no service uses.
asio::awaitable<Result<Stopped>> nothing_to_stop(Services& s, const Run& run) {
  sys::logf(sys::Level::info, run.fields(), "nothing to stop: no model in service conflicts with {}", run.model.name);
  const config::GpuSet none = std::vector<unsigned>{};
  const auto busy = busy_gpus(run);
  if (auto r = co_await wait_gpu_memory_back(s, run, std::chrono::steady_clock::now(), false, none, busy); !r)
    co_return r.error();
  co_return Stopped{};
}

}  // namespace

boost::asio::awaitable<Result<Stopped>> run_stopping_old(Services& s, const Run& run, Decisions& decisions) {
  const bool take_out = run.record.kind == Kind::stop;
  const auto olds = old_services(s, run);
  // What can fail on the new revision's files fails here, while the old models still serve
  // (with downtime_first nothing is downloaded yet, and the old models are to go anyway).
  const auto refusing = olds.empty() ? std::string("not launching") : fmt::format("not stopping {}", olds.front().model);
  if (!run.record.downtime_first && !take_out)
    if (auto r = co_await check_still_verified(s, run, refusing); !r) co_return r.error();
  // The pre-flight again, right before the stop: what changed since planning (a program deleted,
  // a port taken during a download of hours) fails here while the old models still serve.
  if (!take_out)
    if (auto r = co_await preflight_of_run(s, run, refusing); !r) co_return r.error();
  if (olds.empty()) co_return co_await nothing_to_stop(s, run);
  // From the moment StopUnit may be sent, the old models may be down: any failure or cancel from
  // here on must bring them back, so this is recorded durably before the stop.
  co_await decisions.stopping_old();
  test_hooks::crash_point("old_stopped_recorded");

  std::set<std::uint16_t> ports{run.model.serve.port};
  auto longest = olds.front().stop_timeout;
  for (const auto& o : olds) {
    if (o.port) ports.insert(o.port);
    longest = std::max(longest, o.stop_timeout);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (auto r = co_await stop_units(s, run, olds); !r) co_return r.error();
  // systemd calls a unit inactive once its main process and control group are gone, but a
  // process that left the cgroup, or a port released late, must not meet the new server.
  const auto deadline = t0 + stop_wait(longest);
  if (auto r = co_await wait_nothing_left(s, run, olds, ports, t0, deadline); !r) co_return r.error();
  const Stopped stopped{wall_clock_ns()};
  std::vector<std::string> names;
  for (const auto& o : olds) names.push_back(o.unit);
  sys::logf(sys::Level::info, run.fields(), "{} stopped: control group{} empty and port{} {} free", fmt::join(names, ", "),
            names.size() > 1 ? "s" : "", ports.size() > 1 ? "s" : "", fmt::join(ports, ", "));
  // A daemon restarted during launching or health_checking finds the new server running: its GPU
  // memory is not the old one's, and no baseline can be measured under it.
  const auto new_unit = units::serve_unit(run.model.name);
  if (!take_out && std::none_of(olds.begin(), olds.end(), [&](const OldService& o) { return o.unit == new_unit; })) {
    const auto running = co_await pids_or_none(s.units, new_unit);
    if (!running.empty()) {
      sys::logf(sys::Level::info, run.fields(), "{} runs already (a restarted daemon continues): not waiting for GPU "
                "memory", new_unit);
      co_return stopped;
    }
  }
  // Workers that outlive their parent keep GPU memory until they exit (gpu-facts.md): only the
  // GPUs of the stopped services are waited for; those of services still serving never delay it.
  std::vector<Placement> freed;
  for (const auto& a : run.record.previous) freed.push_back(placement_of(a, s.config->find_model(a.model)));
  const auto freed_gpus = gpus_of(freed);
  const auto busy = busy_gpus(run);
  if (auto r = co_await wait_gpu_memory_back(s, run, deadline, true, freed_gpus, busy); !r) co_return r.error();
  co_return stopped;
}

}  // namespace modeld::deploy
