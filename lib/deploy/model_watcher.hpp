#pragma once
// The model watcher (the contract calls it the post-deploy watchdog; issue 5): while no deployment owns the model service (none runs, or
// one is still before stopping_old: Deployer::owns_service), the active model's unit is
// checked every watch_interval and probed with a cheap generation; a unit that left the active
// state (for any reason, an exit with status 0 included) or watch_failures failed probes in a row
// get the unit restarted, with exponential backoff between restarts, each one logged with why.

#include "config/config.hpp"
#include "deploy/control.hpp"
#include "deploy/phase.hpp"
#include "sys/log.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// MESSAGE_ID of the journal line of each watchdog restart.
inline constexpr const char* watchdog_restart_message_id = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f75";

/// The delay before restart number `streak` + 1 of a run of restarts: none before the first
/// (`streak` 0), then `base`, 2 x `base`, 4 x `base` ..., never more than `cap`.
std::chrono::milliseconds watchdog_backoff(unsigned streak, std::chrono::milliseconds base,
                                           std::chrono::milliseconds cap);

struct WatchRun;
struct Watched;

/// Watches the active model's service; owned by the Deployer, runs on its io_context thread.
class ModelWatcher {
 public:
  /// Waits until a (re)started server is ready; errors say why it is not.
  using ReadyWait =
      std::function<boost::asio::awaitable<Result<void>>(const config::ModelConfig&, const sys::Fields&)>;
  /// Runs one cheap probe of a serving model; health_failed, network_error, timeout with the answer.
  using Probe = std::function<boost::asio::awaitable<Result<void>>(const config::ModelConfig&)>;

  /// Timing that tests shorten; the defaults are the daemon's.
  struct Options {
    std::chrono::milliseconds backoff_base = std::chrono::seconds(10);  ///< delay before the 2nd restart of a run
    std::chrono::milliseconds backoff_max = std::chrono::minutes(10);   ///< longest delay between restarts
    /// A restarted server that stays healthy this long ends the run of restarts (backoff resets).
    std::chrono::milliseconds healthy_reset = std::chrono::minutes(5);
    ReadyWait wait_ready;  ///< empty: deploy::wait_model_ready
    Probe probe;           ///< empty: health::probe_once (a max_tokens=1 completion when health.completion)
  };

  /// `services` must outlive the ModelWatcher.
  ModelWatcher(boost::asio::io_context& io, Services& services, Options options);
  ModelWatcher(boost::asio::io_context& io, Services& services);
  ~ModelWatcher();
  ModelWatcher(const ModelWatcher&) = delete;
  ModelWatcher& operator=(const ModelWatcher&) = delete;

  /// Starts watching `model` (which must be configured; a call while running is ignored).
  /// `wait_ready_first`: the unit was just started (daemon start), so readiness is awaited
  /// within startup_timeout before the first probe instead of probing a loading server.
  void start(const std::string& model, bool wait_ready_first);

  /// Asks the watch to end (a restart in progress is abandoned wherever it is); returns at once.
  void cancel();

  /// cancel(), then waits until the watch coroutine has ended. Never throws.
  boost::asio::awaitable<void> stop();

  /// Called on the io thread with the watched model's record whenever it changes (state,
  /// counters), e.g. to refresh sd_notify STATUS= and send the Deployer's watcher event.
  void on_change(std::function<void(const WatchdogStatus&)> f) { on_change_ = std::move(f); }

  /// Called on the io thread after the watch started the model's unit again, with the settings
  /// of the drop-in it wrote first (nullopt when it could not write it: they are unknown).
  void on_started(std::function<void(const std::string&, const std::optional<StartedSettings>&)> f) {
    on_started_ = std::move(f);
  }

  /// Called on the io thread before a restart writes the drop-in: settings to start the model
  /// with instead of today's configuration (nullopt: today's), e.g. those it ran with when today's
  /// would put it onto another service's GPUs or port; an error: no restart this time (logged and
  /// shown as the watcher's pending failure, tried again at the next check).
  void restart_settings(std::function<Result<std::optional<StartedSettings>>(const std::string&)> f) {
    restart_settings_ = std::move(f);
  }

  /// One cheap probe of `m` as the watch makes it (Options::probe, else health::probe_once); errors say why it failed.
  boost::asio::awaitable<Result<void>> probe_once(const config::ModelConfig& m) { return probe(m); }

  /// Whether the watch coroutine runs.
  bool running() const { return running_; }

  /// The watched (or last watched) model first, then every other model watched since the
  /// daemon started, with counters kept across watches; empty when nothing was watched.
  std::vector<WatchdogStatus> statuses() const;

 private:
  enum class Due : int;
  boost::asio::awaitable<void> watch(std::string model, bool wait_ready_first, std::shared_ptr<WatchRun> run);
  // One check of a healthy watch: waits watch_interval, asks for the unit's state and probes
  // it; sets w.pending when a restart is due. False: the watch is to end.
  boost::asio::awaitable<bool> check(Watched& w);
  // Once a restart is due: backs off, looks again, and refuses to start files that changed.
  boost::asio::awaitable<Due> confirm_restart(Watched& w);
  // Restarts the unit (stopping it first when `up`) and waits until it is ready; a failure
  // leaves w.pending set for the next attempt. False: the watch is to end.
  boost::asio::awaitable<bool> restart(Watched& w, bool up);
  void set_state(WatchdogStatus& rec, const char* state);
  boost::asio::awaitable<Result<void>> ready(const config::ModelConfig& m, const sys::Fields& f);
  boost::asio::awaitable<Result<void>> probe(const config::ModelConfig& m);
  WatchdogStatus& record(const std::string& model);
  void changed();

  boost::asio::io_context& io_;
  Services& services_;
  Options options_;
  bool running_ = false;
  std::string current_;  ///< the model watched now or last
  std::map<std::string, WatchdogStatus> records_;
  std::shared_ptr<WatchRun> run_;  ///< the current or last watch
  std::function<void(const WatchdogStatus&)> on_change_;
  std::function<void(const std::string&, const std::optional<StartedSettings>&)> on_started_;
  /// Completion handlers of stop() calls waiting for the coroutine to end.
  std::vector<std::function<void()>> on_stopped_;
  std::function<Result<std::optional<StartedSettings>>(const std::string&)> restart_settings_;
};

}  // namespace modeld::deploy
