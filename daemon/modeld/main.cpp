// modeld: the daemon. Parses arguments and loads the configuration, then hands over to the
// Daemon (daemon.hpp), which starts the pipeline, runs the event loop, reloads and stops.

#include "config/config.hpp"
#include "modeld/check_state.hpp"
#include "modeld/daemon.hpp"
#include "sys/log.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

using namespace modeld;

int main(int argc, char** argv) {
  CLI::App app{"modeld: puts large language models into service (download, verify, launch, health-check)"};
  std::string config_file = "/etc/modeld/modeld.toml";
  bool check_only = false, check_state_only = false, verbose = false, version = false;
  app.add_option("--config", config_file, "configuration file")->capture_default_str();
  app.add_flag("--check-config", check_only, "parse and validate the configuration, print problems, exit 0 or 1");
  app.add_flag("--check-state", check_state_only,
               "read state_dir's state.json (and state.json.prev) as a start would, say what the next start does, "
               "exit 0 when state.json reads, 1 otherwise");
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
    for (auto w : loaded.warnings) {
      w.message = "warning: " + w.message;  // FILE:LINE:COL: warning: ..., as compilers write it
      std::fprintf(stderr, "%s\n", w.to_string().c_str());
    }
    if (!loaded.config || !loaded.problems.empty()) return 1;
    std::printf("%s: valid, %zu model(s)\n", config_file.c_str(), loaded.config->models.size());
    return 0;
  }

  if (check_state_only) {
    if (!loaded.config) {
      for (const auto& p : loaded.problems) std::fprintf(stderr, "%s\n", p.to_string().c_str());
      return 1;
    }
    return check_state(loaded.config->daemon.state_dir);
  }

  sys::init_logging(sys::Sink::automatic, verbose);
  if (!loaded.config || !loaded.problems.empty()) {
    for (const auto& p : loaded.problems) sys::log(sys::Level::error, {}, p.to_string());
    sys::logf(sys::Level::error, "configuration {} is invalid: {} problem(s); not starting", config_file,
              loaded.problems.size());
    return 1;
  }
  for (const auto& w : loaded.warnings) sys::log(sys::Level::warning, {}, w.to_string());
  try {
    Daemon daemon(std::make_shared<const config::Config>(std::move(*loaded.config)), config_file);
    if (auto r = daemon.start(); !r) {
      sys::log(sys::Level::error, {}, r.error().message);
      return 1;
    }
    daemon.run();
    return 0;
  } catch (const std::exception& e) {
    sys::logf(sys::Level::error, "fatal: {}", e.what());
    return 1;
  }
}
