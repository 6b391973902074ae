#pragma once
// A deploy::Control that keeps everything in memory, for the control plane's tests.

#include "control/routes.hpp"
#include "deploy/control.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>

#include <string_view>

#include <atomic>
#include <map>
#include <set>

namespace modeld::control::test {

inline deploy::Deployment make_deployment(std::string id, std::string model, deploy::State state,
                                          deploy::Phase phase = deploy::Phase::planning) {
  deploy::Deployment d;
  d.id = std::move(id);
  d.model = std::move(model);
  d.state = state;
  d.phase = phase;
  d.started_at = "2026-11-29T19:39:42Z";
  if (state != deploy::State::running) d.finished_at = "2026-11-29T20:00:00Z";
  return d;
}

class FakeControl : public deploy::Control {
 public:
  std::optional<deploy::Active> active_model;
  std::vector<deploy::Deployment> deployments;  // newest first
  std::vector<deploy::ModelInfo> configured;
  std::set<std::string> known{"llama", "kimi-k2-5"};
  std::map<std::uint64_t, std::function<void(const deploy::Event&)>> listeners;
  std::atomic<std::size_t> listener_count{0};
  int starts = 0;
  int cancels = 0;
  // What plan, verify and remove answer, and what they were asked.
  Result<deploy::PlanReport> plan_result = deploy::PlanReport{};
  std::shared_ptr<boost::asio::steady_timer> plan_gate;  // when set, plans wait until it is cancelled
  Result<deploy::VerifyReport> verify_result = deploy::VerifyReport{};
  Result<deploy::Removal> remove_result = deploy::Removal{};
  std::vector<std::string> asked;  // "plan NAME true", "verify NAME", "remove NAME"
  std::vector<deploy::WatchdogStatus> watched;  // what watchdogs() answers

  std::optional<deploy::Active> active() const override { return active_model; }
  std::vector<deploy::ServiceInfo> in_service;  // what services() answers
  std::vector<deploy::ServiceInfo> services() const override { return in_service; }
  std::vector<std::string> stops;  // models stop() was asked for
  Result<deploy::Deployment> stop(const std::string& model) override {
    stops.push_back(model);
    if (!known.count(model)) return make_error(Errc::unknown_model, "no model named " + model);
    if (!deployments.empty() && !deployments.front().ended())
      return make_error(Errc::deployment_running, "deployment " + deployments.front().id + " is running");
    auto d = make_deployment("stop-" + model, model, deploy::State::running, deploy::Phase::stopping_old);
    d.kind = deploy::Kind::stop;
    deployments.insert(deployments.begin(), d);
    return d;
  }
  std::optional<deploy::Deployment> current() const override {
    if (deployments.empty()) return std::nullopt;
    return deployments.front();
  }
  std::vector<deploy::Deployment> history(std::size_t limit) const override {
    std::vector<deploy::Deployment> out;
    for (const auto& d : deployments) {
      if (out.size() >= limit) break;
      out.push_back(d);
    }
    return out;
  }
  Result<deploy::Deployment> get(const std::string& id) const override {
    for (const auto& d : deployments)
      if (d.id == id) return d;
    return make_error(Errc::not_found, "no deployment " + id);
  }
  Result<deploy::Deployment> start(const deploy::DeployRequest& request) override {
    const auto& model = request.model;
    const bool allow_downtime = request.allow_downtime;
    ++starts;
    if (!known.count(model)) return make_error(Errc::unknown_model, "no model named " + model);
    if (!deployments.empty() && !deployments.front().ended())
      return make_error(Errc::deployment_running,
                        "deployment " + deployments.front().id + " is running");
    auto d = make_deployment("20261129T19394" + std::to_string(deployments.size()) + "Z-" + model,
                             model, deploy::State::running);
    d.allow_downtime = allow_downtime;
    d.restart = request.restart;
    d.kind = request.kind;
    d.commit = request.commit;
    deployments.insert(deployments.begin(), d);
    return d;
  }
  Result<deploy::Deployment> cancel(const std::string& id) override {
    ++cancels;
    for (auto& d : deployments) {
      if (d.id != id) continue;
      if (d.ended()) return make_error(Errc::deployment_ended, "deployment " + id + " has ended");
      d.cancel_requested = true;
      return d;
    }
    return make_error(Errc::not_found, "no deployment " + id);
  }
  boost::asio::awaitable<std::vector<deploy::ModelInfo>> models() override { co_return configured; }
  boost::asio::awaitable<Result<deploy::PlanReport>> plan(std::string model, bool allow_downtime,
                                                          std::optional<std::string> commit) override {
    asked.push_back("plan " + model + (allow_downtime ? " true" : " false") + (commit ? " " + *commit : ""));
    if (!known.count(model)) co_return make_error(Errc::unknown_model, "no model named " + model);
    if (auto gate = plan_gate)  // held until the test cancels the timer
      co_await gate->async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    co_return plan_result;
  }
  boost::asio::awaitable<Result<deploy::VerifyReport>> verify(std::string model) override {
    asked.push_back("verify " + model);
    if (!known.count(model)) co_return make_error(Errc::unknown_model, "no model named " + model);
    co_return verify_result;
  }
  boost::asio::awaitable<Result<deploy::Removal>> remove(std::string model) override {
    asked.push_back("remove " + model);
    if (!known.count(model)) co_return make_error(Errc::unknown_model, "no model named " + model);
    if (active_model && active_model->model == model)
      co_return make_error(Errc::model_active, "model " + model + " is active");
    co_return remove_result;
  }
  boost::asio::awaitable<Result<deploy::Removal>> remove_revision(std::string model, std::string commit) override {
    asked.push_back("remove " + model + " " + commit);
    if (!known.count(model)) co_return make_error(Errc::unknown_model, "no model named " + model);
    if (active_model && active_model->model == model && active_model->commit == commit)
      co_return make_error(Errc::model_active, "revision " + commit + " of " + model + " is in service");
    co_return remove_result;
  }
  std::uint64_t subscribe(std::function<void(const deploy::Event&)> listener) override {
    auto token = next_token++;
    listeners.emplace(token, std::move(listener));
    listener_count = listeners.size();
    return token;
  }
  void unsubscribe(std::uint64_t token) override {
    listeners.erase(token);
    listener_count = listeners.size();
  }
  double uptime_s() const override { return 12.5; }
  std::vector<deploy::WatchdogStatus> watchdogs() const override { return watched; }

  /// Sends `e` to every listener (call on the io thread).
  void emit(const deploy::Event& e) {
    auto copy = listeners;  // a listener may unsubscribe
    for (auto& [token, fn] : copy) fn(e);
  }

 private:
  std::uint64_t next_token = 1;
};

/// Answers `request` for `peer` through handle_async() on an io_context of its own.
inline Response answer(FakeControl& e, Request request, const Peer& peer, const Access& access) {
  boost::asio::io_context io;
  std::optional<Response> out;
  boost::asio::co_spawn(io, handle_async(std::move(request), peer, e, access), [&](std::exception_ptr ex, Response r) {
    REQUIRE_FALSE(ex);
    out = std::move(r);
  });
  io.run();
  REQUIRE(out);
  return *out;
}

/// The JSON body of a response (which must say application/json).
inline nlohmann::json body_of(const Response& r) {
  REQUIRE(r.content_type == "application/json");
  return nlohmann::json::parse(r.body);
}

/// Checks that `r` is the API error `code` with HTTP `status` and a message.
inline void require_error(const Response& r, unsigned status, std::string_view code) {
  CHECK(r.status == status);
  auto j = body_of(r);
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["code"] == code);
  CHECK(j["error"]["message"].is_string());
  CHECK_FALSE(j["error"]["message"].get<std::string>().empty());
}

}  // namespace modeld::control::test
