#pragma once
// The daemon's lifecycle (ARCHITECTURE.md "Lifecycle"): start builds the pipeline's parts,
// listens and tells systemd READY; reload (SIGHUP) takes over a re-read configuration; stop
// (SIGTERM, SIGINT) emits the one cancellation tree every task hangs off, and the event loop
// ends once the deployer has put its work down (or after a grace period).

#include "config/config.hpp"
#include "control/metrics.hpp"
#include "control/server.hpp"
#include "deploy/deployer.hpp"
#include "http/client.hpp"
#include "hub/hub.hpp"
#include "store/store.hpp"
#include "units/service_manager.hpp"
#include "util/cancel_tree.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace modeld {

struct Token;

/// The running daemon: owns the event loop, the disk pool, every part of the pipeline and the
/// root of the cancellation tree. Use from the thread that calls run().
class Daemon {
 public:
  /// A daemon for `config`, read from `config_file` (which a reload reads again); builds nothing yet.
  Daemon(std::shared_ptr<const config::Config> config, std::string config_file);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  /// Reads the Hub token, builds the pipeline's parts, listens on the control socket (and the
  /// metrics address), tells systemd READY and queues the recovery of the last deployment, the
  /// watchdog pet and the signal handlers. Errors: the line to log before exiting with status 1
  /// (a bad token file, hub.endpoint, models_dir, state_dir, the control socket). Blocks only on
  /// start-up file and socket work.
  Result<void> start();

  /// Runs the event loop until stop() has ended (or its grace period ran out), then waits for the
  /// disk pool's jobs; blocks. Exceptions of a bug in a handler propagate.
  void run();

  /// SIGHUP: re-reads the configuration on the disk pool and takes it over when it is valid, with
  /// RELOADING=1 / READY=1 around it. One reload at a time; a call during one runs another after
  /// it, so the last edit is always read. Ignored once stopping. Returns at once.
  void reload();

  /// SIGTERM, SIGINT (`why` names it in the log): STOPPING=1, then one emit of the cancellation
  /// tree stops the control server, the metrics listener and the deployer (its model watcher and
  /// the running deployment, left recorded `running`); a reload in progress takes nothing over.
  /// The loop ends when the deployer is idle, or after 10 s. Idempotent; returns at once.
  void stop(std::string_view why);

 private:
  void start_disk_pool();
  Result<void> connect_hub(const Token& token);
  Result<void> open_models();
  Result<void> open_control();
  Result<void> adopt_socket(int fd);
  void open_metrics_listener();
  boost::asio::awaitable<void> reload_config();
  void take_over(config::LoadResult fresh);
  boost::asio::awaitable<void> handle_signals();
  boost::asio::awaitable<void> pet_watchdog(std::chrono::microseconds interval);
  void finish();

  std::shared_ptr<const config::Config> config_;  ///< the configuration at start (the deployer has the current one)
  std::string config_file_;
  /// The root every task hangs off; declared before the loop so that the coroutines the loop
  /// destroys last find their slots' signals still there.
  util::CancelTree stop_tree_;
  boost::asio::io_context io_{1};
  std::optional<boost::asio::thread_pool> disk_pool_;
  std::unique_ptr<http::Client> hub_client_;
  std::unique_ptr<http::Client> local_client_;
  std::unique_ptr<hub::Hub> hub_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<deploy::StateStore> states_;
  std::unique_ptr<units::ServiceManager> units_;
  std::unique_ptr<deploy::Deployer> deployer_;
  std::unique_ptr<control::MetricsCollector> metrics_;
  std::unique_ptr<control::Server> server_;
  std::unique_ptr<control::MetricsListener> metrics_listener_;
  boost::asio::signal_set signals_{io_};
  boost::asio::steady_timer grace_{io_};
  bool stopping_ = false;
  bool reloading_ = false;
  bool reload_again_ = false;
};

}  // namespace modeld
