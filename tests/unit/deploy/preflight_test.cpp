// The pre-flight (preflight.hpp) on real files, a real listening socket and real users (root and
// nobody), with NVML's snapshots scripted through the Services::gpu_snapshot seam and the unit's
// User= and processes through FakeUnits: each check passes on what would start, and fails on what
// would not, naming the key and the configuration file. Also the words for systemd's exit statuses.

#include "deploy/preflight.hpp"

#include "gpu/nvml.hpp"
#include "http/client.hpp"
#include "store/store.hpp"

#include "unit/deploy/fake_units.hpp"
#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace modeld;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

void write_program(const fs::path& p, fs::perms mode) {
  std::ofstream(p) << "#!/bin/sh\n";
  fs::permissions(p, mode);
}

gpu::Snapshot gpus(unsigned n) {
  gpu::Snapshot s;
  for (unsigned i = 0; i < n; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "NVIDIA H200";
    s.gpus.push_back(g);
  }
  return s;
}

// A TCP socket listening on 127.0.0.1 at a port the kernel picks: a process that is no model service.
struct Listener {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::uint16_t port = 0;
  Listener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

struct Fixture {
  asio::io_context ioc;
  asio::thread_pool pool{1};
  fs::path dir = fresh_dir();
  std::shared_ptr<config::Config> cfg = make_config(dir);
  store::Store store{cfg->daemon.models_dir};
  http::Client client{ioc.get_executor(), {}};
  hub::Hub hub{client, "http://127.0.0.1:1"};
  test::FakeUnits units;
  deploy::Services services{cfg, store, hub, client, client, units, pool};
  Result<std::optional<gpu::Snapshot>> nvml = std::optional<gpu::Snapshot>(gpus(2));

  Fixture() {
    services.gpu_snapshot = [this] { return nvml; };
  }
  ~Fixture() {
    pool.join();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  static fs::path fresh_dir() {
    auto d = fs::temp_directory_path() / ("preflight-test-" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d / "models");
    fs::permissions(d, fs::perms(0755));
    return d;
  }

  static std::shared_ptr<config::Config> make_config(const fs::path& dir) {
    auto c = std::make_shared<config::Config>();
    c->daemon.models_dir = dir / "models";
    config::ModelConfig m;
    m.name = "new";
    m.repo = "acme/new";
    m.serve.command = {"/bin/sh", "-c", "exec server"};
    m.serve.port = 1;  // privileged: nothing listens there
    m.source_file = "/etc/modeld/models.d/new.toml";
    c->models["new"] = m;
    return c;
  }

  config::ModelConfig& model() { return cfg->models.at("new"); }

  std::vector<deploy::PreflightCheck> run(const std::vector<deploy::Placement>& stops = {}) {
    return test::run(ioc, deploy::run_preflight(services, model(), stops));
  }

  deploy::PreflightCheck check(const std::string& name, const std::vector<deploy::Placement>& stops = {}) {
    for (auto& c : run(stops))
      if (c.check == name) return c;
    FAIL("no check " << name);
    return {};
  }
};

// why_not_executable's answer, "executable" for none.
std::string why(const fs::path& p, const deploy::Credentials& who) {
  return deploy::why_not_executable(p, who).value_or("executable");
}

deploy::Credentials nobody() {
  auto c = deploy::credentials_of(units::ExecIdentity{"nobody", "", false});
  REQUIRE(c.has_value());
  return *c;
}

}  // namespace

TEST_CASE("the pre-flight runs its three checks in order and passes on what would start") {
  Fixture f;
  auto checks = f.run();
  REQUIRE(checks.size() == 3);
  CHECK(checks[0].check == "command");
  CHECK(checks[1].check == "gpus");
  CHECK(checks[2].check == "port");
  for (const auto& c : checks) {
    INFO(c.check << ": " << c.message);
    CHECK(c.ok);
  }
  CHECK_THAT(checks[0].message, Catch::Contains("/bin/sh is executable for root"));
}

TEST_CASE("a program named without a path is looked up in systemd's fixed search path, not $PATH") {
  CHECK(deploy::systemd_search_path() ==
        std::vector<fs::path>{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"});
  Fixture f;
  const auto first = f.dir / "a", second = f.dir / "b";
  fs::create_directories(first);
  fs::create_directories(second);
  write_program(first / "srv", fs::perms(0644));  // not executable: skipped, as execvp skips it
  write_program(second / "srv", fs::perms(0755));
  auto found = deploy::resolve_program("srv", {first, second});
  REQUIRE(found.has_value());
  CHECK(*found == second / "srv");
  auto missing = deploy::resolve_program("no-such-server", deploy::systemd_search_path());
  REQUIRE_FALSE(missing.has_value());
  CHECK_THAT(missing.error().message,
             Catch::Contains("'no-such-server' is in none of the folders "
                             "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") &&
                 Catch::Contains("not $PATH"));
}

TEST_CASE("a relative program path is refused for systemd and taken from the working directory otherwise") {
  auto refused = deploy::resolve_program("bin/serve", deploy::systemd_search_path());
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message, Catch::Contains("neither an absolute path nor a bare name"));
  auto relative = deploy::resolve_program("bin/serve", {}, "/var/lib/modeld/models/m");
  REQUIRE(relative.has_value());
  CHECK(*relative == fs::path("/var/lib/modeld/models/m/bin/serve"));
}

TEST_CASE("a missing program fails the command check naming command[0] and the configuration file") {
  Fixture f;
  f.model().serve.command = {"no-such-inference-server", "serve"};
  auto c = f.check("command");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::StartsWith("models.new.serve.command[0] (set in /etc/modeld/models.d/new.toml): ") &&
                            Catch::Contains("'no-such-inference-server' is in none of the folders"));
  f.model().serve.command = {(f.dir / "gone").string()};
  c = f.check("command");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::Contains((f.dir / "gone").string() + ": No such file or directory"));
}

TEST_CASE("a program without an execute bit fails for root, one with any passes") {
  Fixture f;
  const auto p = f.dir / "srv";
  write_program(p, fs::perms(0644));
  f.model().serve.command = {p.string()};
  auto c = f.check("command");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::Contains("(mode 0644, owner uid 0, group gid 0) is not executable for root"));
  fs::permissions(p, fs::perms(0700));
  CHECK(f.check("command").ok);
}

TEST_CASE("for the unit's User= the bits of that user, its groups or others count, and every folder above") {
  Fixture f;
  const auto p = f.dir / "srv";
  write_program(p, fs::perms(0700));  // root's, executable by root only
  const auto who = nobody();
  CHECK(who.uid == 65534);
  CHECK_THAT(why(p, who), Catch::Contains("is not executable for user nobody"));
  fs::permissions(p, fs::perms(0701));
  CHECK(why(p, who) == "executable");
  REQUIRE(::chown(p.c_str(), 0, 65534) == 0);  // group nogroup, nobody's own
  fs::permissions(p, fs::perms(0710));
  CHECK(why(p, who) == "executable");
  fs::permissions(p, fs::perms(0755));
  fs::permissions(f.dir, fs::perms(0700));
  CHECK_THAT(why(p, who),
             Catch::Contains("the folder " + f.dir.string() + " (mode 0700) cannot be searched by user nobody"));
  CHECK(why(p, deploy::Credentials{}) == "executable");  // root searches every folder
  SECTION("a dynamic user counts as others") {
    fs::permissions(f.dir, fs::perms(0755));
    const deploy::Credentials dynamic{0, {}, false, "a dynamic user (DynamicUser=yes)"};
    fs::permissions(p, fs::perms(0770));
    CHECK_THAT(why(p, dynamic), Catch::Contains("not executable for a dynamic user"));
    fs::permissions(p, fs::perms(0771));
    CHECK(why(p, dynamic) == "executable");
  }
}

TEST_CASE("the command check asks the service manager for the unit's user") {
  Fixture f;
  const auto p = f.dir / "srv";
  write_program(p, fs::perms(0700));
  f.model().serve.command = {p.string()};
  CHECK(f.check("command").ok);
  f.units.identities["modeld-serve@new.service"] = units::ExecIdentity{"nobody", "", false};
  auto c = f.check("command");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::StartsWith("models.new.serve.command[0]") && Catch::Contains("user nobody"));
  f.units.identities["modeld-serve@new.service"] = units::ExecIdentity{"no-such-user-here", "", false};
  c = f.check("command");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::Contains("User=no-such-user-here names no user of this host") &&
                            Catch::Contains("217 (EXIT_USER)"));
}

TEST_CASE("credentials: root, a user's own and supplementary groups, Group= and unknown names") {
  CHECK(deploy::credentials_of(units::ExecIdentity{}).value().uid == 0);
  CHECK(deploy::credentials_of(units::ExecIdentity{"root", "", false}).value().name == "root");
  auto n = deploy::credentials_of(units::ExecIdentity{"nobody", "root", false});
  REQUIRE(n.has_value());
  CHECK(n->gids.front() == 0);  // Group= replaces the primary group
  auto bad = deploy::credentials_of(units::ExecIdentity{"nobody", "no-such-group-here", false});
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message, Catch::Contains("216 (EXIT_GROUP)"));
}

TEST_CASE("a gpu_ids index NVML does not show fails the gpus check naming gpu_ids and the file") {
  Fixture f;
  f.model().serve.gpu_ids = std::vector<unsigned>{0, 5};
  f.model().serve.gpus = 2;
  auto c = f.check("gpus");
  CHECK_FALSE(c.ok);
  CHECK(c.message == "models.new.serve.gpu_ids = [0, 5] (set in /etc/modeld/models.d/new.toml): GPU 5 is not "
                     "visible: 2 GPUs");
  f.model().serve.gpu_ids = std::vector<unsigned>{1, 0};
  c = f.check("gpus");
  CHECK(c.ok);
  CHECK(c.message == "GPU 1,0 visible");
}

TEST_CASE("without gpu_ids the first serve.gpus GPUs must be visible") {
  Fixture f;
  f.model().serve.gpus = 8;
  auto c = f.check("gpus");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::StartsWith("models.new.serve.gpus = 8 (set in") &&
                            Catch::Contains("needs 8 GPUs, 2 visible"));
  f.model().serve.gpus = 2;
  CHECK(f.check("gpus").ok);
}

TEST_CASE("a host without NVML fails a model that needs a GPU and an NVML that errs is not checked") {
  Fixture f;
  f.model().serve.gpu_ids = std::vector<unsigned>{0};
  f.nvml = std::optional<gpu::Snapshot>();
  auto c = f.check("gpus");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::Contains("no NVIDIA GPU"));
  f.nvml = make_error(Errc::unit_failed, "libnvidia-ml.so.1: nvmlInit_v2: Driver Not Loaded");
  c = f.check("gpus");
  CHECK(c.ok);
  CHECK_THAT(c.message, Catch::StartsWith("not checked: NVML did not answer: ") && Catch::Contains("Driver Not Loaded"));
  f.model().serve.gpu_ids = std::vector<unsigned>{};  // no GPU: NVML is not asked
  f.nvml = std::optional<gpu::Snapshot>();
  CHECK(f.check("gpus").message == "no GPU needed");
}

TEST_CASE("a port held by a process that no stopped service runs fails the port check naming port") {
  Fixture f;
  Listener held;
  f.model().serve.port = held.port;
  auto c = f.check("port");
  CHECK_FALSE(c.ok);
  CHECK_THAT(c.message, Catch::StartsWith(fmt::format("models.new.serve.port = {} (set in", held.port)) &&
                            Catch::Contains(fmt::format("pid {} (", ::getpid())) &&
                            Catch::Contains("which is not a model service this deployment stops"));
  SECTION("held by a service the deployment stops, it passes") {
    f.units.unit_pids["modeld-serve@old.service"] = {static_cast<std::uint32_t>(::getpid())};
    const std::vector<deploy::Placement> stops{{"old", held.port, std::nullopt}};
    CHECK(f.check("port", stops).ok);
    CHECK_FALSE(f.check("port").ok);  // the same holder, with nothing stopped
  }
  SECTION("held by the model's own service (a restart of it), it passes") {
    f.units.unit_pids["modeld-serve@new.service"] = {static_cast<std::uint32_t>(::getpid())};
    CHECK(f.check("port").ok);
  }
}

TEST_CASE("preflight_of_run fails with every failed check and what it refuses") {
  Fixture f;
  Listener held;
  f.model().serve.port = held.port;
  f.model().serve.command = {"no-such-inference-server"};
  deploy::Deployment record;
  record.model = "new";
  const deploy::Run run{.record = record, .model = f.model()};
  auto r = test::run(f.ioc, deploy::preflight_of_run(f.services, run, "not stopping old"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK_THAT(r.error().message, Catch::StartsWith("pre-flight failed: command: models.new.serve.command[0]") &&
                                    Catch::Contains("; port: models.new.serve.port") &&
                                    Catch::EndsWith("; not stopping old"));
}

TEST_CASE("systemd's own exit statuses are told in words with the program, the folder or the user") {
  CHECK(units::systemd_exit_status(203)->name == "EXEC");
  CHECK(units::systemd_exit_status(217)->name == "USER");
  CHECK_FALSE(units::systemd_exit_status(1));
  CHECK_FALSE(units::systemd_exit_status(234));  // unused by systemd 252
  config::ModelConfig m;
  m.name = "m";
  m.source_file = "/etc/modeld/modeld.toml";
  deploy::StartedSettings started;
  started.command = {"vllm", "serve"};
  started.working_directory = "/var/lib/modeld/models/m";
  units::UnitStatus st;
  st.result = "exit-code";
  st.exec_main_status = 203;
  CHECK(deploy::explain_exit(m, started, st, "systemd") ==
        "systemd's EXIT_EXEC, the execve(2) of the command failed: most likely a missing or non-accessible "
        "executable file: vllm looked up in /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
        "(models.m.serve.command[0] of /etc/modeld/modeld.toml)");
  st.exec_main_status = 200;
  CHECK_THAT(deploy::explain_exit(m, started, st, "systemd"),
             Catch::StartsWith("systemd's EXIT_CHDIR") && Catch::EndsWith(": /var/lib/modeld/models/m"));
  st.exec_main_status = 217;
  CHECK_THAT(deploy::explain_exit(m, started, st, "systemd"),
             Catch::Contains("User=/Group= of modeld-serve@m.service"));
  st.exec_main_status = 1;
  CHECK(deploy::explain_exit(m, started, st, "systemd").empty());
  st.exec_main_status = 203;
  st.result = "signal";  // a signal number is no exit status of systemd's
  CHECK(deploy::explain_exit(m, started, st, "systemd").empty());
}
