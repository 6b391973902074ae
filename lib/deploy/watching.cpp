// The Deployer's model watchers (one per model: model_watcher.hpp) and the placement checks
// of a watcher's restart and of the switch against what serves or is about to start.
#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/model_watcher.hpp"
#include "deploy/placement.hpp"

#include "sys/log.hpp"

#include <boost/asio/awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace modeld::deploy {

namespace asio = boost::asio;

ModelWatcher& Deployer::watcher_for(const std::string& model) {
  auto& w = watchers_[model];
  if (w) return *w;
  w = std::make_unique<ModelWatcher>(io_, services_, watch_options_);
  w->on_change([this](const WatchdogStatus& st) {
    announce_status();
    Event e;
    e.kind = EventKind::watcher;
    e.model = st.model;
    e.watcher = st;
    publish(e);
  });
  w->on_started([this](const std::string& m, const std::optional<StartedSettings>& settings) {
    record_started(m, settings);
  });
  w->restart_settings([this](const std::string& m) { return settings_for_restart(m); });
  return *w;
}

std::optional<std::string> Deployer::placement_taken(const Placement& p, const std::set<std::string>& except) const {
  const auto& cfg = *services_.config;
  for (const auto& other : state_.active.services) {
    if (except.contains(other.model)) continue;
    if (auto why = conflict_between(p, placement_of(other, cfg.find_model(other.model))))
      return fmt::format("{}, which serves ({})", other.model, *why);
  }
  // The model a running deploy is about to start is in no state yet: its placement counts too.
  if (running_ && running_->record().kind == Kind::deploy && !except.contains(running_->record().model))
    if (const auto* target = running_->services().config->find_model(running_->record().model))
      if (auto why = conflict_between(p, placement_of(*target)))
        return fmt::format("{}, which deployment {} is about to start ({})", target->name, running_->record().id, *why);
  return std::nullopt;
}

Result<std::optional<StartedSettings>> Deployer::settings_for_restart(const std::string& model) const {
  const auto* a = state_.active.find(model);
  const auto* m = services_.config->find_model(model);
  if (!a || !m) return std::optional<StartedSettings>();
  // A service the running deploy replaces serves until that deploy stops it: the model it is
  // about to start does not count against it.
  std::set<std::string> except{model};
  if (running_ && models_of(running_->record().previous).contains(model)) except.insert(running_->record().model);
  const auto today = placement_taken(placement_of(*m), except);
  if (!today) return std::optional<StartedSettings>();
  sys::Fields f;
  f.model = model;
  if (a->started && !placement_taken(placement_of(*a, m), except)) {
    sys::logf(sys::Level::warning, f,
              "watchdog: today's configuration of {} conflicts with {}: starting it with the settings it ran with; "
              "deploy {} to apply the configuration",
              model, *today, model);
    return a->started;
  }
  return make_error(Errc::model_active,
                    fmt::format("not restarting {}: its placement conflicts with {}; it stays down until that "
                                "service leaves or {} is deployed again",
                                model, *today, model));
}

void Deployer::watch_service(const std::string& model, bool wait_ready_first) {
  if (!state_.active.find(model) || shutting_down_) return;
  if (running_ && running_->owns_service() && running_->touched_models().contains(model)) return;
  auto& w = watcher_for(model);
  if (!w.running()) w.start(model, wait_ready_first);
}

void Deployer::watch_services(const std::set<std::string>& except) {
  for (const auto& a : state_.active.services)
    if (!except.contains(a.model)) watch_service(a.model, false);
}

asio::awaitable<void> Deployer::stop_watching(std::set<std::string> models) {
  for (const auto& m : models)
    if (auto it = watchers_.find(m); it != watchers_.end() && it->second->running()) co_await it->second->stop();
}

bool Deployer::any_watching() const {
  return std::any_of(watchers_.begin(), watchers_.end(), [](const auto& w) { return w.second->running(); });
}

}  // namespace modeld::deploy
