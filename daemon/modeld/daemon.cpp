// The daemon's lifecycle: start, reload (SIGHUP), stop (SIGTERM, SIGINT), and the tasks that
// run for its whole life on the event loop (the signal handlers, systemd's watchdog pet).

#include "modeld/daemon.hpp"

#include "modeld/token.hpp"
#include "sys/listen_fds.hpp"
#include "sys/log.hpp"
#include "sys/notify.hpp"
#include "sys/task.hpp"
#include "sys/threads.hpp"
#include "util/files.hpp"
#include "util/on_pool.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <grp.h>
#include <sys/resource.h>
#include <unistd.h>

namespace modeld {

namespace asio = boost::asio;

namespace {

// How long a stop waits for the deployer to put its work down before the loop ends anyway
// (systemd's TimeoutStopSec= is 30 s).
constexpr auto stop_grace = std::chrono::seconds(10);

// The nice gap between the loop and the disk pool: $MODELD_DISK_NICE (0..19), else 10.
int disk_nice_gap() {
  int gap = 10;
  if (const char* v = std::getenv("MODELD_DISK_NICE"); v && *v) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 0 && n <= 19)
      gap = static_cast<int>(n);
    else
      sys::logf(sys::Level::warning, "$MODELD_DISK_NICE=\"{}\" is not 0..19; using {}", v, gap);
  }
  return gap;
}

}  // namespace

Daemon::Daemon(std::shared_ptr<const config::Config> config, std::string config_file)
    : config_(std::move(config)), config_file_(std::move(config_file)) {}

Daemon::~Daemon() = default;

Result<void> Daemon::start() {
  auto token = read_token(*config_);
  if (!token) return make_error(token.error().code, token.error().message + "; not starting");
  protect_token(*token);
  start_disk_pool();
  if (auto r = connect_hub(*token); !r) return r;
  if (auto r = open_models(); !r) return r;
  if (auto r = open_control(); !r) return r;
  open_metrics_listener();
  // Last, so that the sockets are closed before the Deployer's stop, which ends the loop at
  // once when nothing runs.
  deployer_->shutdown_on(stop_tree_.child(), [this] { finish(); });

  const auto& cfg = *config_;
  sys::logf(sys::Level::notice, "modeld {} ready: {} model(s) configured, hub {} (token: {}), models in {}",
            MODELD_VERSION, cfg.models.size(), cfg.hub.endpoint, token->source, cfg.daemon.models_dir.string());
  sys::notify_ready();
  asio::co_spawn(io_, deployer_->recover(), sys::log_failure("recovering the active model and the last deployment"));
  // Petted from the event loop itself, so a stalled loop stops the petting; it goes on until
  // the loop ends, so that a stop waiting for the deployment is not taken for a stall.
  if (auto interval = sys::watchdog_interval())
    asio::co_spawn(io_, pet_watchdog(*interval), sys::log_failure("petting systemd's watchdog"));
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.add(SIGHUP);
  asio::co_spawn(io_, handle_signals(), sys::log_failure("signal handling"));
  return {};
}

void Daemon::run() {
  io_.run();
  disk_pool_->join();
}

void Daemon::start_disk_pool() {
  // O_DIRECT writes wait for the device: more threads than cores keep hashing going meanwhile.
  const unsigned threads = std::max(8u, std::thread::hardware_concurrency());
  disk_pool_.emplace(threads);
  // Hashing and disk jobs yield the CPU to the event loop (10 nice levels below it, whatever
  // Nice= the unit sets): on a host short of cores the control socket answers and the sockets
  // are drained first; the pool gets what is left. $MODELD_DISK_NICE (0..19) sets the gap
  // (0: same priority, as tests/bench/status's baseline uses).
  const int gap = disk_nice_gap();
  errno = 0;
  const int loop_nice = ::getpriority(PRIO_PROCESS, 0);
  if (int e = gap ? sys::set_pool_niceness(*disk_pool_, threads, std::min(19, (errno ? 0 : loop_nice) + gap)) : 0)
    sys::logf(sys::Level::warning, "cannot lower the disk threads' priority: {}", std::strerror(e));
}

Result<void> Daemon::connect_hub(const Token& token) {
  const auto& cfg = *config_;
  auto endpoint = http::Url::parse(cfg.hub.endpoint);
  if (!endpoint) return make_error(Errc::config_invalid, "hub.endpoint: " + endpoint.error().message);
  http::ClientOptions hub_opts;
  hub_opts.auth_origin = endpoint->origin();
  hub_opts.bearer_token = token.value;
  hub_opts.ca_file = cfg.hub.ca_file;
  hub_opts.read_timeout = cfg.hub.read_timeout;
  // HTTPS_PROXY / http_proxy / NO_PROXY from the unit's environment (a drop-in sets them).
  hub_opts.proxy = http::ProxyConfig::from_environment();
  auto proxy = http::select_proxy(hub_opts.proxy, *endpoint);
  if (!proxy) {
    // Not fatal: the daemon still watches and restarts the model in service; downloads fail
    // with this message until the variable is fixed.
    sys::logf(sys::Level::error, "{}; downloads from the Hub will fail until it is fixed", proxy.error().message);
  } else if (*proxy)
    sys::logf(sys::Level::info, "reaching the Hub {} through the proxy {}", endpoint->origin(), (*proxy)->redacted());
  hub_client_ = std::make_unique<http::Client>(io_.get_executor(), hub_opts);
  http::ClientOptions local_opts;
  local_opts.connect_timeout = std::chrono::seconds(5);
  local_client_ = std::make_unique<http::Client>(io_.get_executor(), local_opts);
  hub_ = std::make_unique<hub::Hub>(*hub_client_, cfg.hub.endpoint);
  hub_->set_listing_timeout(cfg.hub.listing_timeout);
  hub_->set_parse_pool(*disk_pool_);  // a listing of 100,000 files is 0.1 s of CPU: off the event loop
  return {};
}

Result<void> Daemon::open_models() {
  const auto& cfg = *config_;
  store_ = std::make_unique<store::Store>(cfg.daemon.models_dir);
  std::error_code ec;
  std::filesystem::create_directories(cfg.daemon.models_dir, ec);
  if (ec)
    return make_error(Errc::io_error, "cannot create daemon.models_dir: " +
                                          util::errno_error(ec.value(), cfg.daemon.models_dir, "create directory").message);
  // An existing models_dir on a path the sandbox keeps read-only would let modeld start and
  // fail the first deployment in planning: refuse now, with the reason.
  if (::access(cfg.daemon.models_dir.c_str(), W_OK) != 0)
    return make_error(Errc::io_error, "daemon.models_dir is not writable: " +
                                          util::errno_error(errno, cfg.daemon.models_dir, "access").message);
  states_ = std::make_unique<deploy::StateStore>(cfg.daemon.state_dir);
  if (auto r = states_->init(); !r) return r;
  // [daemon] service_manager: the process backend needs no bus (containers have none); its
  // servers outlive modeld and the next one re-adopts them from the records in state_dir.
  if (cfg.daemon.service_manager == "process") {
    sys::log(sys::Level::info, {},
             "service_manager \"process\": model servers run as children of modeld in their own process groups");
    units::ProcessManagerOptions popt;
    popt.record_dir = cfg.daemon.state_dir / "processes";
    units_ = units::make_process_manager(io_.get_executor(), popt);
  } else {
    units_ = units::make_systemd_manager(io_.get_executor(), cfg.daemon.unit_dir);
  }
  deploy::Services services{config_, *store_, *hub_, *hub_client_, *local_client_, *units_, *disk_pool_};
  deployer_ = std::make_unique<deploy::Deployer>(io_, services, *states_);
  return deployer_->load();
}

Result<void> Daemon::open_control() {
  const auto& cfg = *config_;
  if (::getgrnam(cfg.control.group.c_str()) == nullptr)
    sys::logf(sys::Level::warning,
              "control.group '{}' does not exist on this host: only root may deploy, cancel, verify or delete",
              cfg.control.group);
  control::Options copt;
  copt.socket_path = cfg.daemon.socket;
  copt.group = cfg.control.group;
  // Counts from the Deployer's events since start-up: for /metrics on the socket and over TCP.
  metrics_ = std::make_unique<control::MetricsCollector>(*deployer_);
  copt.metrics = metrics_.get();
  server_ = std::make_unique<control::Server>(io_.get_executor(), *deployer_, copt);
  auto fds = sys::listen_fds();
  if (!fds.empty()) {
    if (auto r = adopt_socket(fds.front()); !r) return r;
    if (fds.size() > 1) sys::logf(sys::Level::warning, "systemd passed {} sockets; only the first is used", fds.size());
  } else if (auto r = server_->listen(); !r) {
    return r;
  }
  server_->start(stop_tree_.child());
  return {};
}

Result<void> Daemon::adopt_socket(int fd) {
  if (auto r = server_->adopt(fd); !r) return r;
  // The socket unit's ListenStream= wins; a daemon.socket naming another path is not used,
  // and the operator should hear so (clients following the configuration would miss it).
  const auto& configured = config_->daemon.socket;
  const std::string passed = sys::unix_socket_path(fd);
  const bool same = !passed.empty() && std::filesystem::path(passed).lexically_normal() == configured.lexically_normal();
  sys::logf(sys::Level::info, "using the control socket {} passed by systemd (socket activation){}",
            passed.empty() ? "(unnamed)" : passed,
            same ? "" : "; daemon.socket " + configured.string() + " in the configuration is not used");
  return {};
}

void Daemon::open_metrics_listener() {
  // [metrics] listen: /metrics over TCP too. A failure to bind is reported, not fatal: the
  // control socket matters more than a scrape target.
  const auto& m = config_->metrics;
  if (m.listen.empty()) return;
  metrics_listener_ = std::make_unique<control::MetricsListener>(
      io_.get_executor(), [metrics = metrics_.get()] { return metrics->text(); },
      control::MetricsLimits{m.max_connections, m.per_address_connections});
  if (auto r = metrics_listener_->listen(m.listen); !r) {
    sys::logf(sys::Level::error, "{}; /metrics is served on the control socket only", r.error().message);
    metrics_listener_.reset();
    return;
  }
  metrics_listener_->start(stop_tree_.child());
  sys::logf(sys::Level::info, "serving /metrics over TCP on {}", m.listen);
}

void Daemon::reload() {
  if (stopping_) return;
  if (reloading_) {
    reload_again_ = true;
    return;
  }
  reloading_ = true;
  asio::co_spawn(io_, reload_config(), [this, log = sys::log_failure("configuration reload")](std::exception_ptr e) {
    if (e) reloading_ = false;
    log(e);
  });
}

asio::awaitable<void> Daemon::reload_config() {
  do {
    reload_again_ = false;
    sys::notify_reloading("reloading configuration from " + config_file_);
    sys::logf(sys::Level::notice, "SIGHUP: reloading the configuration from {}", config_file_);
    // `this` only: GCC 12 mis-copies class objects captured by value in a coroutine.
    auto fresh = co_await util::on_pool<config::LoadResult>(
        *disk_pool_, [this] { return config::load(config_file_, config::environment_from_process()); });
    if (stopping_) co_return;
    take_over(std::move(fresh));
    sys::notify_ready(deployer_->status_line());
  } while (reload_again_ && !stopping_);
  reloading_ = false;
}

void Daemon::take_over(config::LoadResult fresh) {
  const auto running = deployer_->config();
  if (!fresh.config || !fresh.problems.empty()) {
    for (const auto& p : fresh.problems) sys::log(sys::Level::error, {}, p.to_string());
    sys::logf(sys::Level::error,
              "configuration {} is invalid: {} problem(s); keeping the configuration in use ({} model(s))",
              config_file_, fresh.problems.size(), running->models.size());
    metrics_->reloaded(false);
    return;
  }
  for (const auto& w : fresh.warnings) sys::log(sys::Level::warning, {}, w.to_string());
  for (const auto& c : config::keep_fixed_settings(*running, *fresh.config))
    sys::logf(sys::Level::warning, "{} changed from {} to {}: it takes effect when modeld restarts; keeping {} until then",
              c.key, c.running, c.requested, c.running);
  deployer_->reconfigure(std::make_shared<const config::Config>(std::move(*fresh.config)));
  metrics_->reloaded(true);
}

void Daemon::stop(std::string_view why) {
  if (stopping_) return;
  stopping_ = true;
  sys::logf(sys::Level::notice, "{}: stopping; a running deployment continues at the next start", why);
  sys::notify_stopping();
  grace_.expires_after(stop_grace);
  grace_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    sys::logf(sys::Level::warning, "the deployment did not stop within {} s; exiting anyway", stop_grace.count());
    finish();
  });
  // The control server, the metrics listener and the deployer; the deployer calls finish()
  // once its watcher and deployment have ended (at once when nothing runs). A reload reading
  // the file on the disk pool (which no cancellation interrupts) sees stopping_ when it is back.
  stop_tree_.emit();
}

void Daemon::finish() {
  grace_.cancel();
  io_.stop();
}

asio::awaitable<void> Daemon::handle_signals() {
  while (!stopping_) {
    auto [ec, sig] = co_await signals_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;
    if (sig == SIGHUP)
      reload();
    else
      stop(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  }
}

asio::awaitable<void> Daemon::pet_watchdog(std::chrono::microseconds interval) {
  asio::steady_timer timer(io_);
  for (;;) {
    sys::notify_watchdog();
    timer.expires_after(interval);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;
  }
}

}  // namespace modeld
