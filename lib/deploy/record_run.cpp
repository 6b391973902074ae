// The run of one record: the walk of its plan through the phase table, the no-op rule after
// planning, the rollback, the end, and the phases' Decisions sink with their progress.
#include "deploy/record_run.hpp"
#include "deploy/phase_table.hpp"
#include "deploy/placement.hpp"

#include "fetch/fetch.hpp"
#include "store/store.hpp"
#include "sys/log.hpp"
#include "sys/task.hpp"
#include "util/on_pool.hpp"
#include "util/quantities.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"

#include <boost/asio/co_spawn.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <utility>

namespace modeld::deploy {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

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

RecordRun::RecordRun(asio::io_context& io, Services services, Deployment record, const DaemonState& state,
                     RunSink& sink)
    : io_(io), services_(std::move(services)), sink_(sink), record_(std::move(record)),
      switch_(&switch_named(services_, record_.switch_method)) {
  const auto& cfg = *services_.config;
  const auto* model = cfg.find_model(record_.model);
  if (!model) {
    // A stop of a model that left the configuration: its name, and the port it was started on.
    own_model_ = config::ModelConfig{};
    own_model_->name = record_.model;
    if (!record_.previous.empty()) own_model_->serve.port = placement_of(record_.previous.front(), nullptr).port;
    model = &*own_model_;
  }
  Serving serving{models_of(state.active.services), models_of(record_.previous)};
  std::vector<Placement> staying;
  for (const auto& a : state.active.services)
    if (!serving.stopped.contains(a.model) && a.model != record_.model)
      staying.push_back(placement_of(a, cfg.find_model(a.model)));
  run_ = std::make_unique<Run>(Run{.record = record_,
                                   .model = *model,
                                   .serving = std::move(serving),
                                   .staying = std::move(staying),
                                   .last_active = state.last_active,
                                   .pulled = state.pulled});
  replan();
}

void RecordRun::start(Step first) {
  new_serves_ = first == Step::cleanup;  // resumed after its health check
  asio::co_spawn(io_, drive(shared_from_this(), first), sys::log_failure("deployment coroutine"));
}

bool RecordRun::owns_service() const {
  return committed() || rolling_back_ || (step_ && step_->touches_service);
}

std::set<std::string> RecordRun::touched_models() const {
  auto out = models_of(record_.previous);
  out.insert(record_.model);
  return out;
}

void RecordRun::cancel() { cancel_.emit(asio::cancellation_type::terminal); }

std::string RecordRun::status_line() const {
  const auto& d = record_;
  std::string s = fmt::format("{} {}", verb_of(d.phase), d.model);
  if (d.phase == Phase::warming && d.warm && d.warm->bytes_total > 0) {
    const auto in_cache = d.warm->bytes_resident_before + d.warm->bytes_warmed;
    s += fmt::format(": {}% of {} in memory", std::min<std::uint64_t>(100, in_cache * 100 / d.warm->bytes_total),
                     util::format_bytes(d.warm->bytes_total));
  }
  if (d.phase == Phase::downloading && d.progress.bytes_total > 0) {
    const auto& p = d.progress;
    s += fmt::format(": {}% of {}", p.bytes_done * 100 / p.bytes_total, util::format_bytes(p.bytes_total));
    if (p.rate_bytes_per_s > 0) s += ", " + util::format_rate(p.rate_bytes_per_s);
    if (p.eta_s) s += ", " + util::format_duration(std::chrono::seconds(static_cast<long long>(*p.eta_s))) + " left";
  }
  return s;
}

asio::awaitable<void> RecordRun::commit_chosen(const std::string& commit) {
  record_.commit = commit;
  co_await persist();
}

asio::awaitable<void> RecordRun::stopping_old() {
  record_.old_stopped = true;
  // A restart mid-switch keeps the first request's time: the outage began there.
  auto& marks = record_.switch_marks;
  if (!marks.stop_requested_ns) marks.stop_requested_ns = wall_clock_ns();
  co_await persist();
  // A stop decided: from here on the model is out of service, neither watched nor started at boot.
  if (record_.kind == Kind::stop) co_await take_out_of_service();
}

namespace {

// The files in flight for the journal's progress line: four at most, then how many more.
std::string files_in_flight(const std::vector<FileProgress>& files) {
  std::string out;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const auto& fp = files[i];
    if (i == 4) {
      out += fmt::format(", and {} more", files.size() - i);
      break;
    }
    out += fmt::format("{}{} {}%", out.empty() ? "" : ", ", fp.path,
                       fp.bytes_total ? fp.bytes_done * 100 / fp.bytes_total : 100);
    if (fp.rate_bytes_per_s > 0) out += " at " + util::format_rate(fp.rate_bytes_per_s);
    if (fp.connections > 1) out += fmt::format(" over {} connections", fp.connections);
  }
  return out;
}

// Download progress `p` into `progress`, with the rates' ETAs.
void take_progress(Progress& progress, const fetch::Progress& p) {
  progress.bytes_done = p.bytes_done;
  progress.bytes_total = p.bytes_total;
  progress.files_done = p.files_done;
  progress.files_total = p.files_total;
  progress.rate_bytes_per_s = p.rate_bytes_per_s;
  if (p.rate_bytes_per_s > 0 && p.bytes_total >= p.bytes_done)
    progress.eta_s = static_cast<double>(p.bytes_total - p.bytes_done) / p.rate_bytes_per_s;
  else
    progress.eta_s.reset();
  progress.files.clear();
  for (const auto& f : p.files) {
    FileProgress fp{f.path, f.bytes_done, f.bytes_total, f.rate_bytes_per_s, std::nullopt, f.connections};
    if (f.rate_bytes_per_s > 0 && f.bytes_total >= f.bytes_done)
      fp.eta_s = static_cast<double>(f.bytes_total - f.bytes_done) / f.rate_bytes_per_s;
    progress.files.push_back(std::move(fp));
  }
}

}  // namespace

void RecordRun::progress(const fetch::Progress& p) {
  take_progress(record_.progress, p);
  sink_.emit(EventKind::progress, record_);
  auto now = Clock::now();
  if (now - last_status_ >= std::chrono::seconds(1)) {
    last_status_ = now;
    sink_.announce_status();
  }
  // The journal gets at most one progress line every 5 s (the API and SSE get every update),
  // naming the files in flight so a stuck shard stands out.
  if (now - last_journal_progress_ >= std::chrono::seconds(5) || p.bytes_done == p.bytes_total) {
    last_journal_progress_ = now;
    sys::Fields f = fields();
    f.extra.emplace_back("MODELD_BYTES", std::to_string(p.bytes_done));
    std::string line = status_line();
    if (const auto files = files_in_flight(record_.progress.files); !files.empty()) line += "; in flight: " + files;
    sys::log(sys::Level::info, f, line);
  }
}

void RecordRun::warm_progress(const WarmReport& w) {
  record_.warm = w;
  sink_.emit(EventKind::progress, record_);
  if (auto now = Clock::now(); now - last_status_ >= std::chrono::seconds(1)) {
    last_status_ = now;
    sink_.announce_status();
  }
}

asio::awaitable<void> RecordRun::persist() { co_await sink_.persist_now(record_); }

asio::awaitable<void> RecordRun::save_state() {
  const sys::Fields f = fields();
  co_await sink_.save_state(f);
}

void RecordRun::replan() { steps_ = plan_steps(record_.kind, record_.downtime_first, *switch_); }

asio::awaitable<void> RecordRun::choose_strategy() {
  // A run that fell back keeps its fallback when it plans again after a restart.
  if (!record_.switch_fallback.empty()) co_return;
  const auto choice = choose_switch(services_, SwitchQuery{record_, run_->model});
  switch_with(*choice.strategy);
  co_await persist();
  sys::logf(sys::Level::info, fields(), "the switch of {} will be a {}: {}", record_.model, switch_->method,
            choice.why);
}

asio::awaitable<bool> RecordRun::fall_back(const std::string& why) {
  const auto* next = switch_->fallback.empty() ? nullptr : &switch_named(services_, switch_->fallback);
  if (!next || next == switch_) co_return false;
  sys::logf(sys::Level::warning, fields(), "the {} of {} falls back to a {}: {}", switch_->method, record_.model,
            next->method, why);
  switch_with(*next);
  record_.switch_fallback = why;
  co_await persist();
  fell_back_ = true;
  co_return true;
}

void RecordRun::switch_with(const SwitchStrategy& strategy) {
  switch_ = &strategy;
  record_.switch_method = switch_ == &restart_switch() ? std::string() : std::string(switch_->method);
  replan();
}

std::size_t RecordRun::fallback_index() const {
  const auto own = switch_->steps(record_.downtime_first);
  if (own.after_warming.empty()) return steps_.size();
  for (std::size_t i = 0; i < steps_.size(); ++i)
    if (steps_[i].step == own.after_warming.front()) return i;
  return steps_.size();
}

std::optional<Error> RecordRun::switch_conflict() const {
  const auto& d = record_;
  if (d.kind != Kind::deploy) return std::nullopt;
  const auto* m = services_.config->find_model(d.model);
  if (!m) return std::nullopt;
  std::set<std::string> except = models_of(d.previous);
  except.insert(d.model);
  const auto taken = sink_.placement_taken(placement_of(*m), except);
  if (!taken) return std::nullopt;
  return make_error(Errc::model_active,
                    fmt::format("not starting {} beside {}: that service came into its place after this deployment "
                                "began (it stops only the services in conflict when it starts); deploy {} again to "
                                "stop it first",
                                d.model, *taken, d.model));
}

bool RecordRun::serves_new() const {
  const auto& d = record_;
  // A restart of the commit that serves (its settings changed, or asked for) finds the state
  // naming that commit from the start: only its own health check says the new server serves.
  for (const auto& a : d.previous)
    if (a.model == d.model && a.commit == d.commit) return false;
  const auto* a = sink_.state().active.find(d.model);
  return a && a->commit == d.commit;
}

asio::awaitable<Result<void>> RecordRun::run_row(Step s) {
  const auto& row = row_of(s, *switch_);
  if (row.shows_own_phase) {
    record_.phase = row.phase;
    co_await persist();
    sink_.emit(EventKind::phase, record_);
    sink_.announce_status();
  }
  co_return co_await row.run(*this);
}

asio::awaitable<std::optional<Error>> RecordRun::run_steps(Step first) {
  auto& d = record_;
  bool started = false;
  // Planning comes first in every plan and may change the steps after it: indexes stay valid.
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const PlannedStep step = steps_[i];
    if (step.step == first) started = true;
    if (!started) continue;
    // Once the new model serves, a cancel only skips what is left but the cleanup.
    if (d.cancel_requested && !new_serves_) co_return make_error(Errc::cancelled, "cancelled by the user");
    if (d.cancel_requested && step.step != Step::cleanup) {
      sys::logf(sys::Level::notice, fields(), "cancelled once {} served: benchmark skipped", d.model);
      break;
    }
    step_ = step;
    if (owns_service()) {
      const auto touched = touched_models();
      co_await sink_.pause_watchers(touched);
    }
    auto res = co_await run_row(step.step);
    if (sink_.shutting_down()) {
      // Left recorded as running: the next daemon start continues it from this step.
      sys::logf(sys::Level::notice, fields(), "deployment {} interrupted by shutdown in phase {}", d.id,
                to_string(d.phase));
      interrupted_ = true;
      co_return std::nullopt;
    }
    // A phase cut short by a cancel once the new model serves (the benchmark) skips only itself.
    if (!res && !(d.cancel_requested && new_serves_))
      co_return d.cancel_requested ? make_error(Errc::cancelled, "cancelled by the user") : res.error();
    // Planning resolved the commit: the model that serves it with the same settings stays as it is.
    // (GCC 12: no co_await in a conditional expression.)
    if (step.step == Step::planning && res && !d.cancel_requested) {
      const bool serves = co_await already_serves();
      if (serves) {
        log_nothing_to_do(i + 1);
        co_return std::nullopt;
      }
      if (d.kind == Kind::deploy) co_await choose_strategy();
    }
    // The strategy gave up before its durable decision: its fallback's steps after warming follow.
    if (std::exchange(fell_back_, false)) i = fallback_index() - 1;
  }
  // A cancel that came as the last step began found nothing to stop: it ends the deployment now.
  if (d.cancel_requested && !new_serves_) co_return make_error(Errc::cancelled, "cancelled by the user");
  co_return std::nullopt;
}

asio::awaitable<bool> RecordRun::already_serves() {
  auto& d = record_;
  if (d.kind != Kind::deploy) co_return false;  // a pull never touches the service
  if (auto why = co_await sink_.why_not_noop(d, *run_)) {
    if (!why->empty()) sys::logf(sys::Level::notice, fields(), "restarting {}: {}", d.model, *why);
    co_return false;
  }
  d.changed = false;
  co_await persist();
  co_return true;
}

void RecordRun::log_nothing_to_do(std::size_t next) const {
  const auto& d = record_;
  for (std::size_t i = next; i < steps_.size(); ++i) {
    sys::Fields f = fields();
    f.phase = std::string(to_string(phase_of(steps_[i].step)));
    sys::logf(sys::Level::info, f, "{}: nothing to do: {} already serves commit {} with the same settings",
              to_string(steps_[i].step), d.model, d.commit->substr(0, 12));
  }
}

asio::awaitable<void> RecordRun::apply_pulled() {
  const auto& d = record_;
  auto& pulled = sink_.state().pulled;
  // The commit in service is marked too: the cleanup after the next deployment of its model
  // then spares it (a fleet keeps the old revision until its rollout is finalized).
  if (is_pulled(pulled, d.model, *d.commit)) co_return;
  pulled[d.model].push_back(*d.commit);
  co_await save_state();
}

asio::awaitable<void> RecordRun::take_out_of_service() {
  auto& state = sink_.state();
  if (!state.active.erase(record_.model)) co_return;
  state.last_active[record_.model] = util::rfc3339(std::chrono::system_clock::now());
  co_await save_state();
}

asio::awaitable<bool> RecordRun::must_roll_back(const Error& failure) {
  auto& d = record_;
  if (!committed() || d.previous.empty() || d.kind == Kind::stop || new_serves_ || serves_new()) {
    const std::optional<Error> why = failure;
    co_await finish(failure.code == Errc::cancelled ? State::cancelled : State::failed, why);
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
                    sink_.state().active ? "" : ": no model serves"));
    co_await finish(State::failed, why);
    co_return false;
  }
  sys::logf(sys::Level::error, fields(), "phase {} failed after the old model was stopped: {}; rolling back",
            to_string(d.phase), failure.message);
  d.error = failure;
  co_return true;
}

asio::awaitable<void> RecordRun::drive(std::shared_ptr<RecordRun> self, Step first) {
  RecordRun& r = *self;
  if (first != r.switch_->rollback) {
    auto failure = co_await r.run_steps(first);
    if (r.interrupted_) {
      co_await r.persist();
      r.sink_.interrupted();
      co_return;
    }
    if (!failure) {
      if (r.record_.kind == Kind::pull) co_await r.apply_pulled();
      const std::optional<Error> none;
      co_await r.finish(State::succeeded, none);
      co_return;
    }
    if (!co_await r.must_roll_back(*failure)) co_return;
  }
  co_await r.roll_back();
}

asio::awaitable<void> RecordRun::roll_back() {
  step_.reset();
  rolling_back_ = true;
  const auto touched = touched_models();
  co_await sink_.pause_watchers(touched);
  // The row enters rolling_back (recorded and announced), runs it and ends the record.
  auto ended = co_await run_row(switch_->rollback);
  (void)ended;
}

asio::awaitable<void> RecordRun::finish(State state, const std::optional<Error>& error) {
  // The ended record is durable before anyone sees it ended, marked as not logged yet: a kill
  // before its terminal journal line is written leaves the next start to write it.
  Deployment done = record_;
  done.state = state;
  done.error = error;
  done.finished_at = util::rfc3339(std::chrono::system_clock::now());
  // Nothing moves any more: a rate or an ETA would mislead whoever reads the record later.
  done.progress.rate_bytes_per_s = 0;
  done.progress.eta_s.reset();
  done.end_unlogged = true;
  co_await sink_.persist_now(done);
  test_hooks::crash_point("end_recorded");
  log_end(done, run_->model.serve.port, "");
  done.end_unlogged = false;
  co_await sink_.persist_now(done);
  record_ = std::move(done);
  // Whatever serves now is watched again, except what a failed rollback could not bring back: it is
  // not known to work, and a loop of restarts would only hide that from the operator.
  sink_.ended(record_, not_restored_);
}

}  // namespace modeld::deploy
