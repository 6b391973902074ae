// modeld: the daemon. Parses arguments, loads the configuration, builds the pipeline's parts,
// listens on the control socket, tells systemd it is ready and runs the io_context.

#include "config/config.hpp"
#include "control/metrics.hpp"
#include "control/server.hpp"
#include "deploy/deployer.hpp"
#include "http/client.hpp"
#include "hub/hub.hpp"
#include "store/store.hpp"
#include "sys/listen_fds.hpp"
#include "sys/log.hpp"
#include "sys/notify.hpp"
#include "sys/threads.hpp"
#include "units/service_manager.hpp"
#include "util/files.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include <grp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace asio = boost::asio;
using namespace modeld;

namespace {

// The Hub token, by the contract's precedence: [hub] token_file, else the systemd credential
// "hf-token", else $HF_TOKEN. Its value is never logged, nor put in an error; only where it came
// from is.
struct Token {
  std::string value;
  std::string source;  // "token_file /etc/modeld/hf-token", "credential hf-token", "$HF_TOKEN", "none"
};

// Errors (modeld then refuses to start): a token_file that is missing, unreadable or open to
// group or others. A credential that cannot be read is reported and skipped; an empty one (the
// unit's SetCredential= fallback) counts as absent.
Result<Token> read_token(const config::Config& cfg) {
  if (!cfg.hub.token_file.empty()) {
    // Refused (config::load reports it too, for --check-config and reloads): the token would
    // be anyone's, or anyone could swap it.
    if (auto why = config::shared_secret_file(cfg.hub.token_file, "hub.token_file"))
      return make_error(Errc::config_invalid, *why + " and start modeld again");
    auto t = util::read_secret_file(cfg.hub.token_file);
    if (!t) return make_error(Errc::config_invalid, "hub.token_file: " + t.error().message);
    if (t->empty())
      sys::logf(sys::Level::warning, "hub.token_file {} is empty: requests to the Hub carry no token",
                cfg.hub.token_file.string());
    return Token{*t, "token_file " + cfg.hub.token_file.string()};
  }
  if (const char* dir = std::getenv("CREDENTIALS_DIRECTORY"); dir && *dir) {
    const auto path = std::filesystem::path(dir) / "hf-token";
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      auto t = util::read_secret_file(path);
      if (!t)
        sys::logf(sys::Level::warning, "credential hf-token: {}; trying $HF_TOKEN", t.error().message);
      else if (!t->empty()) {
        // systemd copies the credential privately, but its source may be readable by anyone: the
        // shipped unit's source is the file below (packaging's tmpfiles.d line makes it 0600 at
        // boot; a file written since then may not be).
        if (auto why = config::shared_secret_file("/etc/modeld/hf-token", "the credential file"))
          sys::logf(sys::Level::warning, "{} (when it is the source of LoadCredential=hf-token)", *why);
        return Token{*t, "credential hf-token"};
      }
    }
  }
  if (const char* env = std::getenv("HF_TOKEN"); env && *env) {
    std::string t = env;
    t = std::string(modeld::util::trim(t));
    return Token{t, "$HF_TOKEN"};
  }
  return Token{"", "none"};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"modeld: puts large language models into service (download, verify, launch, health-check)"};
  std::string config_file = "/etc/modeld/modeld.toml";
  bool check_only = false, verbose = false, version = false;
  app.add_option("--config", config_file, "configuration file")->capture_default_str();
  app.add_flag("--check-config", check_only, "parse and validate the configuration, print problems, exit 0 or 1");
  app.add_flag("-v,--verbose", verbose, "log debug lines");
  app.add_flag("--version", version, "print the version");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("modeld %s\n", MODELD_VERSION);
    return 0;
  }

  auto loaded = config::load(config_file, config::environment_from_process());
  if (check_only) {
    for (const auto& p : loaded.problems) std::fprintf(stderr, "%s\n", p.to_string().c_str());
    if (loaded.config && loaded.problems.empty()) {
      std::printf("%s: valid, %zu model(s)\n", config_file.c_str(), loaded.config->models.size());
      return 0;
    }
    return 1;
  }

  sys::init_logging(sys::Sink::automatic, verbose);
  if (!loaded.config || !loaded.problems.empty()) {
    for (const auto& p : loaded.problems) sys::log(sys::Level::error, {}, p.to_string());
    sys::logf(sys::Level::error, "configuration {} is invalid: {} problem(s); not starting", config_file,
              loaded.problems.size());
    return 1;
  }
  auto cfg = std::make_shared<const config::Config>(std::move(*loaded.config));

  auto token = read_token(*cfg);
  if (!token) {
    sys::logf(sys::Level::error, "{}; not starting", token.error().message);
    return 1;
  }
  // A core dump (the watchdog's SIGABRT, a crash) would copy the token's bytes into the core
  // file; a non-dumpable process leaves none, and /proc/PID/mem stays closed to ptrace by
  // anyone but a privileged tracer. Only when there is a token: without one, cores are useful.
  if (!token->value.empty()) {
    if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
      sys::log(sys::Level::info, {}, "core dumps are off: this process holds the Hub token");
    else
      sys::logf(sys::Level::warning, "cannot turn core dumps off ({}): a core dump would contain the Hub token",
                std::strerror(errno));
  }

  try {
    asio::io_context io(1);
    // O_DIRECT writes wait for the device: more threads than cores keep hashing going meanwhile.
    const unsigned disk_threads = std::max(8u, std::thread::hardware_concurrency());
    asio::thread_pool disk_pool(disk_threads);
    // Hashing and disk jobs yield the CPU to the event loop (10 nice levels below it, whatever
    // Nice= the unit sets): on a host short of cores the control socket answers and the sockets
    // are drained first; the pool gets what is left. $MODELD_DISK_NICE (0..19) sets the gap
    // (0: same priority, as tests/bench/status's baseline uses).
    int gap = 10;
    if (const char* v = std::getenv("MODELD_DISK_NICE"); v && *v) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end == '\0' && n >= 0 && n <= 19)
        gap = static_cast<int>(n);
      else
        sys::logf(sys::Level::warning, "$MODELD_DISK_NICE=\"{}\" is not 0..19; using {}", v, gap);
    }
    errno = 0;
    const int loop_nice = ::getpriority(PRIO_PROCESS, 0);
    if (int e = gap ? sys::set_pool_niceness(disk_pool, disk_threads, std::min(19, (errno ? 0 : loop_nice) + gap)) : 0)
      sys::logf(sys::Level::warning, "cannot lower the disk threads' priority: {}", std::strerror(e));

    auto endpoint = http::Url::parse(cfg->hub.endpoint);
    if (!endpoint) {
      sys::logf(sys::Level::error, "hub.endpoint: {}", endpoint.error().message);
      return 1;
    }
    http::ClientOptions hub_opts;
    hub_opts.auth_origin = endpoint->origin();
    hub_opts.bearer_token = token->value;
    hub_opts.ca_file = cfg->hub.ca_file;
    hub_opts.read_timeout = cfg->hub.read_timeout;
    // HTTPS_PROXY / http_proxy / NO_PROXY from the unit's environment (a drop-in sets them).
    hub_opts.proxy = http::ProxyConfig::from_environment();
    auto proxy = http::select_proxy(hub_opts.proxy, *endpoint);
    if (!proxy) {
      // Not fatal: the daemon still watches and restarts the model in service; downloads fail
      // with this message until the variable is fixed.
      sys::logf(sys::Level::error, "{}; downloads from the Hub will fail until it is fixed", proxy.error().message);
    } else if (*proxy)
      sys::logf(sys::Level::info, "reaching the Hub {} through the proxy {}", endpoint->origin(), (*proxy)->redacted());
    http::Client hub_client(io.get_executor(), hub_opts);
    http::ClientOptions local_opts;
    local_opts.connect_timeout = std::chrono::seconds(5);
    http::Client local_client(io.get_executor(), local_opts);
    hub::Hub hub(hub_client, cfg->hub.endpoint);
    hub.set_listing_timeout(cfg->hub.listing_timeout);
    hub.set_parse_pool(disk_pool);  // a listing of 100,000 files is 0.1 s of CPU: off the event loop

    store::Store store(cfg->daemon.models_dir);
    std::error_code ec;
    std::filesystem::create_directories(cfg->daemon.models_dir, ec);
    if (ec) {
      sys::logf(sys::Level::error, "cannot create daemon.models_dir: {}",
                util::errno_error(ec.value(), cfg->daemon.models_dir, "create directory").message);
      return 1;
    }
    // An existing models_dir on a path the sandbox keeps read-only would let modeld start and
    // fail the first deployment in planning: refuse now, with the reason.
    if (::access(cfg->daemon.models_dir.c_str(), W_OK) != 0) {
      sys::logf(sys::Level::error, "daemon.models_dir is not writable: {}",
                util::errno_error(errno, cfg->daemon.models_dir, "access").message);
      return 1;
    }
    deploy::StateStore states(cfg->daemon.state_dir);
    if (auto r = states.init(); !r) {
      sys::log(sys::Level::error, {}, r.error().message);
      return 1;
    }
    // [daemon] service_manager: the process backend needs no bus (containers have none); its
    // servers outlive modeld and the next one re-adopts them from the records in state_dir.
    std::unique_ptr<units::ServiceManager> units;
    if (cfg->daemon.service_manager == "process") {
      sys::log(sys::Level::info, {},
               "service_manager \"process\": model servers run as children of modeld in their own process groups");
      units::ProcessManagerOptions popt;
      popt.record_dir = cfg->daemon.state_dir / "processes";
      units = units::make_process_manager(io.get_executor(), popt);
    } else {
      units = units::make_systemd_manager(io.get_executor(), cfg->daemon.unit_dir);
    }

    deploy::Services services{cfg, store, hub, hub_client, local_client, *units, disk_pool};
    deploy::Deployer deployer(io, services, states);
    if (auto r = deployer.load(); !r) {
      sys::log(sys::Level::error, {}, r.error().message);
      return 1;
    }

    if (::getgrnam(cfg->control.group.c_str()) == nullptr)
      sys::logf(sys::Level::warning,
                "control.group '{}' does not exist on this host: only root may deploy, cancel, verify or delete",
                cfg->control.group);
    control::Options copt;
    copt.socket_path = cfg->daemon.socket;
    copt.group = cfg->control.group;
    // Counts from the engine's events since start-up: for /metrics on the socket and over TCP.
    control::MetricsCollector metrics(deployer);
    copt.metrics = &metrics;
    control::Server server(io.get_executor(), deployer, copt);
    auto fds = sys::listen_fds();
    if (!fds.empty()) {
      if (auto r = server.adopt(fds.front()); !r) {
        sys::log(sys::Level::error, {}, r.error().message);
        return 1;
      }
      // The socket unit's ListenStream= wins; a daemon.socket naming another path is not used,
      // and the operator should hear so (clients following the configuration would miss it).
      const std::string passed = sys::unix_socket_path(fds.front());
      const bool same = !passed.empty() && std::filesystem::path(passed).lexically_normal() ==
                                               cfg->daemon.socket.lexically_normal();
      sys::logf(sys::Level::info, "using the control socket {} passed by systemd (socket activation){}",
                passed.empty() ? "(unnamed)" : passed,
                same ? "" : "; daemon.socket " + cfg->daemon.socket.string() + " in the configuration is not used");
      if (fds.size() > 1)
        sys::logf(sys::Level::warning, "systemd passed {} sockets; only the first is used", fds.size());
    } else if (auto r = server.listen(); !r) {
      sys::log(sys::Level::error, {}, r.error().message);
      return 1;
    }
    server.start();

    // [metrics] listen: /metrics over TCP too. A failure to bind is reported, not fatal: the
    // control socket matters more than a scrape target.
    std::unique_ptr<control::MetricsListener> metrics_listener;
    if (!cfg->metrics.listen.empty()) {
      metrics_listener = std::make_unique<control::MetricsListener>(
          io.get_executor(), [&metrics] { return metrics.text(); },
          control::MetricsLimits{cfg->metrics.max_connections, cfg->metrics.per_address_connections});
      if (auto r = metrics_listener->listen(cfg->metrics.listen); !r) {
        sys::logf(sys::Level::error, "{}; /metrics is served on the control socket only", r.error().message);
        metrics_listener.reset();
      } else {
        metrics_listener->start();
        sys::logf(sys::Level::info, "serving /metrics over TCP on {}", cfg->metrics.listen);
      }
    }

    sys::logf(sys::Level::notice, "modeld {} ready: {} model(s) configured, hub {} (token: {}), models in {}",
              MODELD_VERSION, cfg->models.size(), cfg->hub.endpoint, token->source, cfg->daemon.models_dir.string());
    sys::notify_ready();
    asio::co_spawn(io, deployer.recover(), asio::detached);

    // The watchdog is petted from the event loop itself, so a stalled loop stops the petting.
    asio::steady_timer watchdog(io);
    std::function<void()> pet;
    if (auto interval = sys::watchdog_interval()) {
      pet = [&, interval = *interval] {
        sys::notify_watchdog();
        watchdog.expires_after(interval);
        watchdog.async_wait([&](boost::system::error_code e) { if (!e) pet(); });
      };
      pet();
    }

    // SIGHUP (systemctl reload): re-read the configuration off the event loop, take it over when
    // it is valid, keep the old one otherwise. One reload at a time; a SIGHUP during one runs
    // another right after it, so the last edit always gets read.
    bool reloading = false, reload_again = false, stopping = false;
    std::function<void()> reload;
    reload = [&] {
      if (stopping) return;
      if (reloading) {
        reload_again = true;
        return;
      }
      reloading = true;
      sys::notify_reloading("reloading configuration from " + config_file);
      sys::logf(sys::Level::notice, "SIGHUP: reloading the configuration from {}", config_file);
      asio::co_spawn(io, [&]() -> asio::awaitable<void> {
        auto fresh = co_await util::on_pool<config::LoadResult>(
            disk_pool, [&config_file] { return config::load(config_file, config::environment_from_process()); });
        if (stopping) co_return;
        const auto running = deployer.config();
        if (!fresh.config || !fresh.problems.empty()) {
          for (const auto& p : fresh.problems) sys::log(sys::Level::error, {}, p.to_string());
          sys::logf(sys::Level::error,
                    "configuration {} is invalid: {} problem(s); keeping the configuration in use ({} model(s))",
                    config_file, fresh.problems.size(), running->models.size());
          metrics.reloaded(false);
        } else {
          for (const auto& c : config::keep_fixed_settings(*running, *fresh.config))
            sys::logf(sys::Level::warning, "{} changed from {} to {}: it takes effect when modeld restarts; "
                      "keeping {} until then", c.key, c.running, c.requested, c.running);
          deployer.reconfigure(std::make_shared<const config::Config>(std::move(*fresh.config)));
          metrics.reloaded(true);
        }
        reloading = false;
        sys::notify_ready(deployer.status_line());
        if (reload_again) {
          reload_again = false;
          reload();
        }
      }, [](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          sys::logf(sys::Level::error, "configuration reload failed: {}", ex.what());
        }
      });
    };

    asio::signal_set signals(io, SIGTERM, SIGINT, SIGHUP);
    asio::steady_timer grace(io);
    std::function<void(boost::system::error_code, int)> on_signal = [&](boost::system::error_code e, int sig) {
      if (e) return;
      if (sig == SIGHUP) {
        reload();
        signals.async_wait(on_signal);
        return;
      }
      stopping = true;
      sys::logf(sys::Level::notice, "{}: stopping; a running deployment continues at the next start",
                sig == SIGTERM ? "SIGTERM" : "SIGINT");
      sys::notify_stopping();
      auto stop_all = [&] {
        server.stop();
        if (metrics_listener) metrics_listener->stop();
        watchdog.cancel();
        grace.cancel();
        io.stop();
      };
      deployer.shutdown(stop_all);
      grace.expires_after(std::chrono::seconds(10));
      grace.async_wait([&](boost::system::error_code ge) {
        if (!ge) {
          sys::log(sys::Level::warning, {}, "the deployment did not stop within 10 s; exiting anyway");
          stop_all();
        }
      });
    };
    signals.async_wait(on_signal);

    io.run();
    disk_pool.join();
    return 0;
  } catch (const std::exception& e) {
    sys::logf(sys::Level::error, "fatal: {}", e.what());
    return 1;
  }
}
