// Drives the systemd backend of units::ServiceManager against a real systemd and prints what it
// saw as one JSON object on stdout; tests/integration/test_units_systemd.py runs it inside a
// namespaced systemd (nsenter) and checks the result. It also logs one line through the journal
// sink so that the test can check the structured fields journald stored.
//
// usage: units_driver UNIT_DIR MODEL
//        units_driver --log MESSAGE   (logs MESSAGE once with Sink::automatic, model "x")

#include "sys/log.hpp"
#include "units/service_manager.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string_view>

namespace asio = boost::asio;
using namespace modeld;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

json outcome(const Result<void>& r) {
  if (r) return {{"ok", true}};
  return {{"ok", false}, {"code", std::string(to_string(r.error().code))}, {"message", r.error().message}};
}

json status_json(const units::UnitStatus& s) {
  return {{"active_state", std::string(units::to_string(s.active_state))}, {"sub_state", s.sub_state}, {"main_pid", s.main_pid},
          {"exec_main_status", s.exec_main_status}, {"result", s.result}, {"loaded", s.loaded}};
}

// Whether /proc/PID/environ holds `assignment` (NAME=value), i.e. the drop-in reached the process.
bool environ_has(std::uint32_t pid, const std::string& assignment) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t pos = 0;
  while (pos < env.size()) {
    auto end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (env.compare(pos, end - pos, assignment) == 0) return true;
    pos = end + 1;
  }
  return false;
}

asio::awaitable<json> drive(units::ServiceManager& m, std::string model) {
  json out;
  auto unit = units::serve_unit(model);
  out["unit"] = unit;
  out["write_dropin"] = outcome(m.write_dropin(unit, "50-driver.conf", "[Service]\nEnvironment=MODELD_DRIVER=1\n"));
  out["reload"] = outcome(co_await m.reload());
  out["reset_failed_unloaded"] = outcome(co_await m.reset_failed("modeld-serve@never-started.service"));
  out["stop_unloaded"] = outcome(co_await m.stop("modeld-serve@never-started.service"));
  out["start_missing"] = outcome(co_await m.start("modeld-no-such-unit.service"));
  if (auto st = co_await m.status("modeld-no-such-unit.service"))
    out["status_missing"] = status_json(*st);
  else
    out["status_missing"] = outcome(st.error());
  out["start"] = outcome(co_await m.start(unit));

  // StartUnit returns once the job is queued: wait (bounded) for the main process to exist.
  asio::steady_timer timer(co_await asio::this_coro::executor);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  units::UnitStatus running;
  for (;;) {
    auto st = co_await m.status(unit);
    if (!st) {
      out["status_running"] = outcome(st.error());
      break;
    }
    running = *st;
    if ((running.active_state == units::ActiveState::active && running.main_pid != 0) ||
        std::chrono::steady_clock::now() > deadline)
      break;
    timer.expires_after(50ms);
    co_await timer.async_wait(asio::use_awaitable);
  }
  out["status_running"] = status_json(running);
  // A Type=simple unit is active as soon as systemd has forked: until the child has exec'd, its
  // environ is still systemd's own. Wait (bounded) for the service's environment to appear.
  bool env_ok = false;
  while (running.main_pid != 0 && !(env_ok = environ_has(running.main_pid, "MODELD_DRIVER=1")) &&
         std::chrono::steady_clock::now() < deadline) {
    timer.expires_after(20ms);
    co_await timer.async_wait(asio::use_awaitable);
  }
  out["main_env_has_dropin"] = env_ok;
  if (auto pids = co_await m.pids(unit))
    out["pids"] = *pids;
  else
    out["pids"] = outcome(pids.error());

  out["stop"] = outcome(co_await m.stop(unit));
  auto t0 = std::chrono::steady_clock::now();
  out["wait_inactive"] = outcome(co_await units::wait_inactive(m, unit, 20s));
  out["wait_inactive_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  if (auto st = co_await m.status(unit)) out["status_after"] = status_json(*st);
  if (auto pids = co_await m.pids(unit)) out["pids_after"] = *pids;
  co_return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--log") {
    sys::init_logging(sys::Sink::automatic, false);
    sys::Fields fields;
    fields.model = "x";
    fields.phase = "health_checking";
    sys::log(sys::Level::warning, fields, argv[2]);
    return 0;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s UNIT_DIR MODEL\n", argv[0]);
    return 2;
  }
  std::string unit_dir = argv[1], model = argv[2];

  sys::init_logging(sys::Sink::journal, true);
  sys::Fields fields;
  fields.deployment = "d-driver";
  fields.model = model;
  fields.phase = "launching";
  fields.extra = {{"modeld-unit", units::serve_unit(model)}, {"_forged", "x"}};
  sys::log(sys::Level::notice, fields, "units driver started");

  asio::io_context ctx;
  auto manager = units::make_systemd_manager(ctx.get_executor(), unit_dir);
  json result;
  asio::co_spawn(ctx, drive(*manager, model), [&](std::exception_ptr e, json j) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        j = {{"exception", ex.what()}};
      }
    }
    result = std::move(j);
  });
  ctx.run();
  std::cout << result.dump() << "\n";
  return result.contains("exception") ? 1 : 0;
}
