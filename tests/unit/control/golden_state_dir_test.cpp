// Golden test of a state_dir written by the code of issue 26's starting commit (cf58f5f):
// tests/fixtures/golden/state_dir (state.json, state.json.prev and five deployment records) is
// loaded by a real StateStore and Deployer, and the routes' answers for status, deployments,
// each deployment and /metrics are compared byte for byte with tests/fixtures/golden/state_dir_api/.
// The fixture was written once, at that commit, by the last case below with
// MODELD_WRITE_STATE_FIXTURE=1; never regenerate it (README.md): it stands for the files a daemon
// of that commit leaves behind.

#include "control/routes.hpp"
#include "deploy/deployer.hpp"
#include "deploy/record_file.hpp"
#include "deploy/state_store.hpp"
#include "hub/hub.hpp"
#include "http/client.hpp"
#include "store/store.hpp"
#include "unit/control/golden_records.hpp"
#include "unit/deploy/fake_units.hpp"
#include "unit/golden.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

using namespace modeld;
namespace fs = std::filesystem;
namespace g = control::golden;

namespace {

const fs::path kFixture = test::golden_dir() / "state_dir";

// The records the fixture holds: every kind (deploy, pull, stop) and end (succeeded, failed,
// rolled_back), with a switch report, warm figures and errors.
std::vector<deploy::Deployment> fixture_records() {
  return {g::alpha_succeeded(), g::beta_pulled(), g::gamma_failed(), g::alpha_rolled_back(), g::gamma_stopped()};
}

// state.json of the fixture: beta then alpha in service, beta's B1 pulled ahead.
deploy::DaemonState fixture_state() {
  deploy::DaemonState st;
  st.active.put(deploy::ActiveRecord{"beta", g::kB0, "2026-02-25T12:00:00Z", g::started("beta", 8001, 4)});
  st.active.put(deploy::ActiveRecord{"alpha", g::kA1, "2026-03-01T10:07:10Z", g::started("alpha", 8000, 0)});
  st.last_active = {{"alpha", "2026-03-01T15:00:00Z"}, {"beta", "2026-03-01T15:00:00Z"},
                    {"gamma", "2026-03-01T14:00:06Z"}};
  st.pulled = {{"beta", {g::kB1}}};
  return st;
}

// The configuration the fixture is served with: alpha, beta and gamma, each on its own port and GPUs.
std::shared_ptr<config::Config> fixture_config(const fs::path& dir) {
  auto c = std::make_shared<config::Config>();
  c->daemon.models_dir = dir / "models";
  c->daemon.state_dir = dir / "state";
  unsigned first_gpu = 0;
  std::uint16_t port = 8000;
  for (const char* name : {"alpha", "beta", "gamma"}) {
    config::ModelConfig m;
    m.name = name;
    m.repo = std::string("org/") + name;
    m.serve.port = port++;
    m.serve.served_name = name;
    m.serve.command = {"/usr/bin/vllm", "serve"};
    m.serve.gpus = 4;
    m.serve.gpu_ids = std::vector<unsigned>{first_gpu, first_gpu + 1, first_gpu + 2, first_gpu + 3};
    first_gpu += 4;
    c->models[name] = m;
  }
  return c;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every file under `dir` by relative path, with its bytes.
std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_text(e.path());
  return out;
}

// A Deployer as the daemon builds it, on a copy of the fixture, after load() (no recover():
// nothing is started or watched, so no answer depends on a probe or a clock).
struct Served {
  fs::path dir = fs::temp_directory_path() / fmt::format("golden-state-dir-{}", ::getpid());
  std::shared_ptr<config::Config> cfg;
  boost::asio::io_context ioc;
  boost::asio::thread_pool pool{1};
  std::unique_ptr<store::Store> store;
  std::unique_ptr<deploy::StateStore> states;
  http::Client client{ioc.get_executor(), http::ClientOptions{}};
  hub::Hub hub{client, "http://127.0.0.1:9/"};
  test::FakeUnits units;
  std::unique_ptr<deploy::Deployer> deployer;

  Served() {
    fs::remove_all(dir);
    fs::create_directories(dir / "models");
    fs::copy(kFixture, dir / "state", fs::copy_options::recursive);
    cfg = fixture_config(dir);
    store = std::make_unique<store::Store>(cfg->daemon.models_dir);
    states = std::make_unique<deploy::StateStore>(cfg->daemon.state_dir);
    units.states["modeld-serve@alpha.service"] = "active";
    units.states["modeld-serve@beta.service"] = "active";
    deploy::Services services{cfg, *store, hub, client, client, units, pool};
    deployer = std::make_unique<deploy::Deployer>(ioc, services, *states);
    REQUIRE(deployer->load().has_value());
  }
  ~Served() {
    deployer.reset();
    pool.join();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  control::Response get(const std::string& target) {
    control::Access access;
    access.is_member = [](const control::Peer&, const std::string&) { return false; };
    return control::handle(control::Request{"GET", target, ""}, control::Peer{1000, 1000, 1}, *deployer, access);
  }
};

// The daemon's uptime is the one value of these answers no input fixes (the Deployer measures it
// from its construction on the steady clock): masked as 0.
std::string mask_uptime(const std::string& body) {
  static const std::regex uptime(R"("uptime_s":[-+0-9.eE]+)");
  return std::regex_replace(body, uptime, R"("uptime_s":0)");
}

}  // namespace

TEST_CASE("golden: a state_dir written at cf58f5f loads and is served byte for byte", "[golden]") {
  Served s;
  auto status = s.get("/v1/status");
  CHECK(status.status == 200);
  CHECK(status.body.find("\"uptime_s\":") != std::string::npos);
  test::check_golden("state_dir_api/status.json", mask_uptime(status.body) + "\n");
  auto list = s.get("/v1/deployments");
  CHECK(list.status == 200);
  test::check_golden("state_dir_api/deployments.json", list.body + "\n");
  for (const auto& d : fixture_records()) {
    auto one = s.get("/v1/deployments/" + d.id);
    CHECK(one.status == 200);
    test::check_golden("state_dir_api/deployment_" + d.id + ".json", one.body + "\n");
  }
  test::check_golden("state_dir_api/metrics.txt", s.get("/metrics").body);
  // Loading wrote nothing: the copy is still the fixture, file for file.
  CHECK(files_under(s.dir / "state") == files_under(kFixture));
}

TEST_CASE("golden: the state_dir fixture holds what it should", "[golden]") {
  const auto files = files_under(kFixture);
  std::vector<std::string> names;
  for (const auto& [name, _] : files) names.push_back(name);
  std::vector<std::string> expected{"state.json", "state.json.prev"};
  for (const auto& d : fixture_records()) expected.push_back("deployments/" + d.id + ".json");
  std::sort(expected.begin(), expected.end());
  CHECK(names == expected);
  CHECK(files.at("state.json") == files.at("state.json.prev"));
}

// Loads the fixture as the next daemon would and finds the fixed records it was written from,
// internal fields too (previous, switch marks, started_ns, flags), which the API does not show.
// MODELD_WRITE_STATE_FIXTURE=1 first writes it with this commit's StateStore: done once, at
// cf58f5f (README.md); never again, since it stands for what that commit left on disk.
TEST_CASE("golden: the state_dir fixture loads as the fixed records it was written from", "[golden]") {
  if (const char* v = std::getenv("MODELD_WRITE_STATE_FIXTURE"); v && std::string(v) == "1") {
    fs::remove_all(kFixture);
    deploy::StateStore out(kFixture);
    REQUIRE(out.init().has_value());
    REQUIRE(out.save(fixture_state()).has_value());
    for (const auto& d : fixture_records()) REQUIRE(out.save_deployment(d).has_value());
    WARN("wrote " << kFixture.string());
  }
  deploy::StateStore states(kFixture);
  auto st = states.load();
  REQUIRE(st.has_value());
  const auto want = fixture_state();
  REQUIRE(st->active.services.size() == want.active.services.size());
  for (std::size_t i = 0; i < want.active.services.size(); ++i)
    CHECK(deploy::to_json(st->active.services[i]) == deploy::to_json(want.active.services[i]));
  CHECK(st->last_active == want.last_active);
  CHECK(st->pulled == want.pulled);
  auto records = fixture_records();
  for (const auto& d : records) {
    auto loaded = deploy::read_deployment_file(kFixture / "deployments" / (d.id + ".json"));
    REQUIRE(loaded.has_value());
    CHECK(deploy::record_file_json(*loaded) == deploy::record_file_json(d));
  }
  const auto history = states.load_history(10);
  REQUIRE(history.size() == records.size());
  for (std::size_t i = 0; i < history.size(); ++i)  // newest first
    CHECK(history[i].id == records[records.size() - 1 - i].id);
}
