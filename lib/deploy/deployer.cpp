#include "deploy/deployer.hpp"
#include "deploy/running.hpp"
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



/// The decisions of the running deployment, recorded and persisted by the Deployer.
class Deployer::RunDecisions final : public Decisions {
 public:
  RunDecisions(Deployer& deployer, Running& r) : deployer_(deployer), r_(r) {}
  asio::awaitable<void> commit_chosen(const std::string& commit) override {
    r_.record.commit = commit;
    co_await deployer_.persist_now(r_.record);
  }
  asio::awaitable<void> stopping_old() override {
    r_.record.old_stopped = true;
    // A restart mid-switch keeps the first request's time: the outage began there.
    auto& marks = r_.record.switch_marks;
    if (!marks.stop_requested_ns) marks.stop_requested_ns = wall_clock_ns();
    co_await deployer_.persist_now(r_.record);
    // A stop decided: from here on the model is out of service, neither watched nor started at boot.
    if (r_.record.kind == Kind::stop) co_await deployer_.take_out_of_service(r_);
  }
  void progress(const fetch::Progress& p) override { deployer_.on_progress(r_, p); }
  void warm_progress(const WarmReport& w) override { deployer_.on_warm_progress(r_, w); }

 private:
  Deployer& deployer_;
  Running& r_;
};


// What the journal and refusals call a record of kind `k`: "deployment", "pull" or "stop".
std::string_view noun_of(Kind k) {
  switch (k) {
    case Kind::pull: return "pull";
    case Kind::stop: return "stop";
    case Kind::deploy: break;
  }
  return "deployment";
}

namespace {

// The journal fields of a line about record `d`: MODELD_DEPLOYMENT, MODELD_MODEL, MODELD_PHASE.
sys::Fields record_fields(const Deployment& d) {
  sys::Fields f;
  f.deployment = d.id;
  f.model = d.model;
  f.phase = std::string(to_string(d.phase));
  return f;
}

}  // namespace

sys::Fields Run::fields() const { return record_fields(record); }

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states)
    : Deployer(io, std::move(services), states, ModelWatcher::Options{}) {}

Deployer::Deployer(asio::io_context& io, Services services, StateStore& states, ModelWatcher::Options watchdog)
    : io_(io),
      services_(std::move(services)),
      states_(states),
      writes_(asio::make_strand(services_.disk_pool)),
      watch_options_(std::move(watchdog)) {}

Deployer::~Deployer() = default;

bool Deployer::owns_service(const Running& r) {
  return r.record.old_stopped || r.rolling_back || (r.step && r.step->touches_service);
}

std::set<std::string> Deployer::touched_models(const Running& r) {
  auto out = models_of(r.record.previous);
  out.insert(r.record.model);
  return out;
}

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
  running_->cancel.emit(asio::cancellation_type::terminal);
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
                      fmt::format("{} {} of {} is running (phase {})", noun_of(running_->record.kind), running_->record.id,
                                  running_->record.model, to_string(running_->record.phase)));
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
  return running_->record;
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
  return running_->record;
}

void Deployer::begin(Deployment d, std::optional<Step> first) {
  auto r = std::make_shared<Running>(services_);
  r->record = std::move(d);
  const auto& cfg = *r->services.config;
  const auto* model = cfg.find_model(r->record.model);
  if (!model) {
    // A stop of a model that left the configuration: its name, and the port it was started on.
    r->own_model = config::ModelConfig{};
    r->own_model->name = r->record.model;
    if (!r->record.previous.empty()) r->own_model->serve.port = placement_of(r->record.previous.front(), nullptr).port;
    model = &*r->own_model;
  }
  Serving serving{models_of(state_.active.services), models_of(r->record.previous)};
  std::vector<Placement> staying;
  for (const auto& a : state_.active.services)
    if (!serving.stopped.contains(a.model) && a.model != r->record.model)
      staying.push_back(placement_of(a, cfg.find_model(a.model)));
  r->run = std::make_unique<Run>(Run{.record = r->record,
                                     .model = *model,
                                     .serving = std::move(serving),
                                     .staying = std::move(staying),
                                     .last_active = state_.last_active,
                                     .pulled = state_.pulled});
  r->decisions = std::make_unique<RunDecisions>(*this, *r);
  r->steps = plan_steps(r->record.kind, r->record.downtime_first);
  r->new_serves = first == Step::cleanup;  // resumed after its health check
  running_ = r;
  asio::co_spawn(io_, drive(r, first), sys::log_failure("deployment coroutine"));
}

namespace {

// Runs `body`, the phase of `step`, as a child coroutine bound to `slot` (the deployment's
// cancellation signal), so a cancel (or SIGTERM) reaches every operation inside it, and an
// exception thrown by a bug in a phase ends the deployment with an error instead of the daemon.
template <class T>
asio::awaitable<Result<T>> in_child(asio::io_context& io, asio::cancellation_slot slot, asio::awaitable<Result<T>>& body,
                                    std::string_view step) {
  auto [ex, result] =
      co_await asio::co_spawn(io, std::move(body), asio::bind_cancellation_slot(slot, asio::as_tuple(asio::use_awaitable)));
  if (!ex) co_return std::move(result);
  try {
    std::rethrow_exception(ex);
  } catch (const boost::system::system_error& e) {
    if (e.code() == asio::error::operation_aborted) co_return make_error(Errc::cancelled, "cancelled");
    co_return make_error(Errc::internal, fmt::format("phase {}: {}", step, e.what()));
  } catch (const std::exception& e) {
    co_return make_error(Errc::internal, fmt::format("phase {}: {}", step, e.what()));
  }
}

}  // namespace

asio::awaitable<void> Deployer::enter_step(Running& r, Step s) {
  auto& d = r.record;
  if (s == Step::cleanup) {
    // Recorded before it starts, so a restart finishes it; the API still shows health_checking.
    d.cleanup_begun = true;
    co_await persist_now(d);
    test_hooks::crash_point("cleanup_begun");
    co_return;
  }
  d.phase = phase_of(s);
  co_await persist_now(d);
  emit(EventKind::phase, d);
  announce_status();
}

asio::awaitable<Result<void>> Deployer::run_step(Running& r, Step s) {
  auto& sv = r.services;
  const auto& run = *r.run;
  auto& decisions = *r.decisions;
  const auto slot = r.cancel.slot();
  const auto name = to_string(s);
  co_await enter_step(r, s);
  // Each phase returns what it found; the driver applies it (GCC 12: no co_await in a conditional expression).
  switch (s) {
    case Step::planning: {
      auto body = run_planning(sv, run, decisions);
      auto p = co_await in_child(io_, slot, body, name);
      if (!p) co_return p.error();
      if (!r.record.cancel_requested) co_await apply_planned(r, *p);
      co_return Result<void>{};
    }
    case Step::freeing_disk: {
      auto body = run_freeing_disk(sv, run);
      auto f = co_await in_child(io_, slot, body, name);
      if (!f) co_return f.error();
      if (!r.record.cancel_requested) co_await apply_freed(r, *f);
      co_return Result<void>{};
    }
    case Step::downloading: {
      auto body = run_downloading(sv, run, decisions);
      auto got = co_await in_child(io_, slot, body, name);
      if (!got) co_return got.error();
      r.run->fetched.insert(got->fetched.begin(), got->fetched.end());
      co_return Result<void>{};
    }
    case Step::verifying: {
      auto body = run_verifying(sv, run);
      co_return co_await in_child(io_, slot, body, name);
    }
    case Step::warming: {
      auto body = run_warming(sv, run, decisions);
      auto w = co_await in_child(io_, slot, body, name);
      if (w) co_await apply_warm(r, w->report, std::nullopt);
      co_return w ? Result<void>{} : Result<void>{w.error()};
    }
    case Step::stopping_old:
    case Step::launching:
    case Step::health_checking: co_return co_await run_switch_step(r, s);
    case Step::cleanup: {
      // Not cancellable: bound to a signal nothing emits. A failure is logged; the model serves.
      asio::cancellation_signal never;
      auto body = run_cleanup(sv, run, *r.record.commit);
      auto c = co_await in_child(io_, never.slot(), body, name);
      if (!c) sys::logf(sys::Level::warning, run.fields(), "cannot remove older revisions: {}", c.error().message);
      co_return Result<void>{};
    }
    case Step::benchmarking: {
      auto body = run_benchmarking(sv, run);
      auto b = co_await in_child(io_, slot, body, name);
      if (!b) co_return b.error();
      r.record.benchmark_ttft_s = b->ttft_s;
      r.record.benchmark_decode_tokens_per_s = b->decode_tokens_per_s;
      co_await persist_now(r.record);
      co_return Result<void>{};
    }
  }
  co_return make_error(Errc::internal, "unknown step");
}

// The steps of the switch, each applying the marks of the outage it returns (DEPLOYMENT.switch).
asio::awaitable<Result<void>> Deployer::run_switch_step(Running& r, Step s) {
  auto& sv = r.services;
  const auto& run = *r.run;
  const auto slot = r.cancel.slot();
  const auto name = to_string(s);
  switch (s) {
    case Step::stopping_old: {
      if (auto taken = switch_conflict(r)) co_return *taken;
      auto body = run_stopping_old(sv, run, *r.decisions);
      auto stopped = co_await in_child(io_, slot, body, name);
      if (!stopped) co_return stopped.error();
      co_await apply_stopped(r, *stopped);
      co_return Result<void>{};
    }
    case Step::launching: {
      if (auto taken = switch_conflict(r)) co_return *taken;
      auto body = run_launching(sv, run);
      auto launched = co_await in_child(io_, slot, body, name);
      if (!launched) co_return launched.error();
      co_await apply_warm(r, std::nullopt, launched->bytes_resident_at_launch);
      const std::optional<Readiness> not_yet;
      co_await apply_started(r, launched->start_requested_ns, not_yet);
      co_return Result<void>{};
    }
    case Step::health_checking: {
      auto body = run_health_checking(sv, run);
      auto ready = co_await in_child(io_, slot, body, name);
      if (!ready) co_return ready.error();
      const std::optional<Readiness> seen = *ready;
      co_await apply_started(r, r.record.switch_marks.start_requested_ns, seen);
      if (!r.record.cancel_requested) co_await apply_healthy(r);
      co_return Result<void>{};
    }
    default: break;
  }
  co_return make_error(Errc::internal, "not a step of the switch");
}

asio::awaitable<void> Deployer::apply_planned(Running& r, Planned& p) {
  auto& d = r.record;
  auto& run = *r.run;
  run.missing = std::move(p.missing);
  run.fetched.insert(p.adopted.begin(), p.adopted.end());
  run.snapshot = std::move(p.snapshot);
  d.commit = run.snapshot->commit;
  d.progress.files_total = p.files_total;
  d.progress.bytes_total = p.bytes_total;
  d.downtime_first = p.downtime_first;
  // A pull of a commit already verified on disk changes nothing.
  if (d.kind == Kind::pull && p.already_verified) d.changed = false;
  // The plan is data from here on: computed once, from what the record keeps.
  r.steps = plan_steps(d.kind, d.downtime_first);
  co_await persist_now(d);
  test_hooks::crash_point("order_decided");
}

asio::awaitable<void> Deployer::apply_warm(Running& r, const std::optional<WarmReport>& warmed,
                                           std::optional<std::uint64_t> resident_at_launch) {
  auto& d = r.record;
  if (warmed) d.warm = warmed;
  if (resident_at_launch) {
    if (!d.warm) d.warm = WarmReport{};
    d.warm->bytes_resident_at_launch = resident_at_launch;
  }
  if (warmed || resident_at_launch) co_await persist_now(d);
}

asio::awaitable<void> Deployer::apply_freed(Running& r, const Freed& freed) {
  if (!freed.active_evicted) co_return;
  for (const auto& name : freed.evicted) {
    if (!state_.active.erase(name)) continue;
    sys::logf(sys::Level::warning, r.run->fields(), "model {} was evicted: it is out of service, {} serves in its place",
              name, r.record.model);
    state_.last_active[name] = util::rfc3339(std::chrono::system_clock::now());
  }
  co_await save_state(r);
}

asio::awaitable<void> Deployer::take_out_of_service(Running& r) {
  if (!state_.active.erase(r.record.model)) co_return;
  state_.last_active[r.record.model] = util::rfc3339(std::chrono::system_clock::now());
  co_await save_state(r);
}

asio::awaitable<void> Deployer::apply_stopped(Running& r, const Stopped& stopped) {
  // Kept from before a restart: a stop found done again is not when it was done.
  auto& marks = r.record.switch_marks;
  if (stopped.stop_done_ns && !marks.stop_done_ns) marks.stop_done_ns = stopped.stop_done_ns;
  co_await persist_now(r.record);
}

asio::awaitable<void> Deployer::apply_started(Running& r, std::int64_t start_requested_ns,
                                              const std::optional<Readiness>& ready) {
  auto& d = r.record;
  auto& marks = d.switch_marks;
  marks.start_requested_ns = start_requested_ns;
  marks.port_ns = ready ? ready->port_ns : 0;
  marks.ready_ns = ready ? ready->ready_ns : 0;
  d.switch_report = switch_report_of(marks);
  if (d.switch_report) {
    const auto& w = *d.switch_report;
    sys::Fields f = r.run->fields();
    auto field = [&](const char* name, double v) { f.extra.emplace_back(name, fmt::format("{:.3f}", v)); };
    field("MODELD_DOWNTIME_S", w.downtime_s);
    field("MODELD_STOP_S", w.stop_s);
    field("MODELD_LAUNCH_S", w.launch_s);
    field("MODELD_LOAD_S", w.start_to_port_s);
    field("MODELD_READINESS_S", w.port_to_ready_s);
    sys::logf(sys::Level::notice, f, "switch {}",
              wire::describe_switch(w.downtime_s, w.stop_s, w.launch_s, w.start_to_port_s, w.port_to_ready_s));
  }
  co_await persist_now(d);
}

asio::awaitable<void> Deployer::apply_healthy(Running& r) {
  const auto& d = r.record;
  auto now = util::rfc3339(std::chrono::system_clock::now());
  // The services it stopped are out of service now; every other one serves on beside it.
  for (const auto& a : d.previous) {
    state_.last_active[a.model] = now;
    state_.active.erase(a.model);
  }
  // What launching's drop-in holds: rendered from the same configuration by the same code.
  state_.active.put(ActiveRecord{d.model, *d.commit, now, started_settings(r.services, r.run->model)});
  state_.last_active[d.model] = now;
  forget_pulled(d.model, *d.commit);  // deployed: the revision in service needs no mark
  r.new_serves = true;
  co_await save_state(r);
}

bool Deployer::serves_new(const Deployment& d) const {
  // A restart of the commit that serves (its settings changed, or asked for) finds the state
  // naming that commit from the start: only its own health check says the new server serves.
  for (const auto& a : d.previous)
    if (a.model == d.model && a.commit == d.commit) return false;
  return in_service(d.model, d.commit);
}

bool Deployer::in_service(const std::string& model, const std::optional<std::string>& commit) const {
  const auto* a = state_.active.find(model);
  return a && a->commit == commit;
}

bool Deployer::is_pulled(const std::string& model, const std::string& commit) const {
  const auto it = state_.pulled.find(model);
  return it != state_.pulled.end() && std::find(it->second.begin(), it->second.end(), commit) != it->second.end();
}

asio::awaitable<void> Deployer::save_state(Running& r) {
  const sys::Fields f = r.run->fields();
  co_await save_state(f);
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
  if (running_ && !running_->record.old_stopped)
    for (auto& p : running_->record.previous)
      if (p.model == model) {
        p.started = settings;
        persist(running_->record);
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

asio::awaitable<bool> Deployer::already_serves(Running& r) {
  auto& d = r.record;
  if (d.kind != Kind::deploy) co_return false;  // a pull never touches the service
  if (auto why = co_await why_not_noop(d, *r.run)) {
    if (!why->empty()) sys::logf(sys::Level::notice, r.run->fields(), "restarting {}: {}", d.model, *why);
    co_return false;
  }
  d.changed = false;
  co_await persist_now(d);
  co_return true;
}

void Deployer::log_nothing_to_do(const Running& r, std::size_t next) const {
  const auto& d = r.record;
  for (std::size_t i = next; i < r.steps.size(); ++i) {
    sys::Fields f = r.run->fields();
    f.phase = std::string(to_string(phase_of(r.steps[i].step)));
    sys::logf(sys::Level::info, f, "{}: nothing to do: {} already serves commit {} with the same settings",
              to_string(r.steps[i].step), d.model, d.commit->substr(0, 12));
  }
}

asio::awaitable<void> Deployer::apply_pulled(Running& r) {
  const auto& d = r.record;
  // The commit in service is marked too: the cleanup after the next deployment of its model
  // then spares it (a fleet keeps the old revision until its rollout is finalized).
  if (is_pulled(d.model, *d.commit)) co_return;
  state_.pulled[d.model].push_back(*d.commit);
  co_await save_state(r);
}

bool Deployer::forget_pulled(const std::string& model, const std::optional<std::string>& commit) {
  auto it = state_.pulled.find(model);
  if (it == state_.pulled.end()) return false;
  const auto before = it->second.size();
  if (commit) std::erase(it->second, *commit);
  else it->second.clear();
  const bool changed = it->second.size() != before;
  if (it->second.empty()) state_.pulled.erase(it);
  return changed;
}

asio::awaitable<std::optional<Error>> Deployer::run_steps(Running& r, Step first) {
  auto& d = r.record;
  bool started = false;
  // Planning comes first in every plan and may change the steps after it: indexes stay valid.
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    const PlannedStep step = r.steps[i];
    if (step.step == first) started = true;
    if (!started) continue;
    // Once the new model serves, a cancel only skips what is left but the cleanup.
    if (d.cancel_requested && !r.new_serves) co_return make_error(Errc::cancelled, "cancelled by the user");
    if (d.cancel_requested && step.step != Step::cleanup) {
      sys::logf(sys::Level::notice, r.run->fields(), "cancelled once {} served: benchmark skipped", d.model);
      break;
    }
    r.step = step;
    if (owns_service(r)) {
      auto touched = touched_models(r);
      co_await stop_watching(touched);
    }
    auto res = co_await run_step(r, step.step);
    if (shutting_down_) {
      // Left recorded as running: the next daemon start continues it from this step.
      sys::logf(sys::Level::notice, r.run->fields(), "deployment {} interrupted by shutdown in phase {}", d.id,
                to_string(d.phase));
      r.interrupted = true;
      co_return std::nullopt;
    }
    // A phase cut short by a cancel once the new model serves (the benchmark) skips only itself.
    if (!res && !(d.cancel_requested && r.new_serves))
      co_return d.cancel_requested ? make_error(Errc::cancelled, "cancelled by the user") : res.error();
    // Planning resolved the commit: the model that serves it with the same settings stays as it is.
    // (GCC 12: no co_await in a conditional expression.)
    if (step.step == Step::planning && res && !d.cancel_requested) {
      const bool serves = co_await already_serves(r);
      if (serves) {
        log_nothing_to_do(r, i + 1);
        co_return std::nullopt;
      }
    }
  }
  // A cancel that came as the last step began found nothing to stop: it ends the deployment now.
  if (d.cancel_requested && !r.new_serves) co_return make_error(Errc::cancelled, "cancelled by the user");
  co_return std::nullopt;
}

asio::awaitable<bool> Deployer::must_roll_back(Running& r, const Error& failure) {
  auto& d = r.record;
  if (!d.old_stopped || d.previous.empty() || d.kind == Kind::stop || r.new_serves || serves_new(d)) {
    const std::optional<Error> why = failure;
    co_await finish(r, failure.code == Errc::cancelled ? State::cancelled : State::failed, why);
    co_return false;
  }
  // Whether the revision that served is still on disk. Not the link: a redeploy of the same
  // model at a new commit has switched models_dir/NAME to the new revision already, and the
  // rollback switches it back. A stat: on the disk pool (by reference only: GCC 12).
  auto& st = services_.store;
  const auto& previous = d.previous;
  const bool any_on_disk = co_await util::on_pool<bool>(services_.disk_pool, [&] {
    return std::any_of(previous.begin(), previous.end(), [&](const ActiveRecord& a) {
      std::error_code ec;
      return std::filesystem::is_directory(st.revision_dir(a.model, a.commit), ec);
    });
  });
  if (!any_on_disk) {
    // allow_downtime evicted them: there is nothing to bring back.
    std::vector<std::string> names;
    for (const auto& a : previous) names.push_back(a.model);
    const std::optional<Error> why = make_error(
        Errc::rollback_failed,
        fmt::format("{}; model{} {} {} evicted to make room (allow_downtime) and cannot be restored{}", failure.message,
                    names.size() == 1 ? "" : "s", fmt::join(names, ", "), names.size() == 1 ? "was" : "were",
                    state_.active ? "" : ": no model serves"));
    co_await finish(r, State::failed, why);
    co_return false;
  }
  sys::logf(sys::Level::error, r.run->fields(), "phase {} failed after the old model was stopped: {}; rolling back",
            to_string(d.phase), failure.message);
  d.error = failure;
  co_return true;
}

asio::awaitable<void> Deployer::drive(std::shared_ptr<Running> rp, std::optional<Step> first) {
  Running& r = *rp;
  if (first) {
    auto failure = co_await run_steps(r, *first);
    if (r.interrupted) {
      co_await persist_now(r.record);
      running_.reset();
      if (on_idle_) on_idle_();
      co_return;
    }
    if (!failure) {
      if (r.record.kind == Kind::pull) co_await apply_pulled(r);
      const std::optional<Error> none;
      co_await finish(r, State::succeeded, none);
      co_return;
    }
    if (!co_await must_roll_back(r, *failure)) co_return;
  }
  co_await roll_back(r);
}

asio::awaitable<void> Deployer::roll_back(Running& r) {
  auto& d = r.record;
  // rolling_back is not cancellable: leaving the host with nothing serving is worse.
  r.step.reset();
  r.rolling_back = true;
  auto touched = touched_models(r);
  co_await stop_watching(touched);
  d.phase = Phase::rolling_back;
  co_await persist_now(d);
  emit(EventKind::phase, d);
  announce_status();
  asio::cancellation_signal never;
  auto body = run_rolling_back(r.services, *r.run);
  auto res = co_await in_child(io_, never.slot(), body, "rolling_back");
  // The outage lasts until the old models serve again.
  if (res && res->readiness.ready_ns) {
    const std::optional<Readiness> back = res->readiness;
    co_await apply_started(r, res->launched.start_requested_ns, back);
  }
  const std::string first_reason = d.error ? d.error->message : "interrupted by a daemon restart";
  if (!res) {
    r.not_restored = models_of(d.previous);
    const bool bug = res.error().code == Errc::internal;
    std::string why = bug ? "an internal error" : res.error().message;
    const std::optional<Error> failed =
        make_error(Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, why));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  const auto& back = res->restored;
  const std::string serve_again =
      back.empty() ? std::string()
                   : fmt::format("{} serve{} again", fmt::join(back, ", "), back.size() == 1 ? "s" : "");
  if (res->failed.size() == 1 && back.empty()) {
    r.not_restored.insert(res->failed.front().first);
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed too: {}", first_reason, res->failed.front().second));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  if (!res->failed.empty()) {
    std::vector<std::string> failures;
    for (const auto& [model, why] : res->failed) {
      r.not_restored.insert(model);
      failures.push_back(fmt::format("{}: {}", model, why));
    }
    const std::optional<Error> failed = make_error(
        Errc::rollback_failed, fmt::format("{}; rollback failed for {}{}", first_reason, fmt::join(failures, "; "),
                                           serve_again.empty() ? std::string() : "; " + serve_again));
    co_await finish(r, State::failed, failed);
    co_return;
  }
  const std::optional<Error> rolled_back =
      Error{d.error ? d.error->code : Errc::internal, fmt::format("{}; rolled back: {}", first_reason, serve_again)};
  co_await finish(r, State::rolled_back, rolled_back);
}

namespace {

// The terminal journal line of ended record `d` (MODELD_STATE, its MESSAGE_ID); `port` is where a
// deployment that succeeded serves (unknown: not named); `note` ends the message.
void log_end(const Deployment& d, std::optional<unsigned> port, std::string_view note) {
  sys::Fields f = record_fields(d);
  f.state = std::string(to_string(d.state));
  switch (d.state) {
    case State::succeeded: f.message_id = message_id::succeeded; break;
    case State::rolled_back: f.message_id = message_id::rolled_back; break;
    case State::cancelled: f.message_id = message_id::cancelled; break;
    default: f.message_id = message_id::failed; break;
  }
  const auto commit = d.commit ? d.commit->substr(0, 12) : std::string("?");
  if (d.state == State::succeeded && d.kind == Kind::stop)
    sys::logf(sys::Level::notice, f, "stop {} succeeded: model {} is out of service; its files stay on disk{}", d.id,
              d.model, note);
  else if (d.state == State::succeeded && d.kind == Kind::pull)
    sys::logf(sys::Level::notice, f, "pull {} succeeded: model {} at {} is on disk and verified{}{}", d.id, d.model,
              commit, d.changed ? "" : " (it already was: nothing changed)", note);
  else if (d.state == State::succeeded)
    sys::logf(sys::Level::notice, f, "deployment {} succeeded: model {} at {} serves{}{}{}", d.id, d.model, commit,
              port ? fmt::format(" on port {}", *port) : std::string(), d.changed ? "" : " (nothing changed)", note);
  else {
    if (d.error)
      for (const auto& file : d.error->files) f.extra.emplace_back("MODELD_FILE", file);
    sys::logf(sys::Level::error, f, "deployment {} {} in phase {}: {}{}", d.id, to_string(d.state), to_string(d.phase),
              d.error ? d.error->message : "", note);
  }
}

}  // namespace

asio::awaitable<void> Deployer::finish(Running& r, State state, const std::optional<Error>& error) {
  // The ended record is durable before anyone sees it ended, marked as not logged yet: a kill
  // before its terminal journal line is written leaves the next start to write it.
  Deployment done = r.record;
  done.state = state;
  done.error = error;
  done.finished_at = util::rfc3339(std::chrono::system_clock::now());
  // Nothing moves any more: a rate or an ETA would mislead whoever reads the record later.
  done.progress.rate_bytes_per_s = 0;
  done.progress.eta_s.reset();
  done.end_unlogged = true;
  co_await persist_now(done);
  test_hooks::crash_point("end_recorded");
  log_end(done, r.run->model.serve.port, "");
  done.end_unlogged = false;
  co_await persist_now(done);
  r.record = std::move(done);
  auto& d = r.record;
  history_.push_front(d);
  while (history_.size() > 200) history_.pop_back();
  emit(EventKind::state, d);
  running_.reset();
  // Whatever serves now is watched again, except what a failed rollback could not bring back: it is
  // not known to work, and a loop of restarts would only hide that from the operator.
  watch_services(r.not_restored);
  announce_status();
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
  if (!running_ || running_->record.id != id) {
    auto d = get(id);
    if (!d) return d.error();
    return make_error(Errc::deployment_ended, fmt::format("deployment {} already ended ({})", id, to_string(d->state)));
  }
  auto& d = running_->record;
  if (d.phase == Phase::rolling_back)
    return make_error(Errc::deployment_ended, fmt::format("deployment {} is rolling back and cannot be cancelled", id));
  d.cancel_requested = true;
  persist(d);
  sys::Fields f = running_->run->fields();
  sys::logf(sys::Level::notice, f, "cancel requested for deployment {} in phase {}", id, to_string(d.phase));
  running_->cancel.emit(asio::cancellation_type::terminal);
  return d;
}

}  // namespace modeld::deploy
