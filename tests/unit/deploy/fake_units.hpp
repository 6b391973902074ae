#pragma once
// A ServiceManager for the deploy stage's unit tests: one unit, active until stopped or told
// otherwise, with every call recorded.

#include "units/service_manager.hpp"

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <string>
#include <vector>

namespace modeld::test {

// A unit that is active until stopped or told otherwise; every call is recorded.
class FakeUnits : public units::ServiceManager {
 public:
  std::string active_state = "active";
  std::string result = "success";
  std::vector<std::string> calls;  // "start", "stop", "reset_failed"
  std::function<void()> on_start;

  boost::asio::awaitable<Result<void>> start(const std::string&) override {
    calls.push_back("start");
    active_state = "active";
    if (on_start) on_start();
    co_return Result<void>{};
  }
  boost::asio::awaitable<Result<void>> stop(const std::string&) override {
    calls.push_back("stop");
    active_state = "inactive";
    co_return Result<void>{};
  }
  boost::asio::awaitable<Result<units::UnitStatus>> status(const std::string&) override {
    units::UnitStatus s;
    s.active_state = active_state;
    s.sub_state = active_state == "active" ? "running" : "dead";
    s.result = result;
    s.loaded = true;
    co_return s;
  }
  boost::asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string&) override {
    co_return std::vector<std::uint32_t>{};
  }
  boost::asio::awaitable<Result<void>> reset_failed(const std::string&) override {
    calls.push_back("reset_failed");
    co_return Result<void>{};
  }
  boost::asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string&, const std::string&, const std::string&) override { return {}; }
};

}  // namespace modeld::test
