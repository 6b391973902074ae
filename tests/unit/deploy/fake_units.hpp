#pragma once
// A ServiceManager for the deploy stage's unit tests: units with their own states (active until
// stopped or told otherwise), every call recorded with and without its unit, failures scripted per
// call, and gates that hold a call until the test releases it.

#include "units/service_manager.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <fnmatch.h>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace modeld::test {

// A point where coroutines wait while it is armed, until release() or their cancellation.
class Gate {
 public:
  bool armed = false;
  int waiting = 0;  // coroutines waiting at the gate now
  int passed = 0;   // coroutines that went through it

  // Waits while armed; false when the wait ended by the caller's cancellation, not by release().
  boost::asio::awaitable<bool> pass() {
    bool released = true;
    if (armed) {
      ++waiting;
      boost::asio::steady_timer t(co_await boost::asio::this_coro::executor, std::chrono::steady_clock::time_point::max());
      timers_.insert(&t);
      auto [ec] = co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      (void)ec;
      timers_.erase(&t);
      --waiting;
      released = !armed;
    }
    ++passed;
    co_return released;
  }

  // Disarms the gate and lets every waiting coroutine through.
  void release() {
    armed = false;
    for (auto* t : timers_) t->cancel();
  }

 private:
  std::set<boost::asio::steady_timer*> timers_;
};

// Units that are active until stopped or told otherwise; every call is recorded.
class FakeUnits : public units::ServiceManager {
 public:
  std::string active_state = "active";             // of units not in `states`
  std::map<std::string, std::string> states;       // unit -> ActiveState
  std::string result = "success";
  std::vector<std::string> calls;       // "start", "stop", "reset_failed"
  std::vector<std::string> unit_calls;  // "start UNIT", "stop UNIT", "reset_failed UNIT"
  std::map<std::string, Error> fail;    // "start UNIT" -> the error that call returns
  std::map<std::string, Gate> gates;    // "start UNIT" -> where that call waits first
  std::function<void()> on_start;
  std::map<std::string, std::string> dropins;  // unit -> the text of its last drop-in written
  std::map<std::string, std::vector<std::uint32_t>> unit_pids;  // unit -> its processes (none when absent)
  std::map<std::string, units::ExecIdentity> identities;        // unit -> its User= (root when absent)

  std::string state_of(const std::string& unit) const {
    auto it = states.find(unit);
    return it == states.end() ? active_state : it->second;
  }

  boost::asio::awaitable<Result<void>> start(const std::string& unit) override {
    if (auto r = co_await enter("start", unit); !r) co_return r;
    states[unit] = "active";
    if (on_start) on_start();
    co_return Result<void>{};
  }
  boost::asio::awaitable<Result<void>> stop(const std::string& unit) override {
    if (auto r = co_await enter("stop", unit); !r) co_return r;
    states[unit] = "inactive";
    co_return Result<void>{};
  }
  boost::asio::awaitable<Result<units::UnitStatus>> status(const std::string& unit) override {
    units::UnitStatus s;
    s.active_state = units::parse_active_state(state_of(unit));
    s.sub_state = s.active_state == units::ActiveState::active ? "running" : "dead";
    s.result = result;
    s.loaded = true;
    co_return s;
  }
  boost::asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string& unit) override {
    auto it = unit_pids.find(unit);
    co_return it == unit_pids.end() ? std::vector<std::uint32_t>{} : it->second;
  }
  boost::asio::awaitable<Result<units::ExecIdentity>> identity(const std::string& unit) override {
    auto it = identities.find(unit);
    co_return it == identities.end() ? units::ExecIdentity{} : it->second;
  }
  boost::asio::awaitable<Result<void>> reset_failed(const std::string& unit) override {
    co_return co_await enter("reset_failed", unit);
  }
  boost::asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string& unit, const std::string&, const std::string& text) override {
    dropins[unit] = text;
    return {};
  }
  // The units of `states` that are up (those of `active_state` alone are not listed, as systemd
  // lists only loaded units).
  boost::asio::awaitable<Result<std::vector<std::string>>> units_up(const std::string& pattern) override {
    std::vector<std::string> out;
    for (const auto& [unit, state] : states)
      if (units::is_up(units::parse_active_state(state)) && ::fnmatch(pattern.c_str(), unit.c_str(), 0) == 0)
        out.push_back(unit);
    co_return out;
  }
  Result<std::optional<std::string>> read_dropin(const std::string& unit, const std::string&) const override {
    auto it = dropins.find(unit);
    return it == dropins.end() ? std::optional<std::string>{} : std::optional<std::string>(it->second);
  }

 private:
  // Records the call, waits at its gate (cancelled there: an error), returns its scripted failure, if any.
  boost::asio::awaitable<Result<void>> enter(const std::string& call, const std::string& unit) {
    calls.push_back(call);
    const std::string key = call + " " + unit;
    unit_calls.push_back(key);
    if (auto g = gates.find(key); g != gates.end())
      if (!co_await g->second.pass()) co_return make_error(Errc::cancelled, key + ": cancelled");
    if (auto f = fail.find(key); f != fail.end()) co_return f->second;
    co_return Result<void>{};
  }
};

}  // namespace modeld::test
