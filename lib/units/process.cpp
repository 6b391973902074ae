// The process backend of ServiceManager: for hosts without systemd as PID 1 (containers), the
// model servers run as modeld's own children, each in its own session and process group.
//
// What to run comes from the drop-ins modeld writes for systemd (render_dropin in
// lib/deploy/launch.cpp): write_dropin() reads them with the drop-in reader (dropin.hpp)
// instead of writing files, so the deployment phases do not know which backend they talk to.
//
// Exits are noticed through a pidfd per main process, watched on the event loop: no thread and
// no SIGCHLD handler, so nothing else in modeld that waits for its own children is disturbed.
// Only when modeld is PID 1 (a container without an init) does a SIGCHLD handler reap every
// child, because orphaned workers of a server are then reparented to modeld and would stay
// zombies otherwise.
//
// A unit's state mirrors what systemd reports for a Type=exec service with
// KillMode=control-group: active while the main process runs; deactivating while processes of
// its group remain after a stop or after the main process ended; then inactive (exit 0, or
// SIGTERM/SIGINT/SIGHUP/SIGPIPE, which systemd counts as clean) or failed (result "exit-code",
// "signal", "core-dump", or "timeout" when SIGKILL was needed). Whether the group is empty is
// checked when someone asks (status(), pids()), never by a polling thread.
//
// Servers outlive modeld, as under systemd a modeld restart must not stop the model: a record per
// running unit (PID, start time, boot ID) lets the next modeld re-adopt it. A re-adopted server
// is not modeld's child, so its exit status is unknown (result "unknown") unless modeld is PID 1.

#include "units/service_manager.hpp"

#include "sys/log.hpp"
#include "util/files.hpp"
#include "util/quantities.hpp"
#include "util/text.hpp"

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <fmt/format.h>
#include <systemd/sd-journal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fnmatch.h>
#include <map>
#include <optional>
#include <signal.h>
#include <spawn.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

extern char** environ;

namespace modeld::units {

namespace asio = boost::asio;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// The manager

namespace {

// /proc/PID/stat fields after the command name: state (field 3), pgrp (5), starttime (22).
struct ProcStat {
  char state = '?';
  pid_t pgrp = 0;
  std::uint64_t starttime = 0;
};

std::optional<ProcStat> proc_stat(pid_t pid) {
  auto text = util::read_file(fmt::format("/proc/{}/stat", pid), 4096);
  if (!text) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: the fields resume after the last ')'.
  auto close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string_view> fields;
  std::string_view rest = std::string_view(*text).substr(close + 1);
  std::size_t i = 0;
  while (i < rest.size() && fields.size() < 20) {
    while (i < rest.size() && rest[i] == ' ') ++i;
    std::size_t start = i;
    while (i < rest.size() && rest[i] != ' ' && rest[i] != '\n') ++i;
    if (i > start) fields.push_back(rest.substr(start, i - start));
    else break;
  }
  if (fields.size() < 20) return std::nullopt;  // fields[0] is field 3
  ProcStat st;
  st.state = fields[0].front();
  try {
    st.pgrp = static_cast<pid_t>(std::stol(std::string(fields[2])));
    st.starttime = std::stoull(std::string(fields[19]));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return st;
}

// Live (not zombie) members of process group `pgid`, in /proc order.
std::vector<std::uint32_t> group_members(pid_t pgid) {
  std::vector<std::uint32_t> out;
  std::error_code ec;
  for (fs::directory_iterator p("/proc", ec), end; !ec && p != end; p.increment(ec)) {
    const auto name = p->path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    pid_t pid = static_cast<pid_t>(std::stol(name));
    auto st = proc_stat(pid);
    if (st && st->pgrp == pgid && st->state != 'Z' && st->state != 'X') out.push_back(static_cast<std::uint32_t>(pid));
  }
  return out;
}

// Whether any process of group `pgid` still runs. kill(-pgid, 0) answers at once for the usual
// cases; zombies count as gone, which only the /proc scan tells.
bool group_alive(pid_t pgid) {
  if (pgid <= 0) return false;
  if (::kill(-pgid, 0) < 0 && errno == ESRCH) return false;
  return !group_members(pgid).empty();
}

std::string boot_id() {
  auto id = util::read_file("/proc/sys/kernel/random/boot_id", 128);
  return id ? std::string(util::trim(*id)) : std::string();
}

std::string random_id() {
  unsigned char bytes[16] = {};
  std::size_t got = 0;
  while (got < sizeof bytes) {
    auto n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// "modeld-serve@NAME" for "modeld-serve@NAME.service": the SyslogIdentifier= of the template.
std::string identifier(const std::string& unit) {
  auto dot = unit.rfind('.');
  return dot == std::string::npos ? unit : unit.substr(0, dot);
}

struct Unit {
  std::map<std::string, std::string> dropins;  // name -> content, applied in name order
  ProcessSpec spec;

  // The current or last run.
  pid_t pid = 0;             // main process; 0: never ran since modeld started (or reset)
  pid_t pgid = 0;            // its process group; 0 once seen empty
  bool own_child = false;    // started by this modeld: waitpid() gives its status
  bool main_running = false;
  bool stopping = false;     // stop() was asked for this run
  bool killed = false;       // SIGKILL was sent after the stop timeout
  std::optional<int> wait_status;  // waitpid()'s status once known
  std::string invocation_id;
  std::chrono::milliseconds stop_timeout = std::chrono::seconds(90);  // of this run
  bool kill_mixed = false;  // KillMode=mixed for this run (ProcessSpec::kill_mixed)
  // Once the run is over: "inactive" or "failed", with systemd's Result and ExecMainStatus.
  std::string final_state = "inactive";
  std::string result = "success";
  int exec_main_status = 0;

  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  std::unique_ptr<asio::steady_timer> kill_timer;
  std::uint64_t run = 0;  // counts runs, so a callback of an earlier one is ignored
};

// A new run of `u`, started by this modeld: forgets the last one.
void begin_run(Unit& u) {
  u.pid = 0;
  u.own_child = true;
  u.stopping = u.killed = false;
  u.wait_status.reset();
  u.invocation_id = random_id();
  u.stop_timeout = u.spec.stop_timeout;
  u.kill_mixed = u.spec.kill_mixed;
  u.final_state = "inactive";
  u.result = "success";
  u.exec_main_status = 0;
  ++u.run;
}

// The environment of `u`'s run: the daemon's PATH (where the program is looked up, as systemd
// searches its own), the invocation ID, then the drop-in's Environment= (later ones win).
std::vector<std::string> run_environment(const Unit& u) {
  std::vector<std::string> env;
  const char* path = std::getenv("PATH");
  env.push_back(std::string("PATH=") + (path && *path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
  env.push_back("INVOCATION_ID=" + u.invocation_id);
  for (const auto& kv : u.spec.environment) {
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(key); });
    env.push_back(kv);
  }
  return env;
}

// Spawns `argv` with `env` in `working_directory` (none: modeld's), stdin from /dev/null and
// stdout and stderr to `out_fd` (-1: modeld's); sets `pid` and returns posix_spawnp's result.
int spawn_in_own_session(std::vector<std::string>& argv, std::vector<std::string>& env,
                         const fs::path& working_directory, int out_fd, pid_t& pid) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (out_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
  }
  if (!working_directory.empty())
    posix_spawn_file_actions_addchdir_np(&fa, working_directory.c_str());
  // asio does not open its sockets with O_CLOEXEC: the server must not inherit the control
  // socket or Hub connections.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  // Its own session and process group, every signal at its default and none blocked: signals
  // modeld ignores (SIGPIPE) or handles must not leak into the server.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int r = posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return r;
}

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(asio::any_io_executor executor, ProcessManagerOptions options)
      : executor_(std::move(executor)), options_(std::move(options)) {}

  void init() {
    if (!options_.record_dir.empty()) {
      std::error_code ec;
      fs::create_directories(options_.record_dir, ec);
      if (ec)
        throw std::runtime_error(fmt::format("cannot create {}: {}", options_.record_dir.string(), ec.message()));
      adopt_recorded();
    }
    if (::getpid() == 1) reap_orphans();
  }

  void close() {
    closed_ = true;
    for (auto& [name, u] : units_) {
      if (u->pidfd) {
        boost::system::error_code ec;
        u->pidfd->close(ec);
      }
      if (u->kill_timer) u->kill_timer->cancel();
    }
    if (sigchld_) {
      boost::system::error_code ec;
      sigchld_->cancel(ec);
    }
  }

  Result<void> start(const std::string& name) {
    auto& u = unit(name);
    refresh(name, u);
    if (u.main_running && !u.stopping) return {};  // StartUnit on an active unit does nothing
    if (u.main_running || u.pgid)
      return make_error(Errc::unit_failed, fmt::format("{}: cannot start: it is still stopping", name));
    if (u.spec.argv.empty())
      return make_error(Errc::unit_failed, fmt::format("{}: cannot start: no ExecStart= (no drop-in written for it)", name));

    begin_run(u);

    auto fail = [&](int status, std::string message) -> Result<void> {
      // What systemd reports for a service whose exec failed (EXIT_CHDIR 200, EXIT_EXEC 203).
      u.final_state = "failed";
      u.result = "exit-code";
      u.exec_main_status = status;
      return make_error(Errc::unit_failed, fmt::format("{}: {}", name, message));
    };

    auto env = run_environment(u);
    auto argv = exec_argv(u.spec, env);

    if (!u.spec.working_directory.empty()) {
      struct stat st {};
      int err = ::stat(u.spec.working_directory.c_str(), &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
      if (err)
        return fail(200, fmt::format("cannot start: WorkingDirectory {}: {}", u.spec.working_directory.string(),
                                     std::strerror(err)));
    }

    int out_fd = -1;
    if (options_.journal) out_fd = sd_journal_stream_fd(identifier(name).c_str(), LOG_INFO, 0);

    pid_t pid = 0;
    int r = spawn_in_own_session(argv, env, u.spec.working_directory, out_fd, pid);
    if (out_fd >= 0) ::close(out_fd);
    if (r != 0) return fail(203, fmt::format("cannot start: cannot run {}: {}", argv[0], std::strerror(r)));

    u.pid = pid;
    u.pgid = pid;  // setsid made it the leader of a new group
    u.main_running = true;
    if (auto w = watch(name, u); !w) {
      // Without a pidfd its end would go unnoticed; do not leave an unwatched server behind.
      ::kill(-pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      u.main_running = false;
      u.pgid = 0;
      return fail(203, w.error().message);
    }
    write_record(name, u);
    sys::logf(sys::Level::info, "{}: started {} as PID {} in its own process group (output: {})", name, argv[0], pid,
              out_fd >= 0 ? "journal, identifier " + identifier(name) : std::string("modeld's own"));
    return {};
  }

  Result<void> stop(const std::string& name) {
    auto it = units_.find(name);
    if (it == units_.end()) return {};
    auto& u = *it->second;
    refresh(name, u);
    if (!u.main_running && !u.pgid) return {};
    if (u.stopping) return {};
    u.stopping = true;
    terminate(name, u);
    return {};
  }

  UnitStatus status(const std::string& name) {
    UnitStatus st;
    auto it = units_.find(name);
    if (it == units_.end()) {
      st.active_state = ActiveState::inactive;
      st.sub_state = "dead";
      return st;
    }
    auto& u = *it->second;
    refresh(name, u);
    st.loaded = true;
    st.invocation_id = u.invocation_id;
    if (u.main_running && !u.stopping) {
      st.active_state = ActiveState::active;
      st.sub_state = "running";
    } else if (u.main_running || u.pgid) {
      st.active_state = ActiveState::deactivating;
      st.sub_state = u.killed ? "stop-sigkill" : "stop-sigterm";
    } else {
      st.active_state = parse_active_state(u.final_state);
      st.sub_state = u.final_state == "failed" ? "failed" : "dead";
    }
    // Like MainPID, no process is named once the main one has ended; Result and ExecMainStatus
    // describe the last run, as systemd keeps them.
    st.main_pid = u.main_running ? static_cast<std::uint32_t>(u.pid) : 0;
    st.result = u.result;
    st.exec_main_status = u.exec_main_status;
    return st;
  }

  std::vector<std::uint32_t> pids(const std::string& name) {
    auto it = units_.find(name);
    if (it == units_.end()) return {};
    auto& u = *it->second;
    refresh(name, u);
    if (!u.pgid) return {};
    return group_members(u.pgid);
  }

  void reset_failed(const std::string& name) {
    auto it = units_.find(name);
    if (it == units_.end()) return;
    auto& u = *it->second;
    refresh(name, u);
    if (!u.main_running && !u.pgid && u.final_state == "failed") {
      u.final_state = "inactive";
      u.result = "success";
      u.exec_main_status = 0;
    }
  }

  std::vector<std::string> units_up(const std::string& pattern) const {
    std::vector<std::string> out;
    for (const auto& [name, u] : units_)
      if (u->main_running && ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) out.push_back(name);
    return out;
  }

  std::optional<std::string> dropin(const std::string& name, const std::string& dropin) const {
    auto it = units_.find(name);
    if (it == units_.end()) return std::nullopt;
    auto d = it->second->dropins.find(dropin);
    if (d == it->second->dropins.end()) return std::nullopt;
    return d->second;
  }

  Result<void> write_dropin(const std::string& name, const std::string& dropin, const std::string& content) {
    if (name.empty() || dropin.empty() || name.find('/') != std::string::npos ||
        dropin.find('/') != std::string::npos || dropin == "." || dropin == "..")
      return make_error(Errc::internal, fmt::format("{}.d/{}: not a drop-in path", name, dropin));
    auto& u = unit(name);
    auto dropins = u.dropins;
    dropins[dropin] = content;
    ProcessSpec spec;
    for (const auto& [n, text] : dropins)
      if (auto r = apply_dropin(spec, text, name); !r) return r.error();
    u.dropins = std::move(dropins);
    u.spec = std::move(spec);
    return {};
  }

 private:
  Unit& unit(const std::string& name) {
    auto& p = units_[name];
    if (!p) p = std::make_shared<Unit>();
    return *p;
  }

  // SIGTERM and SIGCONT (a stopped process must run to handle SIGTERM) to the whole group, and
  // SIGKILL to it after the stop timeout, as systemd's KillMode=control-group does; with
  // KillMode=mixed the SIGTERM goes to the main process alone while it runs (main_exited() kills
  // the rest once it is gone).
  void terminate(const std::string& name, Unit& u) {
    const pid_t target = u.kill_mixed && u.main_running ? u.pid : -u.pgid;
    if (u.pgid) {
      ::kill(target, SIGTERM);
      ::kill(target, SIGCONT);
    }
    if (u.kill_timer || u.stop_timeout == kInfinity) return;
    u.kill_timer = std::make_unique<asio::steady_timer>(executor_, u.stop_timeout);
    u.kill_timer->async_wait([self = shared_from_this(), name, run = u.run](boost::system::error_code ec) {
      if (ec || self->closed_) return;
      auto it = self->units_.find(name);
      if (it == self->units_.end() || it->second->run != run) return;
      auto& u = *it->second;
      u.kill_timer.reset();
      if (!u.pgid || (!u.main_running && !group_alive(u.pgid))) return;
      sys::logf(sys::Level::warning, "{}: still running {} after SIGTERM: sending SIGKILL to its process group {}",
                name, util::format_seconds(u.stop_timeout), u.pgid);
      u.killed = true;
      ::kill(-u.pgid, SIGKILL);
    });
  }

  Result<void> watch(const std::string& name, Unit& u) {
    int fd = pidfd_open(u.pid);
    if (fd < 0)
      return make_error(Errc::unit_failed, fmt::format("cannot watch PID {} (pidfd_open needs Linux 5.3): {}", u.pid,
                                                       std::strerror(errno)));
    u.pidfd = std::make_unique<asio::posix::stream_descriptor>(executor_, fd);
    arm(name, u);
    return {};
  }

  void arm(const std::string& name, Unit& u) {
    u.pidfd->async_wait(asio::posix::stream_descriptor::wait_read,
                        [self = shared_from_this(), name, run = u.run](boost::system::error_code ec) {
                          if (ec || self->closed_) return;
                          auto it = self->units_.find(name);
                          if (it == self->units_.end() || it->second->run != run) return;
                          self->on_pidfd(name, *it->second);
                        });
  }

  // The pidfd turned readable: the main process has ended (it may be a zombie until waited for).
  void on_pidfd(const std::string& name, Unit& u) {
    if (!u.main_running) return;
    int status = 0;
    pid_t r = ::waitpid(u.pid, &status, WNOHANG);
    if (r == 0 && u.own_child) {
      arm(name, u);  // not exited after all
      return;
    }
    main_exited(name, u, r == u.pid ? std::optional<int>(status) : std::nullopt);
  }

  void main_exited(const std::string& name, Unit& u, std::optional<int> status) {
    if (!u.main_running) return;
    u.main_running = false;
    u.wait_status = status;
    if (u.pidfd) {
      boost::system::error_code ec;
      u.pidfd->close(ec);
      u.pidfd.reset();
    }
    // The rest of the group is stopped as systemd stops a unit's cgroup after its main process:
    // with KillMode=mixed by SIGKILL at once, as systemd's final SIGKILL of the cgroup.
    if (group_alive(u.pgid) && u.kill_mixed)
      ::kill(-u.pgid, SIGKILL);
    else if (group_alive(u.pgid))
      terminate(name, u);
    refresh(name, u);
  }

  // Finishes the run once the main process and its group are gone: the unit's final state.
  void refresh(const std::string& name, Unit& u) {
    if (u.main_running || !u.pgid) return;
    if (group_alive(u.pgid)) return;
    u.pgid = 0;
    if (u.kill_timer) {
      u.kill_timer->cancel();
      u.kill_timer.reset();
    }
    remove_record(name);
    std::string how;
    if (u.killed) {
      u.final_state = "failed";
      u.result = "timeout";
      u.exec_main_status = SIGKILL;
      how = "was killed after its stop timeout";
    } else if (!u.wait_status) {
      // A re-adopted server is not modeld's child: its exit status cannot be known.
      u.final_state = u.stopping ? "inactive" : "failed";
      u.result = u.stopping ? "success" : "unknown";
      how = "has ended (exit status unknown: it was started by an earlier modeld)";
    } else if (WIFEXITED(*u.wait_status)) {
      u.exec_main_status = WEXITSTATUS(*u.wait_status);
      u.final_state = u.exec_main_status == 0 ? "inactive" : "failed";
      u.result = u.exec_main_status == 0 ? "success" : "exit-code";
      how = fmt::format("exited with status {}", u.exec_main_status);
    } else {
      int sig = WTERMSIG(*u.wait_status);
      u.exec_main_status = sig;
      // systemd counts these as a clean end of a service (SuccessExitStatus= defaults).
      bool clean = sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGPIPE;
      u.final_state = clean ? "inactive" : "failed";
      u.result = clean ? "success" : WCOREDUMP(*u.wait_status) ? "core-dump" : "signal";
      how = fmt::format("was ended by signal {} ({})", sig, strsignal(sig));
    }
    sys::logf(u.final_state == "failed" && !u.stopping ? sys::Level::warning : sys::Level::info, "{}: PID {} {}: {}",
              name, u.pid, how, u.final_state);
  }

  // ---- records, for a restarted modeld -------------------------------------------------------

  void write_record(const std::string& name, const Unit& u) {
    if (options_.record_dir.empty()) return;
    auto st = proc_stat(u.pid);
    if (!st) return;
    auto text = fmt::format("{} {} {} {} {}\n", u.pid, st->starttime, boot_id(), u.invocation_id,
                            u.stop_timeout == kInfinity ? -1 : u.stop_timeout.count());
    if (auto r = util::write_file_atomically(options_.record_dir / name, text, 0644); !r)
      sys::logf(sys::Level::warning, "{}; a restarted modeld will not know {} is running, ignoring", r.error().message,
                name);
  }

  void remove_record(const std::string& name) {
    if (options_.record_dir.empty()) return;
    std::error_code ec;
    fs::remove(options_.record_dir / name, ec);
  }

  void adopt_recorded() {
    std::error_code ec;
    const auto boot = boot_id();
    for (fs::directory_iterator p(options_.record_dir, ec), end; !ec && p != end; p.increment(ec)) {
      const auto name = p->path().filename().string();
      if (name.find(".tmp-") != std::string::npos || !p->is_regular_file()) continue;
      auto text = util::read_file(p->path(), 4096);
      long long pid = 0, timeout = 0;
      unsigned long long start = 0;
      char b[64] = {}, inv[64] = {};
      bool ok = text && std::sscanf(text->c_str(), "%lld %llu %63s %63s %lld", &pid, &start, b, inv, &timeout) == 5;
      auto st = ok ? proc_stat(static_cast<pid_t>(pid)) : std::nullopt;
      if (!ok || boot != b || !st || st->starttime != start || st->state == 'Z' || st->pgrp != pid) {
        // From before a reboot, or the server ended while no modeld watched it.
        fs::remove(p->path(), ec);
        ec.clear();
        continue;
      }
      auto& u = unit(name);
      u.pid = u.pgid = static_cast<pid_t>(pid);
      u.own_child = false;
      u.main_running = true;
      u.invocation_id = inv;
      u.stop_timeout = timeout < 0 ? kInfinity : std::chrono::milliseconds(timeout);
      ++u.run;
      if (auto w = watch(name, u); !w) {
        sys::logf(sys::Level::warning, "{}: PID {} runs but {}; it is not managed, ignoring", name, pid,
                  w.error().message);
        units_.erase(name);
        continue;
      }
      sys::logf(sys::Level::notice, "{}: re-adopted PID {} (process group {}) started by an earlier modeld", name, pid,
                pid);
    }
  }

  // As PID 1, modeld inherits every orphan of the container: reap them all, recording the status
  // of a unit's main process when it is one of them.
  void reap_orphans() {
    sigchld_ = std::make_unique<asio::signal_set>(executor_, SIGCHLD);
    arm_reaper();
  }

  void arm_reaper() {
    sigchld_->async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
      if (ec || self->closed_) return;
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        for (auto& [name, u] : self->units_)
          if (u->main_running && u->pid == pid) self->main_exited(name, *u, status);
      }
      self->arm_reaper();
    });
  }

  asio::any_io_executor executor_;
  ProcessManagerOptions options_;
  std::map<std::string, std::shared_ptr<Unit>> units_;
  std::unique_ptr<asio::signal_set> sigchld_;
  bool closed_ = false;
};

class ProcessManager final : public ServiceManager {
 public:
  ProcessManager(asio::any_io_executor executor, ProcessManagerOptions options)
      : journal_(options.journal), core_(std::make_shared<Core>(std::move(executor), std::move(options))) {
    core_->init();
  }
  // The servers keep running: a modeld restart must not stop the model (see the file comment).
  ~ProcessManager() override { core_->close(); }
  ProcessManager(const ProcessManager&) = delete;
  ProcessManager& operator=(const ProcessManager&) = delete;

  asio::awaitable<Result<void>> start(const std::string& unit) override { co_return core_->start(unit); }
  asio::awaitable<Result<void>> stop(const std::string& unit) override { co_return core_->stop(unit); }
  asio::awaitable<Result<UnitStatus>> status(const std::string& unit) override { co_return core_->status(unit); }
  asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string& unit) override {
    co_return core_->pids(unit);
  }
  asio::awaitable<Result<void>> reset_failed(const std::string& unit) override {
    core_->reset_failed(unit);
    co_return Result<void>{};
  }
  // Drop-ins take effect at write_dropin(): there is nothing to re-read.
  asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string& unit, const std::string& name, const std::string& content) override {
    return core_->write_dropin(unit, name, content);
  }
  asio::awaitable<Result<std::vector<std::string>>> units_up(const std::string& pattern) override {
    co_return core_->units_up(pattern);
  }
  // A re-adopted server's drop-ins died with the modeld that wrote them: none until rewritten.
  Result<std::optional<std::string>> read_dropin(const std::string& unit, const std::string& name) const override {
    return core_->dropin(unit, name);
  }
  // The servers write to journald under their own identifier, when journald's stream socket is
  // there to take it (start() asks sd_journal_stream_fd); in a container without journald their
  // output goes to modeld's own.
  JournalSource journal_of(const std::string& unit) const override {
    return JournalSource{identifier(unit), journal_ && ::access("/run/systemd/journal/stdout", F_OK) == 0};
  }

 private:
  bool journal_;
  std::shared_ptr<Core> core_;
};

}  // namespace

std::unique_ptr<ServiceManager> make_process_manager(asio::any_io_executor executor, ProcessManagerOptions options) {
  return std::make_unique<ProcessManager>(std::move(executor), std::move(options));
}

}  // namespace modeld::units
