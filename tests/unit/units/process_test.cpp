#include "units/service_manager.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <signal.h>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

using namespace modeld;
using namespace modeld::units;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// ---- drop-in parsing -------------------------------------------------------------------------

ProcessSpec parse(const std::string& text, const std::string& unit = "modeld-serve@m.service") {
  ProcessSpec spec;
  auto r = apply_dropin(spec, text, unit);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r.has_value());
  return spec;
}

// ---- running the manager ---------------------------------------------------------------------

// Runs the io_context for `d` (timers and pidfd callbacks fire meanwhile).
void pump(asio::io_context& io, std::chrono::milliseconds d) {
  bool fired = false;
  asio::steady_timer t(io, d);
  t.async_wait([&](boost::system::error_code) { fired = true; });
  while (!fired) {
    if (io.stopped()) io.restart();
    io.run_one();
  }
}

// co_awaits `a` on `io` and returns its value (fails the test after 20 s).
template <class T>
T await(asio::io_context& io, asio::awaitable<T> a) {
  std::optional<T> out;
  asio::co_spawn(io, std::move(a), [&](std::exception_ptr e, T v) {
    if (e) std::rethrow_exception(e);
    out = std::move(v);
  });
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!out && std::chrono::steady_clock::now() < deadline) pump(io, 5ms);
  REQUIRE(out);
  return std::move(*out);
}

struct Harness {
  asio::io_context io;
  fs::path dir;
  std::string unit = "modeld-serve@t.service";
  std::unique_ptr<ServiceManager> m;

  Harness() {
    char tmpl[] = "/tmp/process-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    m = make_process_manager(io.get_executor(), options());
  }
  std::vector<pid_t> started;  // main PIDs (= process groups) of every run

  ~Harness() {
    // Leave nothing running: a failed test must not leak a group of sleeps.
    m.reset();
    for (auto pid : started) {
      if (::getpgid(pid) == pid) ::kill(-pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, WNOHANG);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  ProcessManagerOptions options() const {
    ProcessManagerOptions o;
    o.record_dir = dir / "records";
    o.journal = false;
    return o;
  }

  // Configures the unit to run `sh -c SCRIPT` (SCRIPT quoted for a drop-in), plus `extra` lines.
  void configure(const std::string& script, const std::string& extra = "") {
    std::string quoted;
    for (char c : script) {
      if (c == '"' || c == '\\') quoted += '\\';
      if (c == '$') quoted += '$';  // "$$" is a literal '$' for systemd and for the process backend
      if (c == '%') quoted += '%';
      quoted += c;
    }
    auto r = m->write_dropin(unit, "10-modeld.conf",
                             "[Service]\nExecStart=\nExecStart=\"/bin/sh\" \"-c\" \"" + quoted + "\"\n" + extra);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
  }

  UnitStatus status() {
    auto st = await(io, m->status(unit));
    REQUIRE(st.has_value());
    return *st;
  }
  std::vector<std::uint32_t> pids() {
    auto p = await(io, m->pids(unit));
    REQUIRE(p.has_value());
    return *p;
  }
  void start() {
    auto r = await(io, m->start(unit));
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    if (auto pid = status().main_pid) started.push_back(static_cast<pid_t>(pid));
  }
  void stop() { REQUIRE(await(io, m->stop(unit)).has_value()); }

  // Polls status() every 10 ms until `pred` holds, for at most `timeout`.
  UnitStatus wait_for(const std::function<bool(const UnitStatus&)>& pred, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto st = status();
      if (pred(st)) return st;
      INFO("state " << to_string(st.active_state) << "/" << st.sub_state);
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pump(io, 10ms);
    }
  }
  UnitStatus wait_ended() {
    return wait_for([](const UnitStatus& s) { return s.active_state == ActiveState::inactive || s.active_state == ActiveState::failed; });
  }
  bool wait_file(const fs::path& p, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!fs::exists(p)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      pump(io, 10ms);
    }
    return true;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("a drop-in as modeld renders it gives the command, folder, environment and stop timeout") {
  auto spec = parse(
      "# Written by modeld\n[Unit]\nDescription=modeld model service m (org/m)\n\n[Service]\n"
      "ExecStart=\nExecStart=\"/usr/bin/vllm\" \"serve\" \"/srv/models 100%%/m\" \"--say\" \"a \\\"quoted\\\" \\\\ "
      "word\" \"$$HOME\"\n"
      "WorkingDirectory=/srv/models 100%%/m\n"
      "Environment=\"HF_HUB_OFFLINE=1\"\nEnvironment=\"NOTE=a b$$c\"\n"
      "TimeoutStartSec=infinity\nTimeoutStopSec=30s\n");
  CHECK(spec.argv == std::vector<std::string>{"/usr/bin/vllm", "serve", "/srv/models 100%/m", "--say",
                                              "a \"quoted\" \\ word", "$$HOME"});
  CHECK(spec.working_directory == "/srv/models 100%/m");
  // '$' means nothing in Environment= (systemd.exec(5)): the value keeps what was written.
  CHECK(spec.environment == std::vector<std::string>{"HF_HUB_OFFLINE=1", "NOTE=a b$$c"});
  CHECK(spec.stop_timeout == 30s);
  CHECK(exec_argv(spec, {"HOME=/root"}).back() == "$HOME");
}

TEST_CASE("exec_argv expands ${VAR} and whole-word $VAR from the environment, later values winning") {
  ProcessSpec spec;
  spec.argv = {"/bin/x", "--dir=${D}/sub", "$D", "$$D", "${UNSET}", "a$b"};
  auto argv = exec_argv(spec, {"D=/first", "D=/srv"});
  CHECK(argv == std::vector<std::string>{"/bin/x", "--dir=/srv/sub", "/srv", "$D", "", "a$b"});
}

TEST_CASE("later drop-ins replace or reset what earlier ones set, and other sections are ignored") {
  ProcessSpec spec;
  REQUIRE(apply_dropin(spec, "[Service]\nExecStart=/bin/a one\nEnvironment=A=1 'B=two words'\n", "u.service").has_value());
  CHECK(spec.argv == std::vector<std::string>{"/bin/a", "one"});
  CHECK(spec.environment == std::vector<std::string>{"A=1", "B=two words"});
  REQUIRE(apply_dropin(spec, "[Unit]\nExecStart=/not/this\n[Service]\nExecStart=\nExecStart=/bin/b \\\n  two\n"
                             "Environment=\nEnvironment=C=%i\n", "x@inst.service").has_value());
  CHECK(spec.argv == std::vector<std::string>{"/bin/b", "two"});
  CHECK(spec.environment == std::vector<std::string>{"C=inst"});
}

TEST_CASE("time spans parse as systemd writes them") {
  auto timeout = [](const std::string& v) { return parse("[Service]\nTimeoutStopSec=" + v + "\n").stop_timeout; };
  CHECK(timeout("5min") == 300s);
  CHECK(timeout("1min 30s") == 90s);
  CHECK(timeout("90") == 90s);
  CHECK(timeout("1.5s") == 1500ms);
  CHECK(timeout("250ms") == 250ms);
  CHECK(timeout("2h") == 7200s);
  CHECK(timeout("infinity") == std::chrono::milliseconds::max());
  CHECK(timeout("0") == std::chrono::milliseconds::max());
  CHECK(parse("[Service]\n").stop_timeout == 90s);
}

TEST_CASE("a drop-in the parser cannot read is config_invalid naming the unit and line") {
  ProcessSpec spec;
  auto r = apply_dropin(spec, "[Service]\nWorkingDirectory=/x\nExecStart=\"/bin/a\" \"unterminated\n", "u@a.service");
  REQUIRE(!r);
  CHECK(r.error().code == Errc::config_invalid);
  CHECK_THAT(r.error().message, Catch::Contains("u@a.service") && Catch::Contains("line 3") &&
                                    Catch::Contains("unterminated"));
  auto t = apply_dropin(spec, "[Service]\nTimeoutStopSec=5 fortnights\n", "u.service");
  REQUIRE(!t);
  CHECK_THAT(t.error().message, Catch::Contains("line 2") && Catch::Contains("fortnights"));
  auto s = apply_dropin(spec, "[Service]\nExecStart=/bin/a %Z\n", "u.service");
  REQUIRE(!s);
  CHECK_THAT(s.error().message, Catch::Contains("%Z"));
  // The failed drop-in left the spec as it was.
  CHECK(spec.argv.empty());
  CHECK(spec.working_directory.empty());
}

TEST_CASE("a started server runs in its own session and process group and is active until stopped") {
  Harness h;
  h.configure("exec sleep 600");
  auto before = h.status();
  CHECK(before.active_state == ActiveState::inactive);
  h.start();
  auto st = h.status();
  CHECK(st.active_state == ActiveState::active);
  CHECK(st.sub_state == "running");
  REQUIRE(st.main_pid > 0);
  auto pid = static_cast<pid_t>(st.main_pid);
  CHECK(::getpgid(pid) == pid);
  CHECK(::getsid(pid) == pid);
  CHECK(st.invocation_id.size() == 32);
  CHECK(st.invocation_id.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(h.pids() == std::vector<std::uint32_t>{st.main_pid});
  // Starting an active unit does nothing, as StartUnit does.
  h.start();
  CHECK(h.status().main_pid == st.main_pid);

  h.stop();
  auto end = h.wait_ended();
  // SIGTERM is a clean end for systemd, and so here.
  CHECK(end.active_state == ActiveState::inactive);
  CHECK(end.result == "success");
  CHECK(end.main_pid == 0);
  CHECK(h.pids().empty());
  // A new run gets a new invocation ID.
  h.start();
  CHECK(h.status().invocation_id != st.invocation_id);
  h.stop();
  h.wait_ended();
}

TEST_CASE("a clean exit leaves the unit inactive, a non-zero one failed with its status until reset_failed") {
  Harness h;
  h.configure("exit 0");
  h.start();
  auto ok = h.wait_ended();
  CHECK(ok.active_state == ActiveState::inactive);
  CHECK(ok.result == "success");
  CHECK(ok.exec_main_status == 0);

  h.configure("exit 3");
  h.start();
  auto bad = h.wait_ended();
  CHECK(bad.active_state == ActiveState::failed);
  CHECK(bad.sub_state == "failed");
  CHECK(bad.result == "exit-code");
  CHECK(bad.exec_main_status == 3);
  REQUIRE(await(h.io, h.m->reset_failed(h.unit)).has_value());
  CHECK(h.status().active_state == ActiveState::inactive);
}

TEST_CASE("a server killed by a signal leaves the unit failed with result signal") {
  Harness h;
  h.configure("kill -USR1 $$; sleep 5");
  h.start();
  auto st = h.wait_ended();
  CHECK(st.active_state == ActiveState::failed);
  CHECK(st.result == "signal");
  CHECK(st.exec_main_status == SIGUSR1);
}

TEST_CASE("the environment, working directory and invocation ID reach the server, and stdin is /dev/null") {
  Harness h;
  auto out = h.dir / "out";
  fs::create_directories(h.dir / "work dir");
  h.configure("read line; r=$?; echo \"$FOO|$(pwd)|$INVOCATION_ID|$NOTIFY_SOCKET|${PATH:+path}|$r\" > '" + out.string() + "'",
              "WorkingDirectory=" + (h.dir / "work dir").string() + "\nEnvironment=\"FOO=bar baz\"\n");
  ::setenv("NOTIFY_SOCKET", "/run/must-not-leak", 1);
  h.start();
  ::unsetenv("NOTIFY_SOCKET");
  auto st = h.wait_ended();
  CHECK(st.result == "success");
  CHECK(slurp(out) == "bar baz|" + (h.dir / "work dir").string() + "|" + st.invocation_id + "||path|1\n");
}

TEST_CASE("stopping a group whose worker ignores SIGTERM sends SIGKILL after TimeoutStopSec") {
  Harness h;
  auto ready = h.dir / "worker-ready";
  h.configure("(trap '' TERM; touch '" + ready.string() + "'; exec sleep 600) & exec sleep 600",
              "TimeoutStopSec=1s\n");
  h.start();
  REQUIRE(h.wait_file(ready));
  auto main_pid = h.status().main_pid;
  auto members = h.pids();
  REQUIRE(members.size() == 2);
  CHECK(std::count(members.begin(), members.end(), main_pid) == 1);

  auto t0 = std::chrono::steady_clock::now();
  h.stop();
  // The main process ends at SIGTERM, the worker keeps the unit deactivating.
  auto draining = h.wait_for([&](const UnitStatus& s) { return s.main_pid == 0; });
  CHECK(draining.active_state == ActiveState::deactivating);
  auto left = h.pids();
  REQUIRE(left.size() == 1);
  CHECK(left[0] != main_pid);
  auto end = h.wait_ended();
  CHECK(std::chrono::steady_clock::now() - t0 >= 900ms);
  CHECK(end.active_state == ActiveState::failed);
  CHECK(end.result == "timeout");
  CHECK(h.pids().empty());
}

TEST_CASE("when the main process exits on its own, the rest of its group is stopped too") {
  Harness h;
  auto ready = h.dir / "worker-ready";
  h.configure("sleep 600 & touch '" + ready.string() + "'; exit 4", "TimeoutStopSec=5s\n");
  h.start();
  auto st = h.wait_ended();
  CHECK(st.active_state == ActiveState::failed);
  CHECK(st.exec_main_status == 4);
  CHECK(h.pids().empty());
}

TEST_CASE("starting a unit without a drop-in or with a missing program is unit_failed naming it") {
  Harness h;
  auto none = await(h.io, h.m->start(h.unit));
  REQUIRE(!none);
  CHECK(none.error().code == Errc::unit_failed);
  CHECK_THAT(none.error().message, Catch::Contains(h.unit) && Catch::Contains("ExecStart"));

  REQUIRE(h.m->write_dropin(h.unit, "10-modeld.conf", "[Service]\nExecStart=/no/such/program --x\n").has_value());
  auto missing = await(h.io, h.m->start(h.unit));
  REQUIRE(!missing);
  CHECK_THAT(missing.error().message, Catch::Contains(h.unit) && Catch::Contains("/no/such/program"));
  auto st = h.status();
  CHECK(st.active_state == ActiveState::failed);
  CHECK(st.exec_main_status == 203);
  CHECK(await(h.io, h.m->stop(h.unit)).has_value());  // nothing to stop is no error
}

TEST_CASE("a restarted manager re-adopts the server its predecessor started, lists it as up, and can stop it") {
  Harness h;
  h.configure("exec sleep 600", "TimeoutStopSec=7s\n");
  h.start();
  auto before = h.status();

  // The drop-in it ran with is known only to the manager that wrote it.
  auto dropin = h.m->read_dropin(h.unit, "10-modeld.conf");
  REQUIRE(dropin.has_value());
  CHECK(dropin->has_value());
  h.m.reset();  // modeld exits: the server keeps running
  CHECK(::kill(static_cast<pid_t>(before.main_pid), 0) == 0);

  h.m = make_process_manager(h.io.get_executor(), h.options());
  auto listed = await(h.io, h.m->units_up("modeld-serve@*.service"));
  REQUIRE(listed.has_value());
  CHECK(*listed == std::vector<std::string>{h.unit});
  auto none = await(h.io, h.m->units_up("other@*.service"));
  REQUIRE(none.has_value());
  CHECK(none->empty());
  auto lost = h.m->read_dropin(h.unit, "10-modeld.conf");
  REQUIRE(lost.has_value());
  CHECK_FALSE(lost->has_value());
  auto after = h.status();
  CHECK(after.active_state == ActiveState::active);
  CHECK(after.main_pid == before.main_pid);
  CHECK(after.invocation_id == before.invocation_id);
  CHECK(h.pids() == std::vector<std::uint32_t>{before.main_pid});
  h.stop();
  auto end = h.wait_ended();
  CHECK(end.active_state == ActiveState::inactive);
  CHECK(h.pids().empty());
  CHECK(fs::is_empty(h.dir / "records"));
}

TEST_CASE("the process backend finds a unit's output by its identifier, and none when it sends none to journald") {
  Harness h;  // journal = false: the servers write to modeld's own output
  auto j = h.m->journal_of(h.unit);
  CHECK(j.identifier == "modeld-serve@t");
  CHECK_FALSE(j.readable);
  ProcessManagerOptions o = h.options();
  o.journal = true;
  o.record_dir = h.dir / "records-2";
  auto with_journal = make_process_manager(h.io.get_executor(), o);
  CHECK(with_journal->journal_of(h.unit).readable == (::access("/run/systemd/journal/stdout", F_OK) == 0));
}

TEST_CASE("with KillMode=mixed a stop signals the main process alone, and kills the rest once it has exited") {
  Harness h;
  auto worker_ready = h.dir / "worker-ready";
  auto worker_term = h.dir / "worker-got-sigterm";
  auto drained = h.dir / "drained";
  // The worker would note a SIGTERM; the main process drains 300 ms on SIGTERM, then exits 0.
  h.configure("(trap \"touch '" + worker_term.string() + "'\" TERM; touch '" + worker_ready.string() +
                  "'; while :; do sleep 0.05; done) & trap \"sleep 0.3; touch '" + drained.string() +
                  "'; exit 0\" TERM; while :; do sleep 0.05; done",
              "KillMode=mixed\nTimeoutStopSec=20s\n");
  h.start();
  REQUIRE(h.wait_file(worker_ready));
  REQUIRE(h.pids().size() >= 2);
  auto t0 = std::chrono::steady_clock::now();
  h.stop();
  auto end = h.wait_ended();
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 300ms);
  CHECK(took < 10s);  // not the stop timeout: the rest went at the main process's exit
  CHECK(std::filesystem::exists(drained));
  CHECK_FALSE(std::filesystem::exists(worker_term));
  CHECK(end.active_state == ActiveState::inactive);
  CHECK(end.result == "success");
  CHECK(h.pids().empty());
}

TEST_CASE("KillMode is read from the drop-ins: mixed, else the template's control-group") {
  CHECK(parse("[Service]\nKillMode=mixed\n").kill_mixed);
  CHECK_FALSE(parse("[Service]\nKillMode=control-group\n").kill_mixed);
  CHECK_FALSE(parse("[Service]\nExecStart=/bin/true\n").kill_mixed);
}
