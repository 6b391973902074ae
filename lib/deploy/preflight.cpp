// The pre-flight: the new server's program, GPUs and port, checked before anything is stopped.
#include "deploy/preflight.hpp"
#include "deploy/launch.hpp"

#include "deploy/gpu_watch.hpp"
#include "deploy/leftovers.hpp"
#include "gpu/nvml.hpp"
#include "util/files.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <set>
#include <sstream>

namespace modeld::deploy {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// systemd 252's DEFAULT_PATH on a merged-/usr system with split bin/sbin (Debian 12), the
// order `systemd-path search-binaries-default` prints.
constexpr const char* kSystemdSearchPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

std::vector<fs::path> split_path(std::string_view text) {
  std::vector<fs::path> out;
  std::stringstream in{std::string(text)};
  for (std::string dir; std::getline(in, dir, ':');)
    if (!dir.empty()) out.emplace_back(dir);
  return out;
}

std::string joined(const std::vector<fs::path>& dirs) {
  std::vector<std::string> parts;
  for (const auto& d : dirs) parts.push_back(d.string());
  return fmt::format("{}", fmt::join(parts, ":"));
}

bool has_execute_bit(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111) != 0;
}

// The bit of `mode` that grants `bit` (1 execute/search) to `who`, as the kernel picks the class.
bool grants(const struct stat& st, const Credentials& who, unsigned bit) {
  if (who.known && who.uid == 0) return (st.st_mode & 0111) != 0 || S_ISDIR(st.st_mode);
  if (who.known && st.st_uid == who.uid) return (st.st_mode & (bit << 6)) != 0;
  if (who.known && std::find(who.gids.begin(), who.gids.end(), st.st_gid) != who.gids.end())
    return (st.st_mode & (bit << 3)) != 0;
  return (st.st_mode & bit) != 0;
}

// The first folder above `path` that `who` may not search, as "the folder D (mode 0700)".
std::optional<std::string> unsearchable_folder(const fs::path& path, const Credentials& who) {
  if (who.known && who.uid == 0) return std::nullopt;  // root searches every folder
  for (fs::path dir = path.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && !grants(st, who, 1))
      return fmt::format("the folder {} (mode {:04o}) cannot be searched by {}", dir.string(), st.st_mode & 07777,
                         who.name);
    if (dir == dir.root_path()) break;
  }
  return std::nullopt;
}

// Whether modeld's /tmp is its own (PrivateTmp=yes in modeld.service): the model services, which
// do not have it, see another /tmp. Read from the mount's root in /proc/self/mountinfo.
bool tmp_is_private() {
  auto text = util::read_file("/proc/self/mountinfo", 4u << 20);
  if (!text) return false;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream cols(line);
    std::string id, parent, dev, root, point;
    if (cols >> id >> parent >> dev >> root >> point && (point == "/tmp" || point == "/var/tmp") &&
        root.find("systemd-private-") != std::string::npos)
      return true;
  }
  return false;
}

std::optional<unsigned> number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return static_cast<unsigned>(std::strtoul(text.c_str(), nullptr, 10));
}

// The user's supplementary groups besides `gid` (getgrouplist, grown until they fit).
std::vector<unsigned> groups_of(const char* user, gid_t gid) {
  std::vector<gid_t> groups(32);
  int n = static_cast<int>(groups.size());
  while (::getgrouplist(user, gid, groups.data(), &n) < 0) groups.resize(static_cast<std::size_t>(n) + 8);
  std::vector<unsigned> out{gid};
  for (int i = 0; i < n; ++i)
    if (groups[i] != gid) out.push_back(groups[i]);
  return out;
}

// Group= by name or number; nullopt (with `why`) when it names no group.
std::optional<unsigned> group_id(const std::string& group, std::string& why) {
  if (auto n = number(group)) return *n;
  if (const struct group* g = ::getgrnam(group.c_str())) return g->gr_gid;
  why = fmt::format("Group={} names no group of this host: systemd would end the start with exit status 216 "
                    "(EXIT_GROUP)", group);
  return std::nullopt;
}

}  // namespace

std::vector<fs::path> systemd_search_path() { return split_path(kSystemdSearchPath); }

Result<Credentials> credentials_of(const units::ExecIdentity& id) {
  if (id.dynamic) return Credentials{0, {}, false, "a dynamic user (DynamicUser=yes)"};
  if (id.user.empty() || id.user == "root" || id.user == "0") return Credentials{};
  const struct passwd* pw = number(id.user) ? ::getpwuid(*number(id.user)) : ::getpwnam(id.user.c_str());
  if (!pw && !number(id.user))
    return make_error(Errc::unit_failed, fmt::format("User={} names no user of this host: systemd would end the start "
                                                     "with exit status 217 (EXIT_USER)", id.user));
  Credentials c{pw ? pw->pw_uid : *number(id.user), {}, pw != nullptr, "user " + id.user};
  std::string why;
  std::optional<unsigned> gid = pw ? std::optional<unsigned>(pw->pw_gid) : std::nullopt;
  if (!id.group.empty() && !(gid = group_id(id.group, why))) return make_error(Errc::unit_failed, why);
  if (pw) c.gids = groups_of(pw->pw_name, *gid);
  else if (gid) c.gids = {*gid};
  return c;
}

Result<fs::path> resolve_program(const std::string& program, const std::vector<fs::path>& search,
                                 const fs::path& relative_to) {
  const fs::path p(program);
  if (p.is_absolute()) return p;
  if (program.find('/') != std::string::npos) {
    if (!relative_to.empty()) return relative_to / p;
    return make_error(Errc::unit_failed,
                      fmt::format("'{}' is neither an absolute path nor a bare name, and systemd refuses such a "
                                  "command (systemd.service(5), \"COMMAND LINES\"): write its absolute path",
                                  program));
  }
  for (const auto& dir : search)
    if (has_execute_bit(dir / p)) return dir / p;
  return make_error(Errc::unit_failed,
                    fmt::format("'{}' is in none of the folders {} (the search path of a program named without a "
                                "path: {}): write its absolute path",
                                program, joined(search), search == systemd_search_path()
                                                             ? "systemd's own, not $PATH; systemd.service(5)"
                                                             : "modeld's $PATH, as the process backend runs it"));
}

std::optional<std::string> why_not_executable(const fs::path& path, const Credentials& who) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fmt::format("{}: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fmt::format("{} is not a regular file", path.string());
  if (!grants(st, who, 1))
    return fmt::format("{} (mode {:04o}, owner uid {}, group gid {}) is not executable for {}", path.string(),
                       st.st_mode & 07777, st.st_uid, st.st_gid, who.name);
  return unsearchable_folder(path, who);
}

namespace {

std::string key(const config::ModelConfig& m, std::string_view name) {
  return fmt::format("models.{}.serve.{}", m.name, name);
}

std::string where(const config::ModelConfig& m) { return fmt::format("set in {}", m.source_file.string()); }

PreflightCheck failed(std::string check, const config::ModelConfig& m, std::string_view name, const std::string& why) {
  return PreflightCheck{std::move(check), false, fmt::format("{} ({}): {}", key(m, name), where(m), why)};
}

// The program of the drop-in's ExecStart= (placeholders expanded), resolved and checked for
// `who`, on the calling thread (blocks: stats).
PreflightCheck check_program(const config::ModelConfig& m, const StartedSettings& started, const Credentials& who,
                             bool process_backend) {
  const std::string& program = started.command.front();
  const auto search = process_backend ? split_path(std::getenv("PATH") ? std::getenv("PATH") : kSystemdSearchPath)
                                      : systemd_search_path();
  auto path = resolve_program(program, search, process_backend ? fs::path(started.working_directory) : fs::path());
  if (!path) return failed("command", m, "command[0]", path.error().message);
  if (auto why = why_not_executable(*path, who)) {
    const auto s = path->string();
    if ((s.starts_with("/tmp/") || s.starts_with("/var/tmp/")) && !fs::exists(*path) && tmp_is_private())
      return PreflightCheck{"command", true, fmt::format("not checked: {} is under modeld's own /tmp (PrivateTmp=yes), "
                                                         "not the one the model service sees", s)};
    return failed("command", m, "command[0]", *why);
  }
  return PreflightCheck{"command", true, fmt::format("{} is executable for {}", path->string(), who.name)};
}

// check_program for the unit's user (the user database read there too: NSS may block).
PreflightCheck check_program_for(const config::ModelConfig& m, const StartedSettings& started,
                                 const units::ExecIdentity& id, bool process_backend) {
  auto who = credentials_of(id);
  if (!who) {
    const auto unit = units::serve_unit(m.name);
    return failed("command", m, "command[0]",
                  fmt::format("it cannot run as the user of {}: {} (a drop-in of the unit: systemctl cat {})", unit,
                              who.error().message, unit));
  }
  return check_program(m, started, *who, process_backend);
}

asio::awaitable<PreflightCheck> check_command(Services& s, const config::ModelConfig& m) {
  const auto unit = units::serve_unit(m.name);
  auto id = co_await s.units.identity(unit);
  if (!id)
    co_return PreflightCheck{"command", true, fmt::format("not checked: the user of {}: {}", unit, id.error().message)};
  const StartedSettings started = started_settings(s, m);
  const bool process = s.config->daemon.service_manager == "process";
  co_return co_await util::on_pool<PreflightCheck>(s.disk_pool,
                                                   [&] { return check_program_for(m, started, *id, process); });
}

asio::awaitable<PreflightCheck> check_gpus(Services& s, const config::ModelConfig& m) {
  const auto seen = co_await gpus_visible(s, m.serve);
  using V = GpuVisibility::Verdict;
  if (seen.verdict == V::unknown)
    co_return PreflightCheck{"gpus", true, fmt::format("not checked: NVML did not answer: {}", seen.detail)};
  if (seen.verdict == V::visible) co_return PreflightCheck{"gpus", true, seen.detail};
  if (m.serve.gpu_ids)
    co_return failed("gpus", m, fmt::format("gpu_ids = [{}]", fmt::join(*m.serve.gpu_ids, ", ")), seen.detail);
  co_return failed("gpus", m, fmt::format("gpus = {}", m.serve.gpus), seen.detail);
}

// The port: free, or listened on only by the model's own service or a service being stopped. A
// holder modeld cannot see (another PID namespace) may be one of them when one of them runs.
asio::awaitable<PreflightCheck> check_port(Services& s, const config::ModelConfig& m,
                                           const std::vector<Placement>& stops) {
  const auto port = m.serve.port;
  auto ours = co_await pids_or_none(s.units, units::serve_unit(m.name));
  bool may_be_ours = !ours.empty();
  for (const auto& o : stops) {
    auto old = co_await pids_or_none(s.units, units::serve_unit(o.model));
    may_be_ours = may_be_ours || (!old.empty() && o.port == port);
    ours.insert(old.begin(), old.end());
  }
  const auto others = other_listeners(port, ours, may_be_ours);
  if (!others)
    co_return PreflightCheck{"port", true, fmt::format("port {} is free or held only by a service this deployment "
                                                       "stops", port)};
  const auto holders =
      others->holders.empty() ? std::string("a process modeld cannot see") : describe_processes(others->holders);
  co_return failed("port", m, fmt::format("port = {}", port),
                   fmt::format("port {} is held by {}, which is not a model service this deployment stops: stop it "
                               "or change {}",
                               port, holders, key(m, "port")));
}

std::vector<Placement> stops_of(const Services& s, const Run& run) {
  std::vector<Placement> out;
  for (const auto& a : run.record.previous) out.push_back(placement_of(a, s.config->find_model(a.model)));
  return out;
}

}  // namespace

asio::awaitable<std::vector<PreflightCheck>> run_preflight(Services& s, const config::ModelConfig& model,
                                                           const std::vector<Placement>& stops) {
  std::vector<PreflightCheck> checks;
  checks.push_back(co_await check_command(s, model));
  checks.push_back(co_await check_gpus(s, model));
  checks.push_back(co_await check_port(s, model, stops));
  co_return checks;
}

asio::awaitable<Result<void>> preflight_of_run(Services& s, const Run& run, std::string_view refusing) {
  const auto stops = stops_of(s, run);
  const auto checks = co_await run_preflight(s, run.model, stops);
  std::vector<std::string> failures, passed;
  for (const auto& c : checks) (c.ok ? passed : failures).push_back(fmt::format("{}: {}", c.check, c.message));
  if (!failures.empty())
    co_return make_error(Errc::unit_failed,
                         fmt::format("pre-flight failed: {}; {}", fmt::join(failures, "; "), refusing));
  sys::logf(sys::Level::info, run.fields(), "pre-flight passed: {}", fmt::join(passed, "; "));
  co_return Result<void>{};
}

std::string explain_exit(const config::ModelConfig& model, const StartedSettings& started,
                         const units::UnitStatus& status, std::string_view service_manager) {
  const auto meaning = units::systemd_exit_status(status.exec_main_status);
  if (status.result != "exit-code" || !meaning) return {};
  std::string out = fmt::format("systemd's EXIT_{}, {}", meaning->name, meaning->description);
  const auto unit = units::serve_unit(model.name);
  if (status.exec_main_status == 203 && !started.command.empty()) {
    const auto& program = started.command.front();
    out += fs::path(program).is_absolute() || service_manager == "process"
               ? fmt::format(": {} ({} of {})", program, key(model, "command[0]"), model.source_file.string())
               : fmt::format(": {} looked up in {} ({} of {})", program, kSystemdSearchPath, key(model, "command[0]"),
                             model.source_file.string());
  } else if (status.exec_main_status == 200) {
    out += fmt::format(": {}", started.working_directory);
  } else if (status.exec_main_status == 216 || status.exec_main_status == 217) {
    out += fmt::format(": the User=/Group= of {} (systemctl cat {})", unit, unit);
  }
  return out;
}

}  // namespace modeld::deploy
