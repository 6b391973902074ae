#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/launch.hpp"
#include "deploy/preflight.hpp"
#include "deploy/reconcile.hpp"
#include "deploy/redeploy.hpp"
#include "util/json.hpp"

#include "fetch/fetch.hpp"
#include "store/store.hpp"
#include "sys/notify.hpp"
#include "sys/task.hpp"
#include "units/service_manager.hpp"
#include "util/memory.hpp"
#include "util/on_pool.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "wire/switch_report.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include <sys/stat.h>

namespace modeld::deploy {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;



/// The Deployer's side of the running record: all a RecordRun reaches of it.
class Deployer::Sink final : public RunSink {
 public:
  explicit Sink(Deployer& d) : d_(d) {}
  asio::awaitable<void> persist_now(const Deployment& record) override { co_await d_.persist_now(record); }
  DaemonState& state() override { return d_.state_; }
  asio::awaitable<void> save_state(const sys::Fields& f) override { co_await d_.save_state(f); }
  void emit(EventKind kind, const Deployment& record) override { d_.emit(kind, record); }
  void announce_status() override { d_.announce_status(); }
  asio::awaitable<void> pause_watchers(const std::set<std::string>& models) override {
    const auto these = models;
    co_await d_.stop_watching(these);
  }
  std::optional<std::string> placement_taken(const Placement& p, const std::set<std::string>& except) const override {
    return d_.placement_taken(p, except);
  }
  asio::awaitable<std::optional<std::string>> why_not_noop(const Deployment& record, const Run& run) override {
    co_return co_await d_.why_not_noop(record, run);
  }
  bool shutting_down() const override { return d_.shutting_down_; }
  void ended(const Deployment& record, const std::set<std::string>& not_restored) override {
    d_.history_.push_front(record);
    while (d_.history_.size() > 200) d_.history_.pop_back();
    d_.emit(EventKind::state, record);
    d_.running_.reset();
    d_.watch_services(not_restored);
    d_.announce_status();
  }
  void interrupted() override {
    d_.running_.reset();
    if (d_.on_idle_) d_.on_idle_();
  }

 private:
  Deployer& d_;
};

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states)
    : Deployer(io, std::move(services), states, ModelWatcher::Options{}) {}

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states, ModelWatcher::Options watchdog)
    : io_(io),
      services_(std::move(services)),
      states_(states),
      writes_(asio::make_strand(services_.disk_pool)),
      sink_(std::make_unique<Sink>(*this)),
      watch_options_(std::move(watchdog)) {}

Deployer::~Deployer() = default;

void Deployer::shutdown(std::function<void()> done) {
  shutting_down_ = true;
  if (any_watching()) {
    // A watcher may be in the middle of a restart: they end first (cancelled, awaited).
    std::set<std::string> all;
    for (auto& [model, w] : watchers_) {
      w->cancel();
      all.insert(model);
    }
    asio::co_spawn(io_, stop_watching(all),
                   [this, done = std::move(done), log = sys::log_failure("stopping the watchdog")](
                       std::exception_ptr e) mutable {
                     log(e);
                     shutdown(std::move(done));
                   });
    return;
  }
  if (!running_) {
    if (done) done();
    return;
  }
  on_idle_ = std::move(done);
  running_->cancel();
}

void Deployer::shutdown_on(asio::cancellation_slot slot, std::function<void()> done) {
  slot.assign([this, done = std::move(done)](asio::cancellation_type) { shutdown(done); });
}

std::string Deployer::new_id(const std::string& model, std::chrono::system_clock::time_point now) const {
  std::string base = fmt::format("{}-{}", util::compact_utc_stamp(now), model);
  std::string id = base;
  for (int n = 2; get(id); ++n) id = fmt::format("{}-{}", base, n);
  return id;
}

std::optional<Error> Deployer::refuse_while_recovering() const {
  if (interrupted_)
    return make_error(Errc::deployment_running,
                      fmt::format("deployment {}, interrupted by modeld's restart, is about to continue", *interrupted_));
  return std::nullopt;
}

std::optional<Error> Deployer::refuse_new_record() const {
  if (running_)
    return make_error(Errc::deployment_running,
                      fmt::format("{} {} of {} is running (phase {})", noun_of(running_->record().kind), running_->record().id,
                                  running_->record().model, to_string(running_->record().phase)));
  if (auto r = refuse_while_recovering()) return r;
  if (shutting_down_) return make_error(Errc::cancelled, "modeld is shutting down");
  if (!busy_.empty())
    return make_error(Errc::deployment_running,
                      fmt::format("a {} of model {} is in progress; deploy when it has ended", busy_.begin()->second,
                                  busy_.begin()->first));
  return std::nullopt;
}

Deployment Deployer::new_record(const std::string& model, Kind kind) const {
  Deployment d;
  const auto now = std::chrono::system_clock::now();
  d.id = new_id(model, now);
  d.model = model;
  d.kind = kind;
  d.started_at = util::rfc3339(now);
  d.started_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  return d;
}

Result<Deployment> Deployer::start(const DeployRequest& request) {
  const std::string& model = request.model;
  const auto* m = services_.config->find_model(model);
  if (!m) return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  if (auto refused = refuse_new_record()) return *refused;
  Deployment d = new_record(model, request.kind);
  d.commit = request.commit;  // planning lists the Hub at this commit, never the branch
  d.allow_downtime = request.kind == Kind::deploy && request.allow_downtime;
  d.restart = request.restart;
  // A deploy stops exactly the services in conflict with its model; a pull touches none.
  if (d.kind == Kind::deploy) d.previous = conflicting(state_.active.services, placement_of(*m), *services_.config);
  sys::Fields f;
  f.deployment = d.id;
  f.model = model;
  f.phase = "planning";
  f.message_id = message_id::started;
  std::vector<std::string> stops;
  for (const auto& a : d.previous) stops.push_back(a.model);
  if (d.kind == Kind::pull)
    sys::logf(sys::Level::notice, f, "pull {} of model {} started{}: no service is touched", d.id, model,
              d.commit ? " at " + *d.commit : std::string());
  else
    sys::logf(sys::Level::notice, f, "deployment {} of model {} started{}{}", d.id, model,
              d.commit ? " at " + *d.commit : std::string(),
              !stops.empty() ? fmt::format(" (replacing {})", fmt::join(stops, ", "))
              : state_.active ? std::string(" (no model in service conflicts with it)")
                              : std::string(" (no model active)"));
  // The watchdog keeps watching the services in service through planning, downloading and
  // verifying (hours for a large checkpoint); drive() stops those it stops before the first
  // phase that touches them.
  begin(d, Step::planning);
  return running_->record();
}

Result<Deployment> Deployer::stop(const std::string& model) {
  const auto* a = state_.active.find(model);
  if (!services_.config->find_model(model) && !a)
    return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or in service", model));
  if (auto refused = refuse_new_record()) return *refused;
  Deployment d = new_record(model, Kind::stop);
  d.phase = Phase::stopping_old;
  sys::Fields f;
  f.deployment = d.id;
  f.model = model;
  f.phase = "stopping_old";
  f.message_id = message_id::started;
  if (!a) {
    // Nothing to stop: a record that says so, ended at once.
    d.state = State::succeeded;
    d.changed = false;
    d.finished_at = d.started_at;
    f.message_id = message_id::succeeded;
    sys::logf(sys::Level::notice, f, "stop {}: model {} is not in service, nothing to do", d.id, model);
    history_.push_front(d);
    persist(d);
    emit(EventKind::state, d);
    return d;
  }
  d.commit = a->commit;
  d.previous = {*a};
  sys::logf(sys::Level::notice, f, "stop {} of model {} started: {} leaves service, its files stay on disk", d.id,
            model, units::serve_unit(model));
  begin(d, Step::stopping_old);
  return running_->record();
}

void Deployer::begin(Deployment d, Step first) {
  running_ = std::make_shared<RecordRun>(io_, services_, std::move(d), state_, *sink_);
  running_->start(first);
}

bool Deployer::in_service(const std::string& model, const std::optional<std::string>& commit) const {
  const auto* a = state_.active.find(model);
  return a && a->commit == commit;
}

asio::awaitable<void> Deployer::save_state(const sys::Fields& f) {
  const DaemonState copy = state_;
  auto& states = states_;
  auto s = co_await util::on_executor<Result<void>>(writes_, [&] { return states.save(copy); });
  if (!s) sys::logf(sys::Level::error, f, "cannot record the active model: {}", s.error().message);
}

void Deployer::record_started(const std::string& model, const std::optional<StartedSettings>& settings) {
  auto* a = state_.active.find(model);
  if (!a) return;
  a->started = settings;
  // The watchdog restarted it while a deployment still downloads: a rollback restores this one.
  if (running_ && !running_->committed())
    for (auto& p : running_->record().previous)
      if (p.model == model) {
        p.started = settings;
        persist(running_->record());
      }
  sys::Fields f;
  f.model = model;
  asio::co_spawn(io_, [this, f]() -> asio::awaitable<void> { co_await save_state(f); },
                 sys::log_failure("recording the settings of " + model, f));
}

asio::awaitable<std::optional<std::string>> Deployer::why_not_noop(const Deployment& d, const Run& run) {
  std::optional<ActiveRecord> active;
  if (const auto* a = state_.active.find(d.model)) active = *a;
  const auto check = compare_with_serving(d, active, started_settings(services_, run.model));
  if (check.verdict == Redeploy::not_serving) co_return std::string();
  if (check.verdict != Redeploy::noop) co_return check.why;
  // One readiness check, the watchdog's probe: a model that does not answer is restarted.
  auto probe = [this](const config::ModelConfig& m) { return watcher_for(m.name).probe_once(m); };
  if (auto why = co_await not_ready_reason(services_, run, probe))
    co_return fmt::format("it serves commit {} but is not ready ({})", d.commit->substr(0, 12), *why);
  co_return std::nullopt;
}

asio::awaitable<void> Deployer::log_unlogged_ends() {
  // Logged and cleared without awaiting, so nothing else changes the history meanwhile.
  std::vector<Deployment> logged;
  for (auto& d : history_) {
    if (!d.ended() || !d.end_unlogged) continue;
    const auto* m = services_.config->find_model(d.model);
    log_end(d, m ? std::optional<unsigned>(m->serve.port) : std::nullopt,
            " (logged at modeld's start: modeld was killed before it logged this end)");
    d.end_unlogged = false;
    logged.push_back(d);
  }
  for (const auto& d : logged) co_await persist_now(d);
}

void Deployer::persist(const Deployment& d) {
  // A copy travels to the pool; the StateStore outlives the pool's jobs (main, the tests).
  asio::post(writes_, [&states = states_, d] {
    if (auto r = states.save_deployment(d); !r)
      sys::logf(sys::Level::error, "cannot record deployment {}: {}", d.id, r.error().message);
  });
}

asio::awaitable<void> Deployer::persist_now(const Deployment& d) {
  const Deployment copy = d;
  auto& states = states_;
  // By reference only (GCC 12 mis-copies class objects captured by value in a coroutine).
  auto r = co_await util::on_executor<Result<void>>(writes_, [&] { return states.save_deployment(copy); });
  if (!r) sys::logf(sys::Level::error, "cannot record deployment {}: {}", copy.id, r.error().message);
}

void Deployer::emit(EventKind kind, const Deployment& d) { publish(deployment_event(kind, d)); }

void Deployer::publish(const Event& e) {
  // Copy first: a listener may unsubscribe itself while being called.
  auto ls = listeners_;
  for (auto& [_, l] : ls) l(e);
}

Result<Deployment> Deployer::cancel(const std::string& id) {
  if (!running_ || running_->record().id != id) {
    auto d = get(id);
    if (!d) return d.error();
    return make_error(Errc::deployment_ended, fmt::format("deployment {} already ended ({})", id, to_string(d->state)));
  }
  auto& d = running_->record();
  if (d.phase == Phase::rolling_back)
    return make_error(Errc::deployment_ended, fmt::format("deployment {} is rolling back and cannot be cancelled", id));
  d.cancel_requested = true;
  persist(d);
  sys::Fields f = running_->fields();
  sys::logf(sys::Level::notice, f, "cancel requested for deployment {} in phase {}", id, to_string(d.phase));
  running_->cancel();
  return d;
}

}  // namespace modeld::deploy
