#pragma once
// The systemd drop-in reader of the process backend: what a unit's drop-ins say to run, read the
// way systemd 252 reads them (systemd.service(5), systemd.syntax(7), systemd.time(7)), so the
// process backend runs what systemd would have run from the same files.

#include "util/error.hpp"

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::units {

/// The time span "infinity" (systemd.time(7)): a TimeoutStopSec= that never ends in SIGKILL.
inline constexpr std::chrono::milliseconds kInfinity = std::chrono::milliseconds::max();

/// What the process backend runs for a unit: the [Service] settings of its drop-ins that it
/// honours (ExecStart=, WorkingDirectory=, Environment=, TimeoutStopSec=, KillMode=); others are ignored.
struct ProcessSpec {
  /// ExecStart= split into words, quotes and specifiers resolved; `$$`, `${VAR}` and `$VAR` are
  /// left for exec_argv(), as systemd expands them against the unit's environment at exec time.
  std::vector<std::string> argv;             ///< empty: nothing to run
  std::filesystem::path working_directory;   ///< empty: the daemon's own
  /// Environment= assignments in order ("KEY=VALUE"); a later one for the same KEY wins.
  std::vector<std::string> environment;
  std::chrono::milliseconds stop_timeout = std::chrono::seconds(90);  ///< systemd's default
  /// KillMode=mixed: a stop sends SIGTERM to the main process alone, and SIGKILL to the rest of the
  /// group once it has exited or the stop timeout passed; false: KillMode=control-group (the
  /// template's), every other value included.
  bool kill_mixed = false;
};

/// Applies one drop-in's [Service] section to `spec` the way systemd merges drop-ins: an empty
/// ExecStart= or Environment= clears what earlier drop-ins set. Understands systemd's quoting
/// ("..." and '...' with C escapes), the specifiers %% %i %I %n %N, $$ and ${VAR}/$VAR taken
/// from Environment=, and time spans ("30s", "5min", "1h 2min", "infinity", plain seconds).
/// config_invalid naming `unit` and the line for a setting it cannot parse.
Result<void> apply_dropin(ProcessSpec& spec, std::string_view content, const std::string& unit);

/// `spec.argv` with `$$` turned into `$` and `${VAR}` / `$VAR` replaced by the value of VAR in
/// `environment` ("KEY=VALUE" strings, a later KEY winning; an unset VAR gives "").
std::vector<std::string> exec_argv(const ProcessSpec& spec, const std::vector<std::string>& environment);

}  // namespace modeld::units
