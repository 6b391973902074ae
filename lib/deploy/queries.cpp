// What the Deployer tells: download and warming progress, STATUS=, and deploy::Control's queries
// (active, services, current, history, get, watchdogs, uptime) and its event listeners.
#include "deploy/deployer.hpp"
#include "deploy/running.hpp"
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

namespace {

// The verb STATUS= and status_line put before the model in phase `p` ("warming the page cache for").
std::string_view phase_verb(Phase p) {
  switch (p) {
    case Phase::planning: return "planning";
    case Phase::freeing_disk: return "freeing disk for";
    case Phase::downloading: return "downloading";
    case Phase::verifying: return "verifying";
    case Phase::warming: return "warming the page cache for";
    case Phase::stopping_old: return "stopping the old model for";
    case Phase::launching: return "launching";
    case Phase::health_checking: return "waiting for readiness of";
    case Phase::benchmarking: return "benchmarking";
    case Phase::rolling_back: return "rolling back";
  }
  return "";
}

}  // namespace

using Clock = std::chrono::steady_clock;

void Deployer::on_progress(Running& r, const fetch::Progress& p) {
  auto& d = r.record;
  d.progress.bytes_done = p.bytes_done;
  d.progress.bytes_total = p.bytes_total;
  d.progress.files_done = p.files_done;
  d.progress.files_total = p.files_total;
  d.progress.rate_bytes_per_s = p.rate_bytes_per_s;
  if (p.rate_bytes_per_s > 0 && p.bytes_total >= p.bytes_done)
    d.progress.eta_s = static_cast<double>(p.bytes_total - p.bytes_done) / p.rate_bytes_per_s;
  else
    d.progress.eta_s.reset();
  d.progress.files.clear();
  for (const auto& f : p.files) {
    FileProgress fp{f.path, f.bytes_done, f.bytes_total, f.rate_bytes_per_s, std::nullopt, f.connections};
    if (f.rate_bytes_per_s > 0 && f.bytes_total >= f.bytes_done)
      fp.eta_s = static_cast<double>(f.bytes_total - f.bytes_done) / f.rate_bytes_per_s;
    d.progress.files.push_back(std::move(fp));
  }
  emit(EventKind::progress, d);
  auto now = Clock::now();
  if (now - r.last_status >= std::chrono::seconds(1)) {
    r.last_status = now;
    announce_status();
  }
  // The journal gets at most one progress line every 5 s (the API and SSE get every update),
  // naming the files in flight so a stuck shard stands out.
  if (now - r.last_journal_progress >= std::chrono::seconds(5) || p.bytes_done == p.bytes_total) {
    r.last_journal_progress = now;
    sys::Fields f = r.run->fields();
    f.extra.emplace_back("MODELD_BYTES", std::to_string(p.bytes_done));
    std::string line = status_line();
    std::string files;
    for (std::size_t i = 0; i < d.progress.files.size(); ++i) {
      const auto& fp = d.progress.files[i];
      if (i == 4) {
        files += fmt::format(", and {} more", d.progress.files.size() - i);
        break;
      }
      files += fmt::format("{}{} {}%", files.empty() ? "" : ", ", fp.path,
                           fp.bytes_total ? fp.bytes_done * 100 / fp.bytes_total : 100);
      if (fp.rate_bytes_per_s > 0) files += " at " + util::format_rate(fp.rate_bytes_per_s);
      if (fp.connections > 1) files += fmt::format(" over {} connections", fp.connections);
    }
    if (!files.empty()) line += "; in flight: " + files;
    sys::log(sys::Level::info, f, line);
  }
}

void Deployer::on_warm_progress(Running& r, const WarmReport& w) {
  r.record.warm = w;
  emit(EventKind::progress, r.record);
  if (auto now = Clock::now(); now - r.last_status >= std::chrono::seconds(1)) {
    r.last_status = now;
    announce_status();
  }
}

std::string Deployer::status_line() const {
  if (running_) {
    const auto& d = running_->record;
    std::string s = fmt::format("{} {}", phase_verb(d.phase), d.model);
    if (d.phase == Phase::warming && d.warm && d.warm->bytes_total > 0) {
      const auto in_cache = d.warm->bytes_resident_before + d.warm->bytes_warmed;
      s += fmt::format(": {}% of {} in memory", std::min<std::uint64_t>(100, in_cache * 100 / d.warm->bytes_total),
                       util::format_bytes(d.warm->bytes_total));
    }
    if (d.phase == Phase::downloading && d.progress.bytes_total > 0) {
      const auto& p = d.progress;
      s += fmt::format(": {}% of {}", p.bytes_done * 100 / p.bytes_total, util::format_bytes(p.bytes_total));
      if (p.rate_bytes_per_s > 0) s += ", " + util::format_rate(p.rate_bytes_per_s);
      if (p.eta_s)
        s += ", " + util::format_duration(std::chrono::seconds(static_cast<long long>(*p.eta_s))) + " left";
    }
    return s;
  }
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
  if (running_) return running_->record;
  if (!history_.empty()) return history_.front();
  return std::nullopt;
}

std::vector<Deployment> Deployer::history(std::size_t limit) const {
  std::vector<Deployment> out;
  if (running_ && limit > 0) out.push_back(running_->record);
  for (const auto& d : history_) {
    if (out.size() >= limit) break;
    out.push_back(d);
  }
  return out;
}

Result<Deployment> Deployer::get(const std::string& id) const {
  if (running_ && running_->record.id == id) return running_->record;
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
