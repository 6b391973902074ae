#pragma once
// The run of one record (a deployment, a pull or a stop) from its first step to its end: it owns
// the record, what the phases read of it (Run), the plan and the cancellation of the phase that
// runs now, is the phases' Decisions sink, walks the plan through the phase table
// (phase_table.hpp: one row per step, each running its phase and applying the result), rolls back
// and ends the record. It talks back to the Deployer only through a RunSink. Runs on the event
// loop and never blocks it. Private to lib/deploy; no phase includes it.

#include "deploy/phase.hpp"
#include "deploy/state_store.hpp"
#include "deploy/steps.hpp"
#include "deploy/switch_strategy.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

/// What a run of one record needs of the Deployer, and all it may reach of it.
class RunSink {
 public:
  virtual ~RunSink() = default;
  /// Writes record `d` on the disk pool after every write queued before, and waits for it.
  virtual boost::asio::awaitable<void> persist_now(const Deployment& d) = 0;
  /// The daemon's state, which the run changes (services put into or out of service, pulled
  /// marks) and then saves with save_state.
  virtual DaemonState& state() = 0;
  /// Writes state.json on the disk pool (awaited), logging under `f` (not failing) when it cannot.
  virtual boost::asio::awaitable<void> save_state(const sys::Fields& f) = 0;
  /// Tells every listener about record `d` as an event of `kind`; returns at once.
  virtual void emit(EventKind kind, const Deployment& d) = 0;
  /// Sends the daemon's STATUS= line (sd_notify); returns at once.
  virtual void announce_status() = 0;
  /// Stops the model watchers of `models` (cancelled, awaited) before the run touches their services.
  virtual boost::asio::awaitable<void> pause_watchers(const std::set<std::string>& models) = 0;
  /// Of the services in service but those in `except`, the first that `p` conflicts with:
  /// "MODEL (why)"; nullopt when none does. Does not block.
  virtual std::optional<std::string> placement_taken(const Placement& p, const std::set<std::string>& except) const = 0;
  /// The no-op rule (Deployer::why_not_noop): nullopt when deployment `d` would change nothing,
  /// else why not ("" when its model does not serve that commit). Probes the serving model once.
  virtual boost::asio::awaitable<std::optional<std::string>> why_not_noop(const Deployment& d, const Run& run) = 0;
  /// Whether the daemon is shutting down (a phase cut short then leaves the record running).
  virtual bool shutting_down() const = 0;
  /// The run ended with record `d` (durable, logged): it joins the history, listeners are told,
  /// what serves is watched again but `not_restored`, and STATUS= says so. Returns at once.
  virtual void ended(const Deployment& d, const std::set<std::string>& not_restored) = 0;
  /// A shutdown cut the run short; its record, left running and persisted, continues at the next start.
  virtual void interrupted() = 0;
};

/// The run of one record: its record, Run, plan and phase cancellation; see the file's comment.
class RecordRun final : public Decisions, public std::enable_shared_from_this<RecordRun> {
 public:
  /// A run of `record` with `services` (the configuration it started with, kept for its whole
  /// run) and what `state`, the daemon's state now, says of the services in service; nothing
  /// runs until start(). `io` and `sink` must outlive it.
  RecordRun(boost::asio::io_context& io, Services services, Deployment record, const DaemonState& state,
            RunSink& sink);
  RecordRun(const RecordRun&) = delete;
  RecordRun& operator=(const RecordRun&) = delete;

  /// Runs the record from step `first` (Step::rolling_back: it rolls back) to its end, as a
  /// coroutine on the event loop that keeps this object alive; returns at once.
  void start(Step first);

  /// The record as it stands (the Deployer may mark a cancel or a watchdog's restart in it).
  const Deployment& record() const { return record_; }
  Deployment& record() { return record_; }
  /// The journal fields of the run in its current phase.
  sys::Fields fields() const { return run_->fields(); }
  /// The services with the configuration the run started with.
  const Services& services() const { return services_; }
  /// Whether the run owns the services it touches: its step touches them, it rolls back, or the
  /// old servers were stopped. Until then their watchers keep watching (a download takes hours).
  bool owns_service() const;
  /// The switch strategy the run switches with (its record's switch_method).
  const SwitchStrategy& strategy() const { return *switch_; }
  /// Whether the run has taken its strategy's durable decision: a failure now rolls back.
  bool committed() const { return switch_->committed(record_); }
  /// The models whose services the run stops or starts: its own and those in conflict with it.
  std::set<std::string> touched_models() const;
  /// Asks the phase that runs now to stop (a cancel or a shutdown); returns at once.
  void cancel();
  /// The STATUS= line of the run, e.g. "downloading kimi-k2-5: 37% of 547.0 GB, ...".
  std::string status_line() const;

  // Decisions (the phases' sink)
  boost::asio::awaitable<void> commit_chosen(const std::string& commit) override;
  boost::asio::awaitable<void> stopping_old() override;
  void progress(const fetch::Progress& p) override;
  void warm_progress(const WarmReport& w) override;

  // What the phase table's rows use (phase_table.cpp, a switch strategy's file: restart_switch.cpp).
  /// Services for a phase to use (non-const: phases take them so).
  Services& phase_services() { return services_; }
  /// What the phases read; a row changes it only to apply its phase's result.
  Run& run() { return *run_; }
  /// The Deployer's side.
  RunSink& sink() { return sink_; }
  /// Runs `body`, the phase of the current row, as a child coroutine bound to the run's cancel
  /// (`cancellable`) or to nothing (it cannot be cancelled); a bug's exception becomes internal.
  template <class T>
  boost::asio::awaitable<Result<T>> in_child(boost::asio::awaitable<Result<T>>& body, bool cancellable = true);
  /// Writes the record (awaited).
  boost::asio::awaitable<void> persist();
  /// Writes the daemon's state (awaited), logging under the run's fields when it cannot.
  boost::asio::awaitable<void> save_state();
  /// Planning decided the order: the plan computed again from the record (kind, downtime_first, strategy).
  void replan();
  /// The new model serves (health_checking passed, or resumed after it).
  void set_new_serves() { new_serves_ = true; }
  /// A row of the strategy gives up for `why`: the run switches with the strategy's fallback from
  /// that one's first step after warming (recorded, persisted, logged; awaited), and the row then
  /// returns success. False (nothing changed) when the strategy has no fallback: the row returns
  /// its error. (A row that gives up after its durable decision must leave nothing serving that
  /// the fallback's steps would not replace.) `why` by reference: pass an lvalue (GCC 12).
  boost::asio::awaitable<bool> fall_back(const std::string& why);
  /// Models a failed rollback could not bring back: not watched once the run ends.
  std::set<std::string>& not_restored() { return not_restored_; }
  /// Before the run stops or starts anything: model_active when a service it does not stop now
  /// conflicts with its model (e.g. restarted on today's GPUs after the run began).
  std::optional<Error> switch_conflict() const;
  /// Whether the daemon's state says the record's model serves its commit (never for a restart
  /// of a commit that served when it started).
  bool serves_new() const;
  /// Ends the run: the record written (awaited) before it shows ended, its terminal journal line,
  /// the sink told. Arguments by reference: GCC 12 destroys class temporaries passed to a coroutine twice.
  boost::asio::awaitable<void> finish(State state, const std::optional<Error>& error);

 private:
  // Runs the record `self` from `first` to its end (or its interruption); keeps it alive meanwhile.
  static boost::asio::awaitable<void> drive(std::shared_ptr<RecordRun> self, Step first);
  // Runs the plan's steps from `first`: nullopt when the record succeeded (a cancel once the new
  // model serves only skips the benchmark), else why it stopped; sets interrupted_ on a shutdown.
  boost::asio::awaitable<std::optional<Error>> run_steps(Step first);
  // Enters the row of `s` (its phase recorded and announced unless it shows another's) and runs it.
  boost::asio::awaitable<Result<void>> run_row(Step s);
  // After planning: whether the model already serves its commit with the same settings and is
  // ready (then the record says changed: false, persisted); logs why it restarts it otherwise.
  boost::asio::awaitable<bool> already_serves();
  // After planning, before the switch: the strategy that applies (choose_switch) recorded, the
  // plan computed with it, persisted and logged; a run that fell back keeps its fallback.
  boost::asio::awaitable<void> choose_strategy();
  // The run switches with `strategy` from here: recorded in the record (empty for restart) and
  // the plan computed with it; the caller persists.
  void switch_with(const SwitchStrategy& strategy);
  // The index in the plan where the run continues after a fallback: the strategy's first step
  // after warming.
  std::size_t fallback_index() const;
  // The journal line "nothing to do" of each step of the plan from index `next` on.
  void log_nothing_to_do(std::size_t next) const;
  // A pull succeeded: its commit marked as pulled in the daemon's state (unless it already is).
  boost::asio::awaitable<void> apply_pulled();
  // After `failure`: ends the record and returns false, or returns true when it rolls back.
  boost::asio::awaitable<bool> must_roll_back(const Error& failure);
  // rolling_back (not cancellable), then the end of the record.
  boost::asio::awaitable<void> roll_back();
  // A stop decided: its model out of service in the daemon's state, saved (awaited).
  boost::asio::awaitable<void> take_out_of_service();

  boost::asio::io_context& io_;
  Services services_;
  RunSink& sink_;
  Deployment record_;
  std::unique_ptr<Run> run_;
  std::optional<config::ModelConfig> own_model_;  ///< a stop of a model no longer configured: its name, port
  const SwitchStrategy* switch_;                   ///< the record's switch strategy
  std::vector<PlannedStep> steps_;                 ///< the plan, from the record (kind, downtime_first, strategy)
  std::optional<PlannedStep> step_;                ///< the step that runs now; nullopt before the first
  bool rolling_back_ = false;                      ///< rolling_back runs (not a step of the plan)
  bool new_serves_ = false;                        ///< this record's model serves
  bool interrupted_ = false;                       ///< a shutdown cut it short
  bool fell_back_ = false;                         ///< the row that ran last fell back to another strategy
  std::set<std::string> not_restored_;
  boost::asio::cancellation_signal cancel_;        ///< bound to the phase that runs now
  std::chrono::steady_clock::time_point last_journal_progress_{};
  std::chrono::steady_clock::time_point last_status_{};
};

/// MESSAGE_IDs of catalogued journal events (packaging/modeld.catalog explains them).
namespace message_id {
inline constexpr const char* started = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f70";
inline constexpr const char* succeeded = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f71";
inline constexpr const char* failed = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f72";
inline constexpr const char* rolled_back = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f73";
inline constexpr const char* cancelled = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f74";
}  // namespace message_id

/// What the journal and refusals call a record of kind `k`: "deployment", "pull" or "stop".
std::string_view noun_of(Kind k);

/// The terminal journal line of ended record `d` (MODELD_STATE and its MESSAGE_ID); `port` is
/// where a deployment that succeeded serves (nullopt: not named); `note` ends the message.
void log_end(const Deployment& d, std::optional<unsigned> port, std::string_view note);

}  // namespace modeld::deploy

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

namespace modeld::deploy {

template <class T>
boost::asio::awaitable<Result<T>> RecordRun::in_child(boost::asio::awaitable<Result<T>>& body, bool cancellable) {
  namespace asio = boost::asio;
  // A child coroutine bound to the run's cancellation signal, so a cancel (or SIGTERM) reaches every
  // operation inside it; one not cancellable is bound to a signal nothing emits.
  const std::string_view step = step_ ? to_string(step_->step) : to_string(Step::rolling_back);
  asio::cancellation_signal never;
  const auto slot = cancellable ? cancel_.slot() : never.slot();
  auto [ex, result] =
      co_await asio::co_spawn(io_, std::move(body), asio::bind_cancellation_slot(slot, asio::as_tuple(asio::use_awaitable)));
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

}  // namespace modeld::deploy
