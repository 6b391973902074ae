// What every backend shares: unit states, the journal default, reset-failed-then-start, and
// waiting for a unit to stop.
#include "units/service_manager.hpp"

#include "util/name_table.hpp"
#include "util/poll.hpp"

#include <fmt/format.h>


namespace modeld::units {

namespace asio = boost::asio;

namespace {
constexpr util::NameTable<ActiveState, 9> kStates{{
    {ActiveState::inactive, "inactive"},
    {ActiveState::active, "active"},
    {ActiveState::activating, "activating"},
    {ActiveState::deactivating, "deactivating"},
    {ActiveState::reloading, "reloading"},
    {ActiveState::failed, "failed"},
    {ActiveState::maintenance, "maintenance"},
    {ActiveState::refreshing, "refreshing"},
    {ActiveState::unknown, "unknown"},
}};
}  // namespace

std::string_view to_string(ActiveState state) { return util::name_in(kStates, state).value_or("unknown"); }

ActiveState parse_active_state(std::string_view text) {
  return util::value_in(kStates, text).value_or(ActiveState::unknown);
}

bool is_stopped(ActiveState state) { return state == ActiveState::inactive || state == ActiveState::failed; }

bool is_up(ActiveState state) {
  return state == ActiveState::active || state == ActiveState::activating || state == ActiveState::reloading;
}

JournalSource ServiceManager::journal_of(const std::string&) const { return JournalSource{}; }

asio::awaitable<Result<ExecIdentity>> ServiceManager::identity(const std::string&) { co_return ExecIdentity{}; }

asio::awaitable<Result<std::vector<std::string>>> ServiceManager::units_up(const std::string&) {
  co_return std::vector<std::string>{};
}

Result<std::optional<std::string>> ServiceManager::read_dropin(const std::string&, const std::string&) const {
  return std::optional<std::string>{};
}

namespace {
// systemd.exec(5) "PROCESS EXIT CODES", table "systemd-specific exit codes", of systemd 252 (Debian
// 12); the same numbers as EXIT_CHDIR... in systemd's src/basic/exit-status.h.
constexpr std::pair<int, SystemdExitStatus> kExitStatuses[] = {
    {200, {"CHDIR", "changing to the requested working directory failed (WorkingDirectory=)"}},
    {201, {"NICE", "failed to set up process scheduling priority (Nice=)"}},
    {202, {"FDS", "failed to close unwanted file descriptors, or to adjust passed file descriptors"}},
    {203, {"EXEC", "the execve(2) of the command failed: most likely a missing or non-accessible executable file"}},
    {204, {"MEMORY", "failed to perform an action due to memory shortage"}},
    {205, {"LIMITS", "failed to adjust resource limits (LimitCPU= and related settings)"}},
    {206, {"OOM_ADJUST", "failed to adjust the OOM setting (OOMScoreAdjust=)"}},
    {207, {"SIGNAL_MASK", "failed to set the process signal mask"}},
    {208, {"STDIN", "failed to set up standard input (StandardInput=)"}},
    {209, {"STDOUT", "failed to set up standard output (StandardOutput=)"}},
    {210, {"CHROOT", "failed to change the root directory (RootDirectory=/RootImage=)"}},
    {211, {"IOPRIO", "failed to set up the IO scheduling priority (IOSchedulingClass=/IOSchedulingPriority=)"}},
    {212, {"TIMERSLACK", "failed to set up timer slack (TimerSlackNSec=)"}},
    {213, {"SECUREBITS", "failed to set the process secure bits (SecureBits=)"}},
    {214, {"SETSCHEDULER", "failed to set up CPU scheduling (CPUSchedulingPolicy=/CPUSchedulingPriority=)"}},
    {215, {"CPUAFFINITY", "failed to set up CPU affinity (CPUAffinity=)"}},
    {216, {"GROUP", "failed to determine or change the group credentials (Group=, SupplementaryGroups=)"}},
    {217, {"USER", "failed to determine or change the user credentials, or to set up the user namespace (User=, PrivateUsers=)"}},
    {218, {"CAPABILITIES", "failed to drop capabilities, or to apply ambient capabilities (CapabilityBoundingSet=, AmbientCapabilities=)"}},
    {219, {"CGROUP", "setting up the service control group failed"}},
    {220, {"SETSID", "failed to create a new process session"}},
    {221, {"CONFIRM", "execution was cancelled by the user (the systemd.confirm_spawn= kernel command line setting)"}},
    {222, {"STDERR", "failed to set up standard error output (StandardError=)"}},
    {224, {"PAM", "failed to set up a PAM session (PAMName=)"}},
    {225, {"NETWORK", "failed to set up network namespacing (PrivateNetwork=)"}},
    {226, {"NAMESPACE", "failed to set up mount, UTS or IPC namespacing (ReadOnlyPaths=, ProtectHostname=, PrivateIPC= and related settings)"}},
    {227, {"NO_NEW_PRIVILEGES", "failed to disable new privileges (NoNewPrivileges=yes)"}},
    {228, {"SECCOMP", "failed to apply system call filters (SystemCallFilter= and related settings)"}},
    {229, {"SELINUX_CONTEXT", "determining or changing the SELinux context failed (SELinuxContext=)"}},
    {230, {"PERSONALITY", "failed to set up an execution domain (Personality=)"}},
    {231, {"APPARMOR_PROFILE", "failed to prepare changing to the AppArmor profile (AppArmorProfile=)"}},
    {232, {"ADDRESS_FAMILIES", "failed to restrict address families (RestrictAddressFamilies=)"}},
    {233, {"RUNTIME_DIRECTORY", "setting up the runtime directory failed (RuntimeDirectory=)"}},
    {235, {"CHOWN", "failed to adjust socket ownership (socket units only)"}},
    {236, {"SMACK_PROCESS_LABEL", "failed to set the SMACK label (SmackProcessLabel=)"}},
    {237, {"KEYRING", "failed to set up the kernel keyring"}},
    {238, {"STATE_DIRECTORY", "failed to set up the unit's state directory (StateDirectory=)"}},
    {239, {"CACHE_DIRECTORY", "failed to set up the unit's cache directory (CacheDirectory=)"}},
    {240, {"LOGS_DIRECTORY", "failed to set up the unit's logging directory (LogsDirectory=)"}},
    {241, {"CONFIGURATION_DIRECTORY", "failed to set up the unit's configuration directory (ConfigurationDirectory=)"}},
    {242, {"NUMA_POLICY", "failed to set up the unit's NUMA memory policy (NUMAPolicy=, NUMAMask=)"}},
    {243, {"CREDENTIALS", "failed to set up the unit's credentials (LoadCredential=, SetCredential=)"}},
    {245, {"BPF", "failed to apply BPF restrictions (RestrictFileSystems=)"}},
};
}  // namespace

std::optional<SystemdExitStatus> systemd_exit_status(int status) {
  for (const auto& [code, meaning] : kExitStatuses)
    if (code == status) return meaning;
  return std::nullopt;
}

asio::awaitable<Result<void>> reset_failed_and_start(ServiceManager& manager, std::string unit) {
  auto reset = co_await manager.reset_failed(unit);  // best effort: StartUnit reports the real problem
  (void)reset;
  co_return co_await manager.start(unit);
}

asio::awaitable<Result<void>> wait_inactive(ServiceManager& manager, std::string unit,
                                            std::chrono::milliseconds timeout) {
  Result<UnitStatus> st = make_error(Errc::internal, unit + ": not asked");
  auto end = co_await util::poll_until(std::chrono::steady_clock::now() + timeout, std::chrono::milliseconds(200),
                                       [&]() -> asio::awaitable<bool> {
                                         st = co_await manager.status(unit);
                                         co_return !st || is_stopped(st->active_state);
                                       });
  if (end == util::PollEnd::cancelled)
    co_return make_error(Errc::cancelled, fmt::format("{}: cancelled while waiting for it to stop", unit));
  if (!st) co_return st.error();
  if (end == util::PollEnd::deadline)
    co_return make_error(Errc::stop_timeout, fmt::format("{} did not stop within {} ms (still {}/{})", unit,
                                                         timeout.count(), to_string(st->active_state), st->sub_state));
  co_return Result<void>{};
}

}  // namespace modeld::units
