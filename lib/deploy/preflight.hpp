#pragma once
// The pre-flight (interface.md "Pre-flight"): what would make the new server fail to start,
// checked before anything is stopped, so a mistake costs no outage. A deployment runs it in
// planning and again at the start of stopping_old; `plan` shows it. Three checks: the serve
// command's program exists and is executable for the unit's user, after the lookup systemd does
// ("command"); every GPU of serve.gpu_ids (else the first serve.gpus) is visible to NVML ("gpus");
// the port is free or held only by services the deployment stops ("port"). A failure names the
// model's key (models.NAME.serve.command[0], .gpu_ids, .gpus, .port) and its configuration file.

#include "deploy/phase.hpp"
#include "units/service_manager.hpp"

#include <boost/asio/awaitable.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

/// Whom a program is checked for. uid 0 is root (any execute bit suffices, every folder may be
/// searched); `known` false (DynamicUser=, a numeric uid without a passwd entry) counts only the
/// bits for others.
struct Credentials {
  unsigned uid = 0;
  std::vector<unsigned> gids;  ///< the primary group first, then the user's supplementary groups
  bool known = true;
  std::string name = "root";   ///< for messages: "root", "user nobody", "a dynamic user"
};

/// The credentials systemd would give a unit with `id` (User=, Group=, DynamicUser=), read from
/// the user and group databases (NSS; blocks on a remote one). Errors: unit_failed naming the
/// user or group that does not exist and systemd's exit status it would end the start with
/// (217 USER, 216 GROUP).
Result<Credentials> credentials_of(const units::ExecIdentity& id);

/// The folders systemd 252 looks a program named without a '/' up in: its fixed search path,
/// not $PATH (systemd.service(5) "COMMAND LINES": "resolved to a full path using a fixed search
/// path determined at compilation time"; `systemd-path search-binaries-default` prints it:
/// /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin on Debian 12).
std::vector<std::filesystem::path> systemd_search_path();

/// Where `program` runs from: itself when absolute; a bare name (no '/') in the first folder of
/// `search` that holds a regular file of that name with an execute bit (as systemd's and
/// execvp's lookup); a relative path with a '/' under `relative_to` when that is not empty (the
/// process backend runs it from the working directory), else refused (systemd refuses such an
/// ExecStart=). The error is a sentence without the key. Blocks (stat per folder).
Result<std::filesystem::path> resolve_program(const std::string& program,
                                              const std::vector<std::filesystem::path>& search,
                                              const std::filesystem::path& relative_to = {});

/// Why `who` cannot execute `path` ("does not exist", "has mode 0644: no execute bit for user
/// nobody", "the folder /home/a (mode 0700) cannot be searched by user nobody"), or nullopt when
/// it can. Blocks (stat of the file and, for another user than root, of each folder above it).
std::optional<std::string> why_not_executable(const std::filesystem::path& path, const Credentials& who);

/// The whole pre-flight for a deployment of `model` that stops the services `stops` (their
/// ports may hold the new port): "command", "gpus", "port", in that order. Stats on the disk
/// pool; asks the service manager for the unit's user and the services' processes. Never an
/// error: a check that cannot be made says so and passes.
boost::asio::awaitable<std::vector<PreflightCheck>> run_preflight(Services& s, const config::ModelConfig& model,
                                                                  const std::vector<Placement>& stops);

/// The first run_preflight of a deployment's phase (planning, stopping_old): the services of the
/// record's `previous` as `stops`; logged under the run's fields. Errors: unit_failed "pre-flight
/// failed: MESSAGE[; MESSAGE]; `refusing`" with every failed check's message.
boost::asio::awaitable<Result<void>> preflight_of_run(Services& s, const Run& run, std::string_view refusing);

/// Words for a server that systemd could not start (result "exit-code" with one of systemd's own
/// exit statuses, 200..245): "EXIT_EXEC: the execve(2) ... failed ...: PROGRAM (...)", naming the
/// program, the working directory or the unit's User=/Group= where they are the cause; "" for
/// any other end. Pure.
std::string explain_exit(const config::ModelConfig& model, const StartedSettings& started,
                         const units::UnitStatus& status, std::string_view service_manager);

}  // namespace modeld::deploy
