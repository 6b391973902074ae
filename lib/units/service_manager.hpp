#pragma once
// The service manager seam: start, stop and query units, write drop-ins and reload. The systemd
// backend talks to org.freedesktop.systemd1 over sd-bus; the process backend (process.cpp) runs
// the servers as modeld's own children, for hosts without systemd as PID 1, and hands their
// output to journald with sd_journal_stream_fd. Both use libsystemd, the only places in lib/
// besides lib/sys that do; tests may substitute a fake.

#include "units/dropin.hpp"
#include "util/error.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::units {

/// systemd's ActiveState of a unit, parsed once by each backend.
enum class ActiveState { inactive, active, activating, deactivating, reloading, failed, maintenance, refreshing, unknown };

/// systemd's word for `state` ("active", "inactive", ...; "unknown" for unknown).
std::string_view to_string(ActiveState state);

/// The ActiveState that systemd's word `text` names; unknown for any other text.
ActiveState parse_active_state(std::string_view text);

/// Whether a unit in `state` has stopped: inactive or failed.
bool is_stopped(ActiveState state);

/// Whether a unit in `state` is up or coming up: active, activating or reloading.
bool is_up(ActiveState state);

/// A unit's state as systemd reports it (ActiveState, SubState, ExecMainPID, ...).
struct UnitStatus {
  ActiveState active_state = ActiveState::unknown;
  std::string sub_state;     ///< "running", "dead", "exited", ...
  std::uint32_t main_pid = 0;
  int exec_main_status = 0;  ///< exit status of the main process when it exited
  std::string result;        ///< systemd's Result property: "success", "exit-code", "signal", ...
  bool loaded = false;       ///< LoadState == "loaded"
  /// InvocationID: 32 lower-case hex digits naming this run of the unit (its journal lines carry
  /// it as _SYSTEMD_INVOCATION_ID); empty when the unit never ran or the backend does not know.
  std::string invocation_id;
};

/// Where a unit's output goes in the journal.
struct JournalSource {
  /// SYSLOG_IDENTIFIER its lines carry when they are found by identifier (the process backend:
  /// "modeld-serve@NAME"); empty: found by the unit's name and invocation ID (systemd).
  std::string identifier;
  /// false when the output cannot be read from a journal (no journald: it goes to modeld's own).
  bool readable = true;
};

/// Who a unit's processes run as: its User=, Group= and DynamicUser= as the service manager has
/// them loaded (an operator's drop-in may set them). Empty `user`: the manager's own user (root).
struct ExecIdentity {
  std::string user;   ///< a name or a numeric uid; "" (or "root", "0"): root
  std::string group;  ///< "" : the user's own group
  bool dynamic = false;  ///< DynamicUser=yes: a uid allocated at start, in no file's owner or group
};

/// What systemd's exit status `status` of a process it could not start means (systemd.exec(5)
/// "PROCESS EXIT CODES", systemd 252, the codes 200..245 it uses before execve(2)): its symbolic
/// name without EXIT_ ("EXEC") and the man page's description; nullopt for other statuses.
struct SystemdExitStatus {
  std::string_view name;
  std::string_view description;
};
std::optional<SystemdExitStatus> systemd_exit_status(int status);

/// Unit name of a model's service: "modeld-serve@NAME.service" (interface.md).
std::string serve_unit(const std::string& model);

/// Starts, stops and inspects units.
class ServiceManager {
 public:
  virtual ~ServiceManager() = default;
  /// StartUnit(unit, "replace"); returns once the job is queued. unit_failed on a bus error.
  virtual boost::asio::awaitable<Result<void>> start(const std::string& unit) = 0;
  /// StopUnit(unit, "replace"); returns once the job is queued. A unit that is not loaded is not an error.
  virtual boost::asio::awaitable<Result<void>> stop(const std::string& unit) = 0;
  /// The unit's state (loads the unit if needed).
  virtual boost::asio::awaitable<Result<UnitStatus>> status(const std::string& unit) = 0;
  /// PIDs in the unit's cgroup (empty when none or unknown).
  virtual boost::asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string& unit) = 0;
  /// ResetFailed(unit), so a failed unit can start again.
  virtual boost::asio::awaitable<Result<void>> reset_failed(const std::string& unit) = 0;
  /// Reload(): makes systemd re-read unit files and drop-ins.
  virtual boost::asio::awaitable<Result<void>> reload() = 0;
  /// Writes unit_dir/UNIT.d/NAME atomically (mode 0644); io_error naming the path. Blocks for one
  /// small file written and fsynced (systemd backend; the process backend parses it in memory, on
  /// the caller's thread, which must be the event loop).
  virtual Result<void> write_dropin(const std::string& unit, const std::string& name, const std::string& content) = 0;
  /// Where the unit's output is in the journal (the systemd backend's default: by unit and
  /// invocation, readable). Does not block.
  virtual JournalSource journal_of(const std::string& unit) const;
  /// Who the unit's processes run as (loads the unit if needed); the default, and the process
  /// backend's: the manager's own user (an empty ExecIdentity). unit_failed on a bus error.
  virtual boost::asio::awaitable<Result<ExecIdentity>> identity(const std::string& unit);
  /// The names of the loaded units matching the glob `pattern` ("modeld-serve@*.service") that are
  /// up (active, activating or reloading): systemd's ListUnitsByPatterns (org.freedesktop.systemd1
  /// Manager, systemd >= 230); the process backend's units whose main process runs; the default:
  /// none. unit_failed on a bus error.
  virtual boost::asio::awaitable<Result<std::vector<std::string>>> units_up(const std::string& pattern);
  /// The content of drop-in NAME of `unit` as write_dropin() left it (the systemd backend reads
  /// unit_dir/UNIT.d/NAME, blocking for one small file; the process backend has it in memory, until
  /// modeld restarts); nullopt when there is none; io_error naming the path when it cannot be read.
  virtual Result<std::optional<std::string>> read_dropin(const std::string& unit, const std::string& name) const;
};

/// ResetFailed(unit), best effort (StartUnit reports the real problem), then StartUnit(unit):
/// a unit left failed by an earlier run starts again. Errors: those of start().
boost::asio::awaitable<Result<void>> reset_failed_and_start(ServiceManager& manager, std::string unit);

/// Writes unit_dir/UNIT.d/NAME atomically with mode 0644, creating UNIT.d (0755, and unit_dir
/// if needed) when missing;
/// what the systemd backend's write_dropin() does, usable without a bus. io_error naming the path;
/// internal when `unit` or `name` is empty or holds a '/'.
Result<void> write_dropin_file(const std::filesystem::path& unit_dir, const std::string& unit,
                               const std::string& name, const std::string& content);

/// The systemd backend on the system bus; `unit_dir` is where drop-ins go (/run/systemd/system).
/// Bus calls run on a private thread so a slow systemd never blocks the event loop.
/// Throws std::runtime_error when the system bus cannot be opened.
std::unique_ptr<ServiceManager> make_systemd_manager(boost::asio::any_io_executor executor,
                                                     std::filesystem::path unit_dir);

/// Options of the process backend.
struct ProcessManagerOptions {
  /// Where a small record per running unit (PID, start time, boot ID, invocation ID) is kept so
  /// that a restarted modeld re-adopts the servers its predecessor started; empty: no records.
  std::filesystem::path record_dir;
  /// Send the servers' stdout and stderr to journald (identifier "modeld-serve@NAME") when its
  /// stream socket answers; otherwise, or when false, they inherit the daemon's.
  bool journal = true;
};

/// The process backend for hosts without systemd as PID 1 (containers): each unit's server runs
/// as a child of modeld in its own session and process group (setsid), stdin /dev/null, with the
/// drop-in's environment plus the daemon's PATH. Exits are noticed through a pidfd on the event
/// loop (Linux >= 5.3); stop sends SIGTERM+SIGCONT to the group, then SIGKILL after
/// TimeoutStopSec; pids() lists the group's members (a process that calls setsid() itself leaves
/// the group and is not seen). Servers outlive modeld and are re-adopted from
/// `options.record_dir` by the next one. Must be created and used on `executor`'s thread.
/// Opens no bus connection. Throws std::runtime_error when record_dir cannot be created.
std::unique_ptr<ServiceManager> make_process_manager(boost::asio::any_io_executor executor,
                                                     ProcessManagerOptions options);

/// Polls status() until the unit is inactive or failed (every 200 ms), up to `timeout`;
/// stop_timeout naming the unit and its state otherwise; cancelled when the caller is cancelled.
/// `unit` is taken by value: the coroutine starts later, and a reference to a temporary (e.g. a
/// string literal passed to co_spawn) would dangle by then. `manager` must outlive the wait.
boost::asio::awaitable<Result<void>> wait_inactive(ServiceManager& manager, std::string unit,
                                                   std::chrono::milliseconds timeout);

}  // namespace modeld::units
