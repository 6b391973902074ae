// What the Deployer tells: STATUS= (the running record's, else what serves), and deploy::Control's
// queries (active, services, current, history, get, watchdogs, uptime) and its event listeners.
#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/model_watcher.hpp"
#include "deploy/placement.hpp"

#include "fetch/fetch.hpp"
#include "sys/log.hpp"
#include "sys/notify.hpp"
#include "units/service_manager.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

namespace modeld::deploy {

using Clock = std::chrono::steady_clock;

std::string Deployer::status_line() const {
  if (running_) return running_->status_line();
  std::vector<std::string> serving;
  for (const auto& a : state_.active.services) serving.push_back(fmt::format("{} ({})", a.model, a.commit.substr(0, 12)));
  std::string s = serving.empty() ? std::string("idle, no model active") : fmt::format("serving {}", fmt::join(serving, ", "));
  if (!history_.empty() && history_.front().state != State::succeeded)
    s += fmt::format("; last deployment {} {}", history_.front().id, to_string(history_.front().state));
  for (const auto& r : watchdogs()) {
    if (!state_.active.find(r.model)) continue;
    const std::string who = serving.size() > 1 ? " of " + r.model : std::string();
    if (r.state != "watching" || r.restarts > 0 || r.consecutive_failures > 0)
      s += fmt::format("; watchdog{} {}, {} restart{}", who, r.state, r.restarts, r.restarts == 1 ? "" : "s");
    if (r.consecutive_failures > 0)
      s += fmt::format(", {} failed probe{} in a row", r.consecutive_failures, r.consecutive_failures == 1 ? "" : "s");
  }
  return s;
}

void Deployer::announce_status() { sys::notify_status(status_line()); }

std::optional<Active> Deployer::active() const {
  const auto* last = state_.active.last();
  if (!last) return std::nullopt;
  Active a;
  a.model = last->model;
  a.commit = last->commit;
  a.unit = units::serve_unit(a.model);
  a.port = placement_of(*last, services_.config->find_model(a.model)).port;
  a.since = last->since;
  return a;
}

std::vector<ServiceInfo> Deployer::services() const {
  std::vector<ServiceInfo> out;
  const auto watched = watchdogs();
  for (const auto& a : state_.active.services) {
    ServiceInfo i{a.model, a.commit, units::serve_unit(a.model)};
    const auto* m = services_.config->find_model(a.model);
    const auto p = placement_of(a, m);
    i.port = p.port;
    i.gpu_ids = p.gpu_ids;
    i.since = a.since;
    for (const auto& w : watched)
      if (w.model == a.model) i.watchdog = w;
    out.push_back(std::move(i));
  }
  return out;
}

std::optional<Deployment> Deployer::current() const {
  if (running_) return running_->record();
  if (!history_.empty()) return history_.front();
  return std::nullopt;
}

std::vector<Deployment> Deployer::history(std::size_t limit) const {
  std::vector<Deployment> out;
  if (running_ && limit > 0) out.push_back(running_->record());
  for (const auto& d : history_) {
    if (out.size() >= limit) break;
    out.push_back(d);
  }
  return out;
}

Result<Deployment> Deployer::get(const std::string& id) const {
  if (running_ && running_->record().id == id) return running_->record();
  for (const auto& d : history_)
    if (d.id == id) return d;
  return make_error(Errc::not_found, fmt::format("no deployment with id '{}'", id));
}

std::uint64_t Deployer::subscribe(std::function<void(const Event&)> listener) {
  auto t = next_listener_++;
  listeners_[t] = std::move(listener);
  return t;
}

void Deployer::unsubscribe(std::uint64_t token) { listeners_.erase(token); }

std::vector<WatchdogStatus> Deployer::watchdogs() const {
  // The active service's watcher first (the API's "watchdog"), then the others by model name.
  std::vector<WatchdogStatus> out;
  const auto* last = state_.active.last();
  auto add = [&](const ModelWatcher& w) {
    for (auto& st : w.statuses()) out.push_back(std::move(st));
  };
  if (last)
    if (auto it = watchers_.find(last->model); it != watchers_.end()) add(*it->second);
  for (const auto& [model, w] : watchers_)
    if (!last || model != last->model) add(*w);
  return out;
}

double Deployer::uptime_s() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

}  // namespace modeld::deploy
