// The deployment state machine where it lives: a real Deployer with its real phases, a real
// store and state store on a temporary folder, a Hub served by a TestServer, FakeUnits for
// systemd, readiness through Services::wait_ready and no GPU (MODELD_NVML_LIBRARY names a
// library the loader cannot find, which is a host without the NVIDIA driver).
//
// These are the tests of the real exclusion rules (the 409s of the API): deployer.cpp's start(),
// stop(), refuse_new_record() and disk_conflict(). tests/unit/control only checks how the routes
// map those errors.

#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/switch_strategy.hpp"
#include "deploy/free_disk.hpp"
#include "deploy/launch.hpp"
#include "deploy/warm.hpp"

#include "deploy/state_store.hpp"
#include "util/cancel_tree.hpp"
#include "http/client.hpp"
#include "hub/hub.hpp"
#include "store/store.hpp"
#include "store/store_detail.hpp"
#include "units/service_manager.hpp"
#include "util/json.hpp"
#include "util/quantities.hpp"
#include "verify/hash.hpp"

#include "unit/deploy/fake_units.hpp"
#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace fs = std::filesystem;
using deploy::Phase;
using deploy::State;
using modeld::test::Exchange;
using modeld::test::HeaderList;
using modeld::test::TestServer;

namespace {

// Read by gpu::Nvml when the deploy phases first look at the GPUs: no GPU, whatever the host has.
const bool kNoGpu = (::setenv("MODELD_NVML_LIBRARY", "libmodeld-unit-test-no-nvml.so.1", 1), true);

const std::string kOld(40, 'a');    // the commit of "old", which serves when a test starts
const std::string kNew(40, 'b');    // the commit "main" of acme/new resolves to
const std::string kSpare(40, 'c');  // the commit of "spare", on disk, never active
const std::string kOldUnit = "modeld-serve@old.service";
const std::string kNewUnit = "modeld-serve@new.service";
const std::string kConfigJson = R"({"architectures": ["TestForCausalLM"]})";
const std::string kRecordId = "20260101T000000Z-new";

const std::vector<Phase> kOrder{Phase::planning,     Phase::freeing_disk, Phase::downloading,     Phase::verifying,
                                Phase::warming,      Phase::stopping_old, Phase::launching,       Phase::health_checking,
                                Phase::benchmarking};
const std::vector<Phase> kDowntimeOrder{Phase::planning,  Phase::stopping_old, Phase::freeing_disk,
                                        Phase::downloading, Phase::verifying, Phase::warming, Phase::launching,
                                        Phase::health_checking, Phase::benchmarking};
const std::vector<Phase> kFromStoppingOld{Phase::stopping_old, Phase::launching, Phase::health_checking,
                                          Phase::benchmarking};

std::string git_sha1(const std::string& content) {
  verify::Hasher h(verify::HashKind::git_sha1, content.size());
  h.update(std::span<const char>(content.data(), content.size()));
  return h.hex();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string listing(const std::string& repo = "acme/new", const std::string& commit = kNew) {
  return fmt::format(R"({{"id": "{}", "sha": "{}", "siblings": [
      {{"rfilename": "config.json", "size": {}, "blobId": "{}"}}]}})",
                     repo, commit, kConfigJson.size(), git_sha1(kConfigJson));
}

std::shared_ptr<config::Config> three_models(const fs::path& dir) {
  auto c = std::make_shared<config::Config>();
  c->daemon.models_dir = dir / "models";
  c->daemon.state_dir = dir / "state";
  c->daemon.disk_reserve = 0;
  c->hub.parallel_files = 2;
  std::uint16_t port = 1;  // privileged ports nothing listens on: stopping_old finds them free
  for (const char* name : {"old", "new", "spare"}) {
    config::ModelConfig m;
    m.name = name;
    m.repo = std::string("acme/") + name;
    m.serve.port = port++;
    m.serve.served_name = name;
    m.serve.stop_timeout = 1s;
    m.serve.command = {"true"};  // a program systemd finds (/usr/bin/true): the pre-flight passes
    c->models[name] = m;
  }
  return c;
}

fs::path fresh_dir() {
  static int n = 0;
  auto d = fs::temp_directory_path() / fmt::format("deployer-test-{}-{}", ::getpid(), ++n);
  fs::remove_all(d);
  fs::create_directories(d / "models");
  return d;
}

http::ClientOptions client_options() {
  http::ClientOptions o;
  o.connect_timeout = 5s;
  o.read_timeout = 5s;
  return o;
}

// Keeps the one thread of a disk pool busy until released (or destroyed), so that a verify or
// an rm is held on its way to the pool.
struct PoolBlock {
  std::promise<void> gate;
  bool released = false;
  explicit PoolBlock(asio::thread_pool& pool) {
    asio::post(pool, [f = gate.get_future().share()] { f.wait(); });
  }
  void release() {
    if (!released) gate.set_value();
    released = true;
  }
  ~PoolBlock() { release(); }
};

struct Fixture {
  fs::path dir = fresh_dir();
  std::shared_ptr<config::Config> cfg = three_models(dir);
  asio::io_context ioc;
  asio::thread_pool pool{1};
  store::Store store{cfg->daemon.models_dir};
  deploy::StateStore states{cfg->daemon.state_dir};
  test::Gate listing_gate, file_gate, ready_gate;  // hold planning, downloading, health_checking of "new"
  TestServer hub_server{ioc, [this](Exchange& ex) { return answer(ex); }};
  http::Client client{ioc.get_executor(), client_options()};
  hub::Hub hub{client, hub_server.url("")};
  test::FakeUnits units;
  std::map<std::string, Error> not_ready;  // model -> what readiness answers instead of ready
  std::map<std::string, int> ready_waits;  // model -> readiness waits
  std::vector<std::string> hub_targets;    // every request the Hub got, in order
  std::vector<nlohmann::json> phase_events, state_events;
  std::vector<std::pair<std::string, std::string>> texts;  ///< every SSE event: its name and data text
  std::vector<deploy::Event> watcher_events;
  std::function<void(const nlohmann::json&)> on_phase;  // called at every "phase" event
  std::unique_ptr<deploy::Deployer> deployer;
  std::vector<const deploy::SwitchStrategy*> switches;  // the switch strategies (empty: the built-in ones)

  // "old" verified, linked, active and running; "spare" verified on disk; nothing of "new".
  Fixture() {
    (void)kNoGpu;
    REQUIRE(states.init().has_value());
    put_verified("old", kOld, true);
    put_verified("spare", kSpare, false);
    units.active_state = "inactive";
    units.states[kOldUnit] = "active";
    record_active("old", kOld);
    hub::RetryPolicy fast;
    fast.backoff_base = 1ms;
    hub.set_retry_policy(fast);
  }

  ~Fixture() {
    for (auto* g : {&listing_gate, &file_gate, &ready_gate}) g->release();
    for (auto& [_, g] : units.gates) g.release();
    if (deployer) {
      bool done = false;
      deployer->shutdown([&] { done = true; });
      run_until([&] { return done; });
    }
    deployer.reset();
    pool.join();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // Runs the loop until `done` holds, at most `limit` (a generous bound, not a timing).
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
    ioc.restart();
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < end) ioc.run_one_for(10ms);
    return done();
  }

  template <class T>
  T run(asio::awaitable<T> task) {
    return test::run(ioc, std::move(task));
  }

  // Revision `commit` of `name` holding config.json with its manifest, linked if `link`.
  void put_verified(const std::string& name, const std::string& commit, bool link) {
    put_files(name, commit);
    const auto file = store.revision_dir(name, commit) / "config.json";
    store::Manifest m;
    m.repo = "acme/" + name;
    m.revision = "main";
    m.commit = commit;
    auto id = store::identity_of(file);
    REQUIRE(id.has_value());
    m.files.push_back(store::ManifestFile{"config.json", kConfigJson.size(), "", git_sha1(kConfigJson), *id});
    REQUIRE(store.write_manifest(name, m).has_value());
    if (link) REQUIRE(store.switch_link(name, commit).has_value());
  }

  // Revision `commit` of `name` holding config.json, not verified.
  void put_files(const std::string& name, const std::string& commit) {
    REQUIRE(store.prepare_revision(name, commit).has_value());
    write_file(store.revision_dir(name, commit) / "config.json", kConfigJson);
  }

  void record_active(const std::string& name, const std::string& commit,
                     const std::optional<deploy::StartedSettings>& started = {}) {
    deploy::DaemonState st;
    st.active.put(deploy::ActiveRecord{name, commit, "2026-01-01T00:00:00Z", started});
    st.last_active[name] = "2026-01-01T00:00:00Z";
    REQUIRE(states.save(st).has_value());
  }

  asio::awaitable<void> answer(Exchange& ex) {
    const std::string target(ex.request.target());
    hub_targets.push_back(target);
    const std::string file_prefix = "/acme/new/resolve/" + kNew + "/";
    if (target.starts_with("/api/models/acme/new/revision/")) {
      co_await listing_gate.pass();
      co_await ex.respond(200, listing());
    } else if (target.starts_with("/api/models/acme/old/revision/")) {
      co_await ex.respond(200, listing("acme/old", kOld));
    } else if (target == file_prefix + "config.json") {
      co_await file_gate.pass();
      co_await ex.respond(200, kConfigJson);
    } else {
      HeaderList h{{"X-Error-Code", "EntryNotFound"}};
      co_await ex.respond(404, "Entry not found", std::move(h));
    }
  }

  // Readiness of a model: its unit must be active; "new" waits at ready_gate; not_ready answers.
  asio::awaitable<Result<void>> ready(std::string model) {
    ++ready_waits[model];
    if (model == "new" && !co_await ready_gate.pass()) co_return make_error(Errc::cancelled, "readiness: cancelled");
    if (units.state_of(units::serve_unit(model)) != "active")
      co_return make_error(Errc::health_failed, units::serve_unit(model) + " is not active");
    if (auto f = not_ready.find(model); f != not_ready.end()) co_return f->second;
    co_return Result<void>{};
  }

  deploy::ModelWatcher::Options watchdog_options() {
    deploy::ModelWatcher::Options o;
    o.probe = [](const config::ModelConfig&) -> asio::awaitable<Result<void>> { co_return Result<void>{}; };
    return o;
  }

  // Constructs the Deployer as the daemon does and loads the state; recover() is up to the test.
  void load() {
    deploy::Services services{cfg, store, hub, client, client, units, pool};
    services.wait_ready = [this](const config::ModelConfig& m, const sys::Fields&) { return ready(m.name); };
    services.switch_strategies = switches;
    deployer = std::make_unique<deploy::Deployer>(ioc, services, states, watchdog_options());
    deployer->subscribe([this](const deploy::Event& e) { on_event(e); });
    REQUIRE(deployer->load().has_value());
  }

  void on_event(const deploy::Event& e) {
    if (e.kind == deploy::EventKind::watcher) {  // not on the SSE stream
      watcher_events.push_back(e);
      return;
    }
    const std::string text = util::dump_json(deploy::to_json(e));
    texts.emplace_back(deploy::to_string(e.kind), text);
    auto j = nlohmann::json::parse(text);
    if (e.kind == deploy::EventKind::phase) {
      phase_events.push_back(j);
      if (on_phase) on_phase(j);
    }
    if (e.kind == deploy::EventKind::state) state_events.push_back(j);
  }

  // The settings a service of `name` started now would run with (today's configuration).
  deploy::StartedSettings started_now(const std::string& name) {
    return deploy::started_settings(cfg->models.at(name), store.model_path(name));
  }

  // load(), then recover() to its end, as the daemon starts.
  void boot() {
    load();
    bool recovered = false;
    asio::co_spawn(ioc, deployer->recover(), [&](std::exception_ptr) { recovered = true; });
    REQUIRE(run_until([&] { return recovered; }));
  }

  deploy::Deployment deploy(const std::string& model, bool allow_downtime = false, bool restart = false) {
    auto d = deployer->start({model, allow_downtime, restart});
    INFO((d ? std::string("started") : d.error().message));
    REQUIRE(d.has_value());
    return *d;
  }

  // Runs the loop until deployment `id` has ended, and returns it.
  deploy::Deployment wait_end(const std::string& id) {
    REQUIRE(run_until([&] {
      auto d = deployer->get(id);
      return d && d->ended();
    }));
    return *deployer->get(id);
  }

  std::vector<Phase> phases() const {
    std::vector<Phase> out;
    for (const auto& j : phase_events) out.push_back(*deploy::phase_from_string(j["phase"].get<std::string>()));
    return out;
  }

  // Position of `call` ("stop UNIT") in the recorded calls, or -1.
  long position(const std::string& call) const {
    auto it = std::find(units.unit_calls.begin(), units.unit_calls.end(), call);
    return it == units.unit_calls.end() ? -1 : it - units.unit_calls.begin();
  }

  // The record a daemon killed in phase `p` leaves in state_dir/deployments/ID.json, and the
  // disk, units and state.json as they were then.
  void leave_crashed_in(Phase p) {
    deploy::Deployment d;
    d.id = kRecordId;
    d.model = "new";
    d.started_at = "2026-01-01T00:00:00Z";
    d.previous = {deploy::ActiveRecord{"old", kOld, ""}};
    d.phase = p;
    d.state = State::running;
    if (p != Phase::planning) d.commit = kNew;
    const bool stopped = p >= Phase::stopping_old;
    d.old_stopped = stopped;
    if (p == Phase::verifying) put_files("new", kNew);
    if (stopped) put_verified("new", kNew, p >= Phase::launching);
    if (p >= Phase::launching) units.states[kOldUnit] = "inactive";
    if (p >= Phase::health_checking) units.states[kNewUnit] = "active";
    if (p == Phase::benchmarking) record_active("new", kNew);
    if (p == Phase::rolling_back) d.error = make_error(Errc::health_failed, "the new model never answered /health");
    REQUIRE(states.save_deployment(d).has_value());
  }
};

// What any deployment of "new" that succeeded leaves: "new" serves at kNew, "old" is stopped
// (by this daemon before "new" started, unless `old_was_stopped` already).
void check_new_serves(Fixture& fx, const deploy::Deployment& d, bool old_was_stopped = false) {
  INFO((d.error ? d.error->message : std::string("no error")));
  CHECK(d.state == State::succeeded);
  CHECK(d.phase == Phase::benchmarking);
  CHECK(d.commit == kNew);
  CHECK_FALSE(d.error);
  auto active = fx.deployer->active();
  REQUIRE(active);
  CHECK(active->model == "new");
  CHECK(active->commit == kNew);
  CHECK(fx.store.linked_commit("new") == kNew);
  CHECK(fx.store.manifest_still_matches("new", kNew));
  CHECK(fx.units.state_of(kNewUnit) == "active");
  CHECK(fx.units.state_of(kOldUnit) == "inactive");
  if (!old_was_stopped) {
    CHECK(fx.position("stop " + kOldUnit) >= 0);
    CHECK(fx.position("stop " + kOldUnit) < fx.position("start " + kNewUnit));
  }
  // What the next daemon start reads agrees.
  auto st = fx.states.load();
  REQUIRE(st);
  REQUIRE(st->active);
  CHECK(st->active.last()->model == "new");
  auto hist = fx.states.load_history(10);
  REQUIRE_FALSE(hist.empty());
  CHECK(hist.front().id == d.id);
  CHECK(hist.front().state == State::succeeded);
  REQUIRE(fx.state_events.size() == 1);
  CHECK(fx.state_events.front()["state"] == "succeeded");
}

// What a deployment of "new" that ended before stopping_old leaves: "old" serves as before.
void check_old_untouched(Fixture& fx) {
  CHECK(fx.position("stop " + kOldUnit) == -1);
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.store.linked_commit("old") == kOld);
  auto active = fx.deployer->active();
  REQUIRE(active);
  CHECK(active->model == "old");
}

// What a deployment of "new" that rolled back leaves: "old" serves again at kOld, "new" is stopped.
void check_old_restored(Fixture& fx, const deploy::Deployment& d) {
  CHECK(d.state == State::rolled_back);
  CHECK(d.phase == Phase::rolling_back);
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.units.state_of(kNewUnit) == "inactive");
  CHECK(fx.store.linked_commit("old") == kOld);
  CHECK(fx.ready_waits["old"] >= 1);
  auto active = fx.deployer->active();
  REQUIRE(active);
  CHECK(active->model == "old");
  CHECK(active->commit == kOld);
  REQUIRE_FALSE(fx.phase_events.empty());
  CHECK(fx.phase_events.back()["phase"] == "rolling_back");
}

std::string phase_list(const std::vector<Phase>& v) {
  std::string out;
  for (auto p : v) out += std::string(out.empty() ? "" : ", ") + std::string(deploy::to_string(p));
  return out;
}

}  // namespace

// ---- the 409 rules (deployer.cpp: start() and disk_conflict()) ----

TEST_CASE("a deploy while another deployment runs is refused as deployment_running naming it and its phase") {
  Fixture fx;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  for (const char* model : {"new", "old"}) {
    auto again = fx.deployer->start({model, false});
    REQUIRE_FALSE(again);
    CHECK(modeld::to_string(again.error().code) == std::string_view("deployment_running"));
    CHECK(again.error().message == fmt::format("deployment {} of new is running (phase downloading)", d.id));
  }
  fx.file_gate.release();
  check_new_serves(fx, fx.wait_end(d.id));
  CHECK(fx.deployer->history(10).size() == 1);
}

TEST_CASE("verify, and rm of the model deployed, during a deployment are refused as deployment_running") {
  Fixture fx;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  for (const char* model : {"old", "spare"}) {
    auto v = fx.run(fx.deployer->verify(model));
    REQUIRE_FALSE(v);
    CHECK(modeld::to_string(v.error().code) == std::string_view("deployment_running"));
    CHECK(v.error().message ==
          fmt::format("deployment {} of new is running (phase downloading); verify {} when it has ended", d.id, model));
  }
  auto rm = fx.run(fx.deployer->remove("new"));
  REQUIRE_FALSE(rm);
  CHECK(modeld::to_string(rm.error().code) == std::string_view("deployment_running"));
  CHECK(rm.error().message ==
        fmt::format("deployment {} of new is running (phase downloading); rm new when it has ended", d.id));
  fx.file_gate.release();
  check_new_serves(fx, fx.wait_end(d.id));
}

TEST_CASE("rm of a model that a running deployment neither deploys nor replaces goes ahead") {
  Fixture fx;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  auto rm = fx.run(fx.deployer->remove("spare"));
  INFO((rm ? std::string("removed") : rm.error().message));
  REQUIRE(rm);
  CHECK(rm->commits == std::vector<std::string>{kSpare});
  CHECK_FALSE(fs::exists(fx.store.revision_dir("spare", kSpare)));
  fx.file_gate.release();
  check_new_serves(fx, fx.wait_end(d.id));
}

TEST_CASE("rm of the model in service is refused as model_active and deletes nothing") {
  Fixture fx;
  fx.boot();
  auto rm = fx.run(fx.deployer->remove("old"));
  REQUIRE_FALSE(rm);
  CHECK(modeld::to_string(rm.error().code) == std::string_view("model_active"));
  CHECK(rm.error().message ==
        "model old is active (served by modeld-serve@old.service); deploy another model before removing it");
  CHECK(fx.store.linked_commit("old") == kOld);
  CHECK(fx.store.manifest_still_matches("old", kOld));
  SECTION("also while a deployment of another model runs") {
    fx.file_gate.armed = true;
    auto d = fx.deploy("new");
    REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
    rm = fx.run(fx.deployer->remove("old"));
    REQUIRE_FALSE(rm);
    CHECK(modeld::to_string(rm.error().code) == std::string_view("model_active"));
    CHECK(fx.store.manifest_still_matches("old", kOld));
    fx.file_gate.release();
    check_new_serves(fx, fx.wait_end(d.id));
  }
}

namespace {

// Starts `what` ("verify" or "rm") of `model` and runs the loop until it waits for the disk pool
// (which the caller keeps busy); `done` is set once it has ended, `ok` when it succeeded.
void start_on_blocked_pool(Fixture& fx, const std::string& what, const std::string& model, bool& done, bool& ok) {
  auto finished = [&](std::exception_ptr, auto r) {
    done = true;
    ok = r.has_value();
  };
  if (what == "verify")
    asio::co_spawn(fx.ioc, fx.deployer->verify(model), finished);
  else
    asio::co_spawn(fx.ioc, fx.deployer->remove(model), finished);
  fx.ioc.restart();
  fx.ioc.poll();  // nothing before the job on the pool waits for anything else
  REQUIRE_FALSE(done);
}

}  // namespace

TEST_CASE("a deploy, a stop, a verify or an rm during a verify or an rm of a model is refused as deployment_running") {
  Fixture fx;
  fx.boot();
  PoolBlock block(fx.pool);
  const std::string what = GENERATE(std::string("verify"), std::string("rm"));
  const std::string model = what == "verify" ? "old" : "spare";
  bool done = false, ok = false;
  start_on_blocked_pool(fx, what, model, done, ok);
  const std::string busy = fmt::format("a {} of model {} is in progress", what, model);
  auto d = fx.deployer->start({"new", false});
  REQUIRE_FALSE(d);
  CHECK(modeld::to_string(d.error().code) == std::string_view("deployment_running"));
  CHECK(d.error().message == busy + "; deploy when it has ended");
  auto v = fx.run(fx.deployer->verify(model));
  REQUIRE_FALSE(v);
  CHECK(v.error().code == Errc::deployment_running);
  CHECK(v.error().message == busy);
  auto rm = fx.run(fx.deployer->remove(model));
  REQUIRE_FALSE(rm);
  CHECK(rm.error().code == Errc::deployment_running);
  CHECK(rm.error().message == busy);
  auto stop = fx.deployer->stop("old");
  REQUIRE_FALSE(stop);
  CHECK(stop.error().code == Errc::deployment_running);
  CHECK_THAT(stop.error().message, Catch::StartsWith(busy));
  CHECK(fx.deployer->history(10).empty());
  block.release();
  REQUIRE(fx.run_until([&] { return done; }));
  CHECK(ok);
  check_new_serves(fx, fx.wait_end(fx.deploy("new").id));
  // Once it has ended, a stop goes ahead too.
  auto after = fx.deployer->stop("new");
  REQUIRE(after);
  CHECK(fx.wait_end(after->id).state == State::succeeded);
}

TEST_CASE("after a restart a deploy is refused until the interrupted deployment continues") {
  Fixture fx;
  fx.leave_crashed_in(Phase::downloading);
  fx.load();
  for (const char* model : {"new", "old"}) {
    auto d = fx.deployer->start({model, false});
    REQUIRE_FALSE(d);
    CHECK(modeld::to_string(d.error().code) == std::string_view("deployment_running"));
    CHECK(d.error().message ==
          fmt::format("deployment {} of new, interrupted by modeld's restart, is about to continue", kRecordId));
  }
  bool recovered = false;
  asio::co_spawn(fx.ioc, fx.deployer->recover(), [&](std::exception_ptr) { recovered = true; });
  REQUIRE(fx.run_until([&] { return recovered; }));
  auto again = fx.deployer->start({"old", false});
  REQUIRE_FALSE(again);
  CHECK_THAT(again.error().message, Catch::StartsWith(fmt::format("deployment {} of new is running (phase ", kRecordId)));
  check_new_serves(fx, fx.wait_end(kRecordId));
}

// ---- the order of the phases, from the events the Deployer emits ----

TEST_CASE("without allow_downtime the phases run in order, stopping the old model after verifying") {
  Fixture fx;
  fx.boot();
  auto d = fx.deploy("new");
  CHECK(d.phase == Phase::planning);
  REQUIRE(d.previous.size() == 1);
  CHECK(d.previous.front().model == "old");
  auto end = fx.wait_end(d.id);
  CHECK(phase_list(fx.phases()) == phase_list(kOrder));
  CHECK_FALSE(end.downtime_first);
  check_new_serves(fx, end);
  CHECK(fx.store.linked_commit("old") == kOld);  // kept for a later rollback or redeploy
}

TEST_CASE("the event stream's names and data text of a deployment stay as they were") {
  // The SSE stream's bytes for phase, progress and state (interface.md "Events"), pinned.
  Fixture fx;
  fx.boot();
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  REQUIRE(end.state == State::succeeded);
  REQUIRE_FALSE(fx.texts.empty());
  CHECK(fx.texts.front() ==
        std::pair<std::string, std::string>{"phase", fmt::format(R"({{"id":"{}","model":"new","phase":"planning"}})", d.id)});
  CHECK(fx.texts.back() ==
        std::pair<std::string, std::string>{
            "state", fmt::format(R"({{"error":null,"id":"{}","model":"new","phase":"benchmarking","state":"succeeded"}})",
                                 d.id)});
  std::size_t download = 0, warming = 0;
  for (const auto& [kind, text] : fx.texts) {
    if (kind != "progress") continue;
    const auto j = nlohmann::json::parse(text);
    if (j.contains("warm")) {  // warming's progress: the download's figures, plus its phase and its own
      ++warming;
      CHECK(text == fmt::format(R"({{"id":"{}","model":"new","phase":"warming","progress":{},"warm":{}}})", d.id,
                                j["progress"].dump(), j["warm"].dump()));
      CHECK(j["warm"].size() == 4);
      CHECK(j["warm"]["bytes_total"] == kConfigJson.size());  // the revision's one file
      continue;
    }
    ++download;
    CHECK(text == fmt::format(R"({{"id":"{}","model":"new","progress":{}}})", d.id, j["progress"].dump()));
    CHECK(j["progress"].size() == 7);
    CHECK(j["progress"].contains("files"));
  }
  CHECK(download > 0);
  CHECK(warming > 0);  // warming reports its figures at least once (before its first read)
}

namespace {

// A datagram socket in `dir` standing in for the service manager's $NOTIFY_SOCKET while it lives.
class NotifySocket {
 public:
  explicit NotifySocket(const fs::path& dir) : path_(dir / "notify") {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path_.string().size() < sizeof addr.sun_path);
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd_);
  }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  // The datagrams received so far (sd_notify sends before it returns).
  std::vector<std::string> received() {
    std::vector<std::string> out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT)) >= 0;) out.emplace_back(buf, static_cast<std::size_t>(n));
    return out;
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE("with nothing to download warming's first figures go out as STATUS= at once") {
  // The download's progress would have sent STATUS= less than a second before; without one, the
  // first figures of warming are announced as they come, before warming's next report (its last).
  Fixture fx;
  fx.put_verified("new", kNew, false);
  fx.boot();
  NotifySocket notify(fx.dir);
  std::optional<deploy::WarmReport> first;
  std::vector<std::string> while_warming;  // what $NOTIFY_SOCKET got by each of warming's reports
  fx.deployer->subscribe([&](const deploy::Event& e) {
    if (e.kind != deploy::EventKind::progress || !e.warm) return;
    if (!first) first = e.warm;
    for (auto& d : notify.received()) while_warming.push_back(std::move(d));
  });
  check_new_serves(fx, fx.wait_end(fx.deploy("new").id));
  REQUIRE(first);
  REQUIRE(first->bytes_total == kConfigJson.size());
  const auto in_memory = (first->bytes_resident_before + first->bytes_warmed) * 100 / first->bytes_total;
  CHECK_THAT(while_warming, Catch::VectorContains(fmt::format("STATUS=warming the page cache for new: {}% of {} in memory",
                                                              in_memory, util::format_bytes(kConfigJson.size()))));
}

TEST_CASE("while warming the STATUS= line names the model and how much of its files is in memory") {
  // status_line() is the text announce_status() sends as STATUS=; read here at each of warming's
  // progress events, right after the record took the figures.
  Fixture fx;
  fx.boot();
  std::vector<std::pair<deploy::WarmReport, std::string>> seen;
  fx.deployer->subscribe([&](const deploy::Event& e) {
    if (e.kind == deploy::EventKind::progress && e.warm) seen.emplace_back(*e.warm, fx.deployer->status_line());
  });
  auto end = fx.wait_end(fx.deploy("new").id);
  check_new_serves(fx, end);
  REQUIRE_FALSE(seen.empty());
  for (const auto& [w, line] : seen) {
    REQUIRE(w.bytes_total == kConfigJson.size());
    const auto in_memory = std::min<std::uint64_t>(100, (w.bytes_resident_before + w.bytes_warmed) * 100 / w.bytes_total);
    CHECK(line == fmt::format("warming the page cache for new: {}% of {} in memory", in_memory,
                              util::format_bytes(kConfigJson.size())));
  }
  REQUIRE(end.warm);
  CHECK(end.warm->bytes_total == seen.back().first.bytes_total);
  CHECK(end.warm->bytes_resident_before + end.warm->bytes_warmed ==
        seen.back().first.bytes_resident_before + seen.back().first.bytes_warmed);
}

TEST_CASE("a cancelled deployment's state event carries the error object") {
  Fixture fx;
  fx.boot();
  std::optional<Result<deploy::Deployment>> cancelled;
  fx.on_phase = [&](const nlohmann::json& j) {
    if (!cancelled) cancelled = fx.deployer->cancel(j["id"].get<std::string>());
  };
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  REQUIRE(end.state == State::cancelled);
  REQUIRE(end.error);
  CHECK(fx.texts.back() == std::pair<std::string, std::string>{
                               "state", fmt::format(R"({{"error":{},"id":"{}","model":"new","phase":"{}","state":"cancelled"}})",
                                                    deploy::to_json(*end.error).dump(), d.id,
                                                    deploy::to_string(end.phase))});
}

TEST_CASE("models says verified, partial for a revision never verified and corrupt for files changed since") {
  Fixture fx;
  fx.boot();
  fx.put_files("new", kNew);
  auto state_of = [&](const std::string& name) {
    for (const auto& m : fx.run(fx.deployer->models()))
      if (m.name == name) return m.state;
    return std::string("not listed");
  };
  CHECK(state_of("old") == "verified");
  CHECK(state_of("spare") == "verified");
  CHECK(state_of("new") == "partial");

  write_file(fx.store.revision_dir("spare", kSpare) / "config.json", "{}");
  CHECK(state_of("spare") == "corrupt");
  {
    // While modeld links or unlinks files of its own, the list is the last walk's.
    store::detail::Relinking relinking(fx.store, {});
    fs::remove(fx.store.revision_dir("old", kOld) / "config.json");
    CHECK(state_of("old") == "verified");
  }
  CHECK(state_of("old") == "corrupt");
  CHECK(state_of("new") == "partial");
}

TEST_CASE("the model watcher's record changes reach listeners as watcher events") {
  Fixture fx;
  fx.boot();
  REQUIRE(fx.run_until([&] { return !fx.watcher_events.empty(); }));
  const auto& e = fx.watcher_events.back();
  CHECK(e.model == "old");
  CHECK(e.id.empty());
  REQUIRE(e.watcher);
  CHECK(e.watcher->model == "old");
  CHECK(deploy::to_json(e)["watchdog"]["model"] == "old");
}

TEST_CASE("with allow_downtime and room for both models the order is the same and nothing is evicted") {
  Fixture fx;
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new", true).id);
  CHECK(phase_list(fx.phases()) == phase_list(kOrder));
  CHECK_FALSE(end.downtime_first);
  check_new_serves(fx, end);
  CHECK(fx.store.linked_commit("old") == kOld);
}

TEST_CASE("with allow_downtime and room only without the active model, stopping_old comes right after planning") {
  Fixture fx;
  // "old" holds 1 GiB of real blocks, and disk_reserve leaves room for the download only once
  // it is gone: any change of the free space smaller than 512 MiB during the test keeps that so.
  constexpr std::uint64_t kBig = 1ull << 30;
  const auto big = fx.store.revision_dir("old", kOld) / "weights.bin";
  const int fd = ::open(big.c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  const int fa = ::posix_fallocate(fd, 0, static_cast<off_t>(kBig));
  ::close(fd);
  REQUIRE(fa == 0);
  fx.boot();
  auto free = store::free_bytes(fx.cfg->daemon.models_dir);
  REQUIRE(free);
  fx.cfg->daemon.disk_reserve = *free + kBig / 2;
  auto end = fx.wait_end(fx.deploy("new", true).id);
  CHECK(phase_list(fx.phases()) == phase_list(kDowntimeOrder));
  CHECK(end.downtime_first);
  check_new_serves(fx, end);
  CHECK_FALSE(fs::exists(fx.store.revision_dir("old", kOld)));  // evicted in freeing_disk
  CHECK(fx.position("stop " + kOldUnit) >= 0);
}

// ---- cancel ----

namespace {

struct CancelCase {
  Phase phase;
  State ends;
  bool old_serves;  // at the end: "old" as before (untouched or restored), else "new"
};

// Checks how a deployment of "new" cancelled in `c.phase` ended.
void check_cancelled(Fixture& fx, const deploy::Deployment& end, const CancelCase& c) {
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == c.ends);
  if (c.ends == State::succeeded) return check_new_serves(fx, end);
  REQUIRE(end.error);
  CHECK(end.error->code == Errc::cancelled);
  if (c.ends == State::rolled_back) {
    CHECK(end.error->message == "cancelled by the user; rolled back: old serves again");
    return check_old_restored(fx, end);
  }
  CHECK(end.error->message == "cancelled by the user");
  CHECK(end.phase == c.phase);
  const auto upto = std::find(kOrder.begin(), kOrder.end(), c.phase) + 1;
  CHECK(phase_list(fx.phases()) == phase_list(std::vector<Phase>(kOrder.begin(), upto)));
  if (c.old_serves) return check_old_untouched(fx);
  auto active = fx.deployer->active();
  REQUIRE(active);
  CHECK(active->model == "new");
  CHECK(fx.units.state_of(kNewUnit) == "active");
  CHECK(fx.units.state_of(kOldUnit) == "inactive");
}

}  // namespace

TEST_CASE("a cancel as a phase begins ends cancelled before stopping_old, rolled back in it and launching") {
  // A cancel that reaches the Deployer as a phase begins (from the phase event's listener) is
  // seen by drive() once that phase has ended, and ends the deployment as the contract says:
  // cancelled before stopping_old, rolled back from it through health_checking; in benchmarking
  // the new model serves and only the benchmark is skipped (succeeded).
  const auto c = GENERATE(CancelCase{Phase::planning, State::cancelled, true},
                          CancelCase{Phase::freeing_disk, State::cancelled, true},
                          CancelCase{Phase::downloading, State::cancelled, true},
                          CancelCase{Phase::verifying, State::cancelled, true},
                          CancelCase{Phase::warming, State::cancelled, true},
                          CancelCase{Phase::stopping_old, State::rolled_back, true},
                          CancelCase{Phase::launching, State::rolled_back, true},
                          CancelCase{Phase::health_checking, State::rolled_back, true},
                          CancelCase{Phase::benchmarking, State::succeeded, false});
  CAPTURE(deploy::to_string(c.phase));
  Fixture fx;
  fx.boot();
  std::optional<Result<deploy::Deployment>> cancelled;
  fx.on_phase = [&](const nlohmann::json& j) {
    if (j["phase"].get<std::string>() == deploy::to_string(c.phase) && !cancelled)
      cancelled = fx.deployer->cancel(j["id"].get<std::string>());
  };
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  REQUIRE(cancelled);
  REQUIRE(*cancelled);
  CHECK((*cancelled)->cancel_requested);
  check_cancelled(fx, end, c);
}

TEST_CASE("a cancel while a phase waits ends as a cancel in that phase does") {
  Fixture fx;
  fx.boot();
  const auto cancel_while_waiting = [&](test::Gate& gate, CancelCase c) {
    CAPTURE(deploy::to_string(c.phase));
    gate.armed = true;
    auto d = fx.deploy("new");
    REQUIRE(fx.run_until([&] { return gate.waiting == 1; }));
    CHECK(fx.deployer->get(d.id)->phase == c.phase);
    auto cancelled = fx.deployer->cancel(d.id);
    REQUIRE(cancelled);
    CHECK(cancelled->cancel_requested);
    check_cancelled(fx, fx.wait_end(d.id), c);
  };
  SECTION("planning, waiting for the Hub's listing") {
    cancel_while_waiting(fx.listing_gate, {Phase::planning, State::cancelled, true});
  }
  SECTION("downloading, waiting for a file") {
    cancel_while_waiting(fx.file_gate, {Phase::downloading, State::cancelled, true});
  }
  SECTION("stopping_old, waiting for StopUnit") {
    cancel_while_waiting(fx.units.gates["stop " + kOldUnit], {Phase::stopping_old, State::rolled_back, true});
  }
  SECTION("launching, waiting for StartUnit") {
    cancel_while_waiting(fx.units.gates["start " + kNewUnit], {Phase::launching, State::rolled_back, true});
  }
  SECTION("health_checking, waiting for readiness") {
    cancel_while_waiting(fx.ready_gate, {Phase::health_checking, State::rolled_back, true});
  }
}

TEST_CASE("rolling back cannot be cancelled and brings the old model back") {
  Fixture fx;
  fx.boot();
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  std::optional<Result<deploy::Deployment>> refused;
  fx.on_phase = [&](const nlohmann::json& j) {
    if (j["phase"] == "rolling_back") refused = fx.deployer->cancel(j["id"].get<std::string>());
  };
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  REQUIRE(refused);
  REQUIRE_FALSE(*refused);
  CHECK(modeld::to_string(refused->error().code) == std::string_view("deployment_ended"));
  CHECK(refused->error().message == fmt::format("deployment {} is rolling back and cannot be cancelled", d.id));
  REQUIRE(end.error);
  CHECK(end.error->code == Errc::health_failed);
  CHECK(end.error->message == "GET /health answered 503; rolled back: old serves again");
  CHECK_FALSE(end.cancel_requested);
  check_old_restored(fx, end);
  auto ended = fx.deployer->cancel(d.id);
  REQUIRE_FALSE(ended);
  CHECK(ended.error().code == Errc::deployment_ended);
  CHECK(ended.error().message == fmt::format("deployment {} already ended (rolled_back)", d.id));
}

// ---- resume after a restart ----

TEST_CASE("a deployment interrupted by a restart continues from its recorded phase and ends as an uninterrupted one") {
  struct ResumeCase {
    Phase recorded;
    std::vector<Phase> runs;
  };
  const auto c = GENERATE(ResumeCase{Phase::planning, kOrder}, ResumeCase{Phase::freeing_disk, kOrder},
                          ResumeCase{Phase::downloading, kOrder}, ResumeCase{Phase::verifying, kOrder},
                          ResumeCase{Phase::warming, kOrder},
                          ResumeCase{Phase::stopping_old, kFromStoppingOld},
                          ResumeCase{Phase::launching, kFromStoppingOld},
                          ResumeCase{Phase::health_checking, kFromStoppingOld},
                          ResumeCase{Phase::benchmarking, kFromStoppingOld});
  CAPTURE(deploy::to_string(c.recorded));
  Fixture fx;
  fx.leave_crashed_in(c.recorded);
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  CHECK(phase_list(fx.phases()) == phase_list(c.runs));
  check_new_serves(fx, end, c.recorded >= Phase::launching);
  CHECK(fx.deployer->history(10).size() == 1);
}

TEST_CASE("a deployment interrupted while rolling back finishes the rollback after a restart") {
  Fixture fx;
  fx.leave_crashed_in(Phase::rolling_back);
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  CHECK(phase_list(fx.phases()) == "rolling_back");
  REQUIRE(end.error);
  CHECK(end.error->code == Errc::health_failed);
  CHECK(end.error->message == "the new model never answered /health; rolled back: old serves again");
  check_old_restored(fx, end);
  CHECK(fx.position("stop " + kNewUnit) < fx.position("start " + kOldUnit));
}

// ---- the daemon's stop ----

TEST_CASE("an emit of the daemon's cancellation tree ends the watch and the deployment, left recorded running") {
  Fixture fx;
  fx.boot();
  REQUIRE(fx.deployer->watchdogs().front().state == "watching");
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  util::CancelTree tree;
  bool done = false;
  fx.deployer->shutdown_on(tree.child(), [&] { done = true; });
  tree.emit();
  REQUIRE(fx.run_until([&] { return done; }));
  CHECK(fx.deployer->watchdogs().front().state == "stopped");
  const auto records = fx.states.load_history(10);
  auto it = std::find_if(records.begin(), records.end(), [&](const deploy::Deployment& r) { return r.id == d.id; });
  REQUIRE(it != records.end());
  CHECK(it->state == State::running);
  CHECK(it->phase == Phase::downloading);
  CHECK_FALSE(fx.deployer->start({"old", false}));  // no new work once stopping
}

TEST_CASE("a deployment interrupted in its cleanup finishes the cleanup after a restart and succeeds") {
  const std::string older(40, 'd');  // a revision of "new" from before, for the cleanup to remove
  Fixture fx;
  fx.leave_crashed_in(Phase::health_checking);
  fx.put_verified("new", older, false);
  fx.record_active("new", kNew);  // the health check passed: "new" serves
  auto records = fx.states.load_history(1);
  REQUIRE(records.size() == 1);
  records.front().cleanup_begun = true;
  REQUIRE(fx.states.save_deployment(records.front()).has_value());
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  CHECK(phase_list(fx.phases()) == "benchmarking");
  check_new_serves(fx, end, true);
  CHECK(fx.ready_waits["new"] == 0);  // not checked again
  CHECK_FALSE(fs::exists(fx.store.revision_dir("new", older)));
  CHECK(fs::exists(fx.store.revision_dir("new", kNew)));
  CHECK(fx.deployer->history(10).size() == 1);
}

TEST_CASE("a deployment interrupted in its benchmark after the cleanup benchmarks again and never restarts the new model") {
  // Found by the kill sweep (test_kill_sweep_e2e): it went back to stopping_old, which stopped the
  // model that served and started it again.
  Fixture fx;
  fx.leave_crashed_in(Phase::benchmarking);
  auto records = fx.states.load_history(1);
  REQUIRE(records.size() == 1);
  records.front().cleanup_begun = true;  // the cleanup comes before the benchmark
  REQUIRE(fx.states.save_deployment(records.front()).has_value());
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  CHECK(phase_list(fx.phases()) == "benchmarking");
  check_new_serves(fx, end, true);
  CHECK(fx.ready_waits["new"] == 0);  // not checked again
  CHECK(std::count(fx.units.unit_calls.begin(), fx.units.unit_calls.end(), "start " + kNewUnit) == 0);
  CHECK(fs::exists(fx.store.revision_dir("new", kNew)));
  CHECK(fx.deployer->history(10).size() == 1);
}

// ---- warming ----

TEST_CASE("a deployment records what warming found and what was resident at launch") {
  Fixture fx;
  fx.boot();
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  check_new_serves(fx, end);
  REQUIRE(end.warm);
  CHECK(end.warm->bytes_total > 0);
  CHECK(end.warm->bytes_resident_before + end.warm->bytes_warmed <= end.warm->bytes_total);
  REQUIRE(end.warm->bytes_resident_at_launch);
  CHECK(*end.warm->bytes_resident_at_launch <= end.warm->bytes_total);
  auto hist = fx.states.load_history(1);
  REQUIRE_FALSE(hist.empty());
  REQUIRE(hist.front().warm);
  CHECK(hist.front().warm->bytes_total == end.warm->bytes_total);
  CHECK(hist.front().warm->bytes_resident_at_launch == end.warm->bytes_resident_at_launch);
}

TEST_CASE("with serve.warm off, warming reads nothing and launching still measures the page cache") {
  Fixture fx;
  fx.cfg->models["new"].serve.warm = "off";
  fx.boot();
  auto d = fx.deploy("new");
  auto end = fx.wait_end(d.id);
  check_new_serves(fx, end);
  REQUIRE(end.warm);
  CHECK(end.warm->bytes_total == 0);
  CHECK(end.warm->bytes_warmed == 0);
  CHECK(end.warm->bytes_resident_at_launch.has_value());
}

TEST_CASE("warming reads the index's shards first, sorted as loaders read them, then the rest") {
  const std::vector<std::string> paths{"tokenizer.json", "b-2.safetensors", "config.json", "b-1.safetensors",
                                       "extra.safetensors", "model.safetensors.index.json"};
  CHECK(deploy::warm_order(paths, {"b-1.safetensors", "b-2.safetensors"}) ==
        std::vector<std::string>{"b-1.safetensors", "b-2.safetensors", "config.json", "extra.safetensors",
                                 "model.safetensors.index.json", "tokenizer.json"});
  CHECK(deploy::warm_order(paths, {}) ==
        std::vector<std::string>{"b-1.safetensors", "b-2.safetensors", "extra.safetensors", "config.json",
                                 "model.safetensors.index.json", "tokenizer.json"});
  CHECK(deploy::default_warm_reserve(16ull << 30) == 8ull << 30);
  CHECK(deploy::default_warm_reserve(1000ull << 30) == 100ull << 30);
}

// ---- the switch's outage (DEPLOYMENT.switch) ----

namespace {

// The marks of a switch in the order they are to be taken.
std::vector<std::int64_t> in_order(const deploy::SwitchMarks& m) {
  return {m.stop_requested_ns, m.stop_done_ns, m.start_requested_ns, m.port_ns, m.ready_ns};
}

// The report's parts add up to its downtime, which spans `from` to ready (ns since the epoch).
void check_adds_up(const deploy::Deployment& d, std::int64_t from) {
  REQUIRE(d.switch_report);
  const auto& w = *d.switch_report;
  CHECK(w.downtime_s == Approx(w.stop_s + w.launch_s + w.start_to_port_s + w.port_to_ready_s).margin(1e-6));
  CHECK(w.downtime_s == Approx(static_cast<double>(d.switch_marks.ready_ns - from) / 1e9).margin(1e-6));
}

}  // namespace

TEST_CASE("a switch takes its marks in order, the stop request durably before StopUnit, and reports them") {
  Fixture fx;
  fx.units.gates["stop " + kOldUnit].armed = true;
  fx.boot();
  const auto before = deploy::wall_clock_ns();
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.units.gates["stop " + kOldUnit].waiting == 1; }));
  // What a daemon killed now would read back: the stop was asked for, the outage has begun.
  auto held = fx.states.load_history(10);
  REQUIRE_FALSE(held.empty());
  CHECK(held.front().old_stopped);
  CHECK(held.front().switch_marks.stop_requested_ns >= before);
  CHECK_FALSE(held.front().switch_report);
  fx.units.gates["stop " + kOldUnit].release();
  auto end = fx.wait_end(d.id);
  check_new_serves(fx, end);
  const auto marks = in_order(end.switch_marks);
  CHECK(marks.front() >= before);
  CHECK(std::is_sorted(marks.begin(), marks.end()));
  check_adds_up(end, end.switch_marks.stop_requested_ns);
  // Persisted with the record, and shown in the API.
  auto hist = fx.states.load_history(10);
  REQUIRE(hist.front().switch_report);
  CHECK(hist.front().switch_marks.ready_ns == end.switch_marks.ready_ns);
  CHECK(deploy::to_json(end)["switch"]["downtime_s"].get<double>() == end.switch_report->downtime_s);
  CHECK_FALSE(deploy::to_json(end).contains("switch_marks"));
}

TEST_CASE("with nothing serving the outage runs from the start of the new service") {
  Fixture fx;
  fx.units.states[kOldUnit] = "inactive";
  REQUIRE(fx.states.save(deploy::DaemonState{}).has_value());
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new").id);
  REQUIRE(end.state == State::succeeded);
  CHECK(end.switch_marks.stop_requested_ns == 0);
  CHECK(end.switch_marks.stop_done_ns == 0);
  check_adds_up(end, end.switch_marks.start_requested_ns);
  CHECK(end.switch_report->stop_s == 0);
  CHECK(end.switch_report->launch_s == 0);
}

TEST_CASE("after a restart mid-switch the persisted stop marks count, so the outage includes the restart") {
  const auto recorded = GENERATE(Phase::launching, Phase::health_checking);
  CAPTURE(deploy::to_string(recorded));
  Fixture fx;
  fx.leave_crashed_in(recorded);
  // The first daemon asked the old service to stop 100 s ago and saw it gone 95 s ago.
  auto crashed = fx.states.load_history(1).front();
  const auto now = deploy::wall_clock_ns();
  crashed.switch_marks.stop_requested_ns = now - 100'000'000'000;
  crashed.switch_marks.stop_done_ns = now - 95'000'000'000;
  crashed.switch_marks.start_requested_ns = now - 94'000'000'000;
  REQUIRE(fx.states.save_deployment(crashed).has_value());
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  check_new_serves(fx, end, true);
  CHECK(end.switch_marks.stop_requested_ns == crashed.switch_marks.stop_requested_ns);
  CHECK(end.switch_marks.stop_done_ns == crashed.switch_marks.stop_done_ns);
  check_adds_up(end, crashed.switch_marks.stop_requested_ns);
  CHECK(end.switch_report->downtime_s >= 100);
  CHECK(end.switch_report->stop_s == Approx(5).margin(1e-6));
}

TEST_CASE("a rolled back switch reports the outage until the old model serves again") {
  Fixture fx;
  fx.boot();
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  const auto before = deploy::wall_clock_ns();
  auto end = fx.wait_end(fx.deploy("new").id);
  check_old_restored(fx, end);
  const auto marks = in_order(end.switch_marks);
  CHECK(marks.front() >= before);
  CHECK(std::is_sorted(marks.begin(), marks.end()));
  check_adds_up(end, end.switch_marks.stop_requested_ns);
  CHECK(fx.states.load_history(1).front().switch_report);
}

TEST_CASE("a deployment that stopped nothing and started nothing has no switch") {
  Fixture fx;
  fx.boot();
  fx.on_phase = [&](const nlohmann::json& j) {
    if (j["phase"] == "verifying") (void)fx.deployer->cancel(j["id"].get<std::string>());
  };
  auto end = fx.wait_end(fx.deploy("new").id);
  CHECK(end.state == State::cancelled);
  CHECK_FALSE(end.switch_report);
  CHECK(in_order(end.switch_marks) == std::vector<std::int64_t>(5, 0));
  CHECK(deploy::to_json(end)["switch"].is_null());
}

TEST_CASE("a failed start that never became ready has no switch") {
  Fixture fx;
  fx.units.states[kOldUnit] = "inactive";
  REQUIRE(fx.states.save(deploy::DaemonState{}).has_value());
  fx.boot();
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  auto end = fx.wait_end(fx.deploy("new").id);
  CHECK(end.state == State::failed);
  CHECK(end.switch_marks.start_requested_ns != 0);
  CHECK_FALSE(end.switch_report);
}

// ---- never restarting what serves (redeploy.cpp, started.cpp) ----

namespace {

// "old" serves kOld, started with `started`; the daemon booted; the calls of the boot forgotten.
void serve_old_started_with(Fixture& fx, const deploy::StartedSettings& started) {
  fx.record_active("old", kOld, started);
  fx.boot();
  fx.units.unit_calls.clear();
}

// The daemon's state.json: what "old" runs with, as recorded.
std::optional<deploy::StartedSettings> recorded_started(Fixture& fx) {
  auto st = fx.states.load();
  REQUIRE(st);
  REQUIRE(st->active);
  return st->active.last()->started;
}

}  // namespace

TEST_CASE("a redeploy of the model that serves, at its commit, with the same settings, changes nothing") {
  Fixture fx;
  serve_old_started_with(fx, fx.started_now("old"));
  auto end = fx.wait_end(fx.deploy("old").id);
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == State::succeeded);
  CHECK_FALSE(end.changed);
  CHECK(end.commit == kOld);
  CHECK(fx.phases() == std::vector<Phase>{Phase::planning});
  CHECK(fx.units.unit_calls.empty());
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.store.linked_commit("old") == kOld);
  CHECK(recorded_started(fx) == fx.started_now("old"));
  auto hist = fx.states.load_history(1);
  REQUIRE(hist.size() == 1);
  CHECK_FALSE(hist.front().changed);
}

TEST_CASE("a change only in stop_timeout restarts nothing") {
  Fixture fx;
  fx.cfg->models["old"].serve.stop_timeout = 1s;
  const auto started = fx.started_now("old");
  fx.cfg->models["old"].serve.stop_timeout = 42s;
  serve_old_started_with(fx, started);
  auto end = fx.wait_end(fx.deploy("old").id);
  CHECK(end.state == State::succeeded);
  CHECK_FALSE(end.changed);
  CHECK(fx.units.unit_calls.empty());
}

TEST_CASE("a changed environment restarts the model that serves, and state.json records what it runs with now") {
  Fixture fx;
  const auto started = fx.started_now("old");
  fx.cfg->models["old"].serve.environment["VLLM_X"] = "1";
  serve_old_started_with(fx, started);
  auto end = fx.wait_end(fx.deploy("old").id);
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == State::succeeded);
  CHECK(end.changed);
  CHECK(fx.position("stop " + kOldUnit) >= 0);
  CHECK(fx.position("stop " + kOldUnit) < fx.position("start " + kOldUnit));
  CHECK(fx.units.state_of(kOldUnit) == "active");
  auto now = recorded_started(fx);
  REQUIRE(now);
  CHECK(now->environment.at("VLLM_X") == "1");
  CHECK(fx.units.dropins[kOldUnit].find("Environment=\"VLLM_X=1\"") != std::string::npos);
}

TEST_CASE("a restart for changed settings whose new server fails rolls back to the server as it ran") {
  Fixture fx;
  const auto started = fx.started_now("old");
  fx.cfg->models["old"].serve.environment["VLLM_X"] = "1";
  serve_old_started_with(fx, started);
  // The restarted server fails its health check; the one the rollback starts is ready.
  fx.not_ready["old"] = make_error(Errc::health_failed, "GET /health answered 503");
  fx.on_phase = [&](const nlohmann::json& j) {
    if (j["phase"] == "rolling_back") fx.not_ready.erase("old");
  };
  auto end = fx.wait_end(fx.deploy("old").id);
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == State::rolled_back);
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.store.linked_commit("old") == kOld);
  CHECK(fx.units.dropins[kOldUnit].find("VLLM_X") == std::string::npos);
  CHECK(recorded_started(fx) == started);
}

TEST_CASE("a restart asked for restarts the model that serves with the same settings") {
  Fixture fx;
  serve_old_started_with(fx, fx.started_now("old"));
  auto end = fx.wait_end(fx.deploy("old", false, true).id);
  CHECK(end.state == State::succeeded);
  CHECK(end.changed);
  CHECK(end.restart);
  CHECK(fx.position("stop " + kOldUnit) >= 0);
  CHECK(fx.position("start " + kOldUnit) > fx.position("stop " + kOldUnit));
}

TEST_CASE("a service whose started settings are not recorded is restarted by a redeploy and recorded then") {
  Fixture fx;
  fx.boot();  // state.json as an older modeld wrote it: no settings
  auto end = fx.wait_end(fx.deploy("old").id);
  CHECK(end.state == State::succeeded);
  CHECK(end.changed);
  CHECK(fx.position("start " + kOldUnit) >= 0);
  CHECK(recorded_started(fx) == fx.started_now("old"));
}

TEST_CASE("rolling back starts the old service with the settings it ran with, not today's configuration") {
  Fixture fx;
  auto started = fx.started_now("old");
  started.environment["OLD_ONLY"] = "1";  // what it ran with; today's configuration has none
  serve_old_started_with(fx, started);
  // The daemon's start rewrote the drop-in from today's configuration, the server untouched.
  CHECK(fx.units.dropins[kOldUnit].find("OLD_ONLY") == std::string::npos);
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  auto end = fx.wait_end(fx.deploy("new").id);
  check_old_restored(fx, end);
  REQUIRE(end.previous.size() == 1);
  CHECK(end.previous.front().started == started);
  CHECK(fx.units.dropins[kOldUnit].find("Environment=\"OLD_ONLY=1\"") != std::string::npos);
  CHECK(recorded_started(fx) == started);
}

TEST_CASE("a service the model watcher starts again is recorded with the settings of the drop-in it wrote") {
  Fixture fx;
  auto started = fx.started_now("old");
  started.environment["OLD_ONLY"] = "1";
  fx.cfg->models["old"].health.watch_interval = 10ms;
  serve_old_started_with(fx, started);
  fx.units.states[kOldUnit] = "failed";
  REQUIRE(fx.run_until([&] { return fx.units.state_of(kOldUnit) == "active" && recorded_started(fx) == fx.started_now("old"); }));
}

TEST_CASE("a watchdog restart while a deployment downloads is what that deployment's rollback restores") {
  Fixture fx;
  auto started = fx.started_now("old");
  started.environment["OLD_ONLY"] = "1";
  fx.cfg->models["old"].health.watch_interval = 10ms;
  serve_old_started_with(fx, started);
  fx.file_gate.armed = true;
  const auto id = fx.deploy("new").id;
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting > 0; }));
  fx.units.states[kOldUnit] = "failed";
  REQUIRE(fx.run_until([&] {
    auto d = fx.deployer->get(id);
    return d && d->previous.size() == 1 && d->previous.front().started == fx.started_now("old");
  }));
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  fx.file_gate.release();
  auto end = fx.wait_end(id);
  check_old_restored(fx, end);
  CHECK(fx.units.dropins[kOldUnit].find("OLD_ONLY") == std::string::npos);
}

TEST_CASE("a redeploy of the model that serves with the same settings restarts it when its unit is not active") {
  Fixture fx;
  serve_old_started_with(fx, fx.started_now("old"));
  fx.units.states[kOldUnit] = "activating";
  auto end = fx.wait_end(fx.deploy("old").id);
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == State::succeeded);
  CHECK(end.changed);
  CHECK(fx.position("start " + kOldUnit) >= 0);
  CHECK(fx.units.state_of(kOldUnit) == "active");
}

// ---- staging ahead: pull, deploy --commit, revisions ----

namespace {

const std::string kPulled(40, 'd');  // a revision of "new" pulled ahead earlier

deploy::DeployRequest pull_of(const std::string& model) {
  deploy::DeployRequest r{model};
  r.kind = deploy::Kind::pull;
  return r;
}

// Unit calls that start, stop or restart something (a pull makes none).
std::vector<std::string> service_calls(const test::FakeUnits& units) {
  std::vector<std::string> out;
  for (const auto& c : units.unit_calls)
    if (!c.starts_with("reset_failed ")) out.push_back(c);
  return out;
}

// The revisions GET /v1/models lists for `model`.
std::vector<deploy::RevisionInfo> revisions_of(Fixture& fx, const std::string& model) {
  for (const auto& m : fx.run(fx.deployer->models()))
    if (m.name == model) return m.revisions;
  return {};
}

}  // namespace

TEST_CASE("a pull runs planning to verifying as a record of kind pull, touches no service and records the commit") {
  Fixture fx;
  fx.boot();
  auto d = fx.deployer->start(pull_of("new"));
  REQUIRE(d);
  CHECK(d->kind == deploy::Kind::pull);
  auto end = fx.wait_end(d->id);
  INFO((end.error ? end.error->message : std::string("no error")));
  CHECK(end.state == State::succeeded);
  CHECK(end.changed);
  CHECK(end.commit == kNew);
  CHECK(fx.phases() == std::vector<Phase>{Phase::planning, Phase::freeing_disk, Phase::downloading, Phase::verifying});
  CHECK(service_calls(fx.units).empty());
  check_old_untouched(fx);
  CHECK(fx.store.manifest_still_matches("new", kNew));
  CHECK_FALSE(fx.store.linked_commit("new"));
  auto st = fx.states.load();
  REQUIRE(st);
  CHECK(st->pulled == deploy::Pulled{{"new", {kNew}}});
  auto revs = revisions_of(fx, "new");
  REQUIRE(revs.size() == 1);
  CHECK(revs[0].commit == kNew);
  CHECK(revs[0].state == "verified");
  CHECK(revs[0].pulled);
  CHECK_FALSE(revs[0].in_service);
  auto old = revisions_of(fx, "old");
  REQUIRE(old.size() == 1);
  CHECK(old[0].in_service);
  CHECK_FALSE(old[0].pulled);
  // The record reads back as a pull.
  auto hist = fx.states.load_history(1);
  REQUIRE(hist.size() == 1);
  CHECK(hist[0].kind == deploy::Kind::pull);
}

TEST_CASE("a pull of a commit already verified on disk succeeds with changed false and fetches nothing") {
  Fixture fx;
  fx.put_verified("new", kNew, false);
  fx.boot();
  auto d = fx.deployer->start(pull_of("new"));
  REQUIRE(d);
  auto end = fx.wait_end(d->id);
  CHECK(end.state == State::succeeded);
  CHECK_FALSE(end.changed);
  for (const auto& t : fx.hub_targets) CHECK_FALSE(t.starts_with("/acme/new/resolve/"));
  CHECK(service_calls(fx.units).empty());
}

TEST_CASE("a deploy while a pull runs is refused as deployment_running, and so is a pull while a deployment runs") {
  Fixture fx;
  fx.boot();
  fx.file_gate.armed = true;
  auto p = fx.deployer->start(pull_of("new"));
  REQUIRE(p);
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  for (const auto& r : {deploy::DeployRequest{"new"}, deploy::DeployRequest{"spare"}, pull_of("spare")}) {
    auto again = fx.deployer->start(r);
    REQUIRE_FALSE(again);
    CHECK(modeld::to_string(again.error().code) == std::string_view("deployment_running"));
  }
  fx.file_gate.release();
  CHECK(fx.wait_end(p->id).state == State::succeeded);
  fx.state_events.clear();

  fx.listing_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.listing_gate.waiting == 1; }));
  auto pull = fx.deployer->start(pull_of("spare"));
  REQUIRE_FALSE(pull);
  CHECK(modeld::to_string(pull.error().code) == std::string_view("deployment_running"));
  fx.listing_gate.release();
  check_new_serves(fx, fx.wait_end(d.id));
}

TEST_CASE("deploy with a commit lists the Hub at that commit, never the branch, and keeps it in the record") {
  Fixture fx;
  fx.boot();
  deploy::DeployRequest r{"new"};
  r.commit = kNew;
  auto d = fx.deployer->start(r);
  REQUIRE(d);
  CHECK(d->commit == kNew);
  check_new_serves(fx, fx.wait_end(d->id));
  REQUIRE_FALSE(fx.hub_targets.empty());
  for (const auto& t : fx.hub_targets) {
    CAPTURE(t);
    CHECK(t.find("/revision/main") == std::string::npos);
  }
  CHECK(std::any_of(fx.hub_targets.begin(), fx.hub_targets.end(),
                    [](const std::string& t) { return t.starts_with("/api/models/acme/new/revision/" + kNew); }));
  CHECK(fx.states.load_history(1).at(0).commit == kNew);
}

TEST_CASE("a deploy of a pulled commit fetches no file, drops its mark, and its cleanup spares other pulled revisions") {
  Fixture fx;
  const std::string stale(40, 'f');  // an older revision nothing spares
  fx.put_verified("new", kPulled, false);
  fx.put_files("new", stale);
  auto seeded = fx.states.load();
  REQUIRE(seeded);
  seeded->pulled["new"] = {kPulled};
  REQUIRE(fx.states.save(*seeded).has_value());
  fx.boot();
  auto p = fx.deployer->start(pull_of("new"));
  REQUIRE(p);
  REQUIRE(fx.wait_end(p->id).state == State::succeeded);
  REQUIRE(fx.states.load()->pulled == deploy::Pulled{{"new", {kPulled, kNew}}});
  fx.hub_targets.clear();
  fx.phase_events.clear();
  fx.state_events.clear();
  deploy::DeployRequest r{"new"};
  r.commit = kNew;
  auto d = fx.deployer->start(r);
  REQUIRE(d);
  check_new_serves(fx, fx.wait_end(d->id));
  for (const auto& t : fx.hub_targets) CHECK_FALSE(t.starts_with("/acme/new/resolve/"));
  CHECK(fs::exists(fx.store.revision_dir("new", kPulled)));
  CHECK_FALSE(fs::exists(fx.store.revision_dir("new", stale)));
  auto after = fx.states.load();
  REQUIRE(after);
  CHECK(after->pulled == deploy::Pulled{{"new", {kPulled}}});
  auto revs = revisions_of(fx, "new");
  REQUIRE(revs.size() == 2);
  for (const auto& rev : revs) CHECK(rev.in_service == (rev.commit == kNew));
}

TEST_CASE("freeing_disk never evicts a model holding a pulled revision") {
  deploy::Pulled pulled{{"spare", {kSpare}}};
  config::Config cfg;
  std::vector<store::StoredModel> stored{{"spare", std::nullopt, {kSpare}, 10}, {"other", std::nullopt, {kOld}, 20}};
  auto c = deploy::eviction_candidates(stored, cfg, "new", deploy::Serving{}, {}, false, pulled);
  REQUIRE(c.size() == 1);
  CHECK(c[0].name == "other");
}

TEST_CASE("rm of one revision removes it and its mark, and refuses the commit in service as model_active") {
  Fixture fx;
  fx.boot();
  auto p = fx.deployer->start(pull_of("new"));
  REQUIRE(p);
  REQUIRE(fx.wait_end(p->id).state == State::succeeded);
  auto active = fx.run(fx.deployer->remove_revision("old", kOld));
  REQUIRE_FALSE(active);
  CHECK(modeld::to_string(active.error().code) == std::string_view("model_active"));
  CHECK(fs::exists(fx.store.revision_dir("old", kOld)));
  auto rm = fx.run(fx.deployer->remove_revision("new", kNew));
  INFO((rm ? std::string("removed") : rm.error().message));
  REQUIRE(rm);
  CHECK(rm->commits == std::vector<std::string>{kNew});
  CHECK_FALSE(fs::exists(fx.store.revision_dir("new", kNew)));
  auto st = fx.states.load();
  REQUIRE(st);
  CHECK(st->pulled.empty());
  auto gone = fx.run(fx.deployer->remove_revision("new", kNew));
  REQUIRE_FALSE(gone);
  CHECK(modeld::to_string(gone.error().code) == std::string_view("not_found"));
}

TEST_CASE("a pull interrupted by a restart continues from planning and ends as an uninterrupted one") {
  const auto recorded = GENERATE(Phase::planning, Phase::downloading, Phase::verifying);
  CAPTURE(deploy::to_string(recorded));
  Fixture fx;
  fx.leave_crashed_in(recorded);
  auto d = fx.states.load_history(1).at(0);
  d.kind = deploy::Kind::pull;
  REQUIRE(fx.states.save_deployment(d).has_value());
  fx.boot();
  auto end = fx.wait_end(kRecordId);
  CHECK(end.state == State::succeeded);
  CHECK(end.kind == deploy::Kind::pull);
  CHECK(fx.phases() == std::vector<Phase>{Phase::planning, Phase::freeing_disk, Phase::downloading, Phase::verifying});
  CHECK(service_calls(fx.units).empty());
  check_old_untouched(fx);
  CHECK(fx.states.load()->pulled == deploy::Pulled{{"new", {kNew}}});
}

// ---- several models on one host ----

namespace {

const std::string kSpareUnit = "modeld-serve@spare.service";

// "old" (every GPU) and "spare" (no GPU, a port of its own) both serve, "spare" put into service
// last; "new" takes every GPU too, so it conflicts with "old" and not with "spare".
void serve_old_and_spare(Fixture& fx) {
  fx.cfg->models["spare"].serve.gpu_ids = std::vector<unsigned>{};
  REQUIRE(fx.store.switch_link("spare", kSpare).has_value());
  deploy::DaemonState st;
  st.active.put(deploy::ActiveRecord{"old", kOld, "2026-01-01T00:00:00Z", fx.started_now("old")});
  st.active.put(deploy::ActiveRecord{"spare", kSpare, "2026-01-01T01:00:00Z", fx.started_now("spare")});
  REQUIRE(fx.states.save(st).has_value());
  fx.units.states[kSpareUnit] = "active";
}

std::vector<std::string> serving_models(Fixture& fx) {
  std::vector<std::string> out;
  for (const auto& s : fx.deployer->services()) out.push_back(s.model);
  return out;
}

}  // namespace

TEST_CASE("a deploy stops only the services in conflict with its model and the others keep serving") {
  Fixture fx;
  serve_old_and_spare(fx);
  fx.boot();
  CHECK(serving_models(fx) == std::vector<std::string>{"old", "spare"});
  auto d = fx.deploy("new");
  REQUIRE(d.previous.size() == 1);
  CHECK(d.previous.front().model == "old");
  auto end = fx.wait_end(d.id);
  CHECK(end.state == State::succeeded);
  CHECK(fx.position("stop " + kOldUnit) >= 0);
  CHECK(fx.position("stop " + kSpareUnit) == -1);
  CHECK(fx.units.state_of(kSpareUnit) == "active");
  CHECK(serving_models(fx) == std::vector<std::string>{"spare", "new"});
  CHECK(fx.deployer->active()->model == "new");
  auto st = fx.states.load();
  REQUIRE(st.has_value());
  REQUIRE(st->active.services.size() == 2);
  CHECK(st->active.services[0].model == "spare");
}

TEST_CASE("a failed deploy brings back what it stopped and never touches a service it did not conflict with") {
  Fixture fx;
  serve_old_and_spare(fx);
  fx.boot();
  fx.not_ready["new"] = make_error(Errc::health_failed, "GET /health answered 503");
  auto end = fx.wait_end(fx.deploy("new").id);
  CHECK(end.state == State::rolled_back);
  CHECK(end.error->message == "GET /health answered 503; rolled back: old serves again");
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.position("stop " + kSpareUnit) == -1);
  CHECK(serving_models(fx) == std::vector<std::string>{"old", "spare"});
}

TEST_CASE("a stop takes one model out of service, its files kept, and a restart does not start it again") {
  Fixture fx;
  serve_old_and_spare(fx);
  fx.boot();
  auto d = fx.deployer->stop("spare");
  REQUIRE(d.has_value());
  CHECK(d->kind == deploy::Kind::stop);
  auto end = fx.wait_end(d->id);
  CHECK(end.state == State::succeeded);
  CHECK(fx.units.state_of(kSpareUnit) == "inactive");
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(serving_models(fx) == std::vector<std::string>{"old"});
  CHECK(fx.store.linked_commit("spare") == kSpare);
  auto again = fx.deployer->stop("spare");
  REQUIRE(again.has_value());
  CHECK(again->state == State::succeeded);
  CHECK_FALSE(again->changed);
  // The next daemon start brings back exactly what was in service.
  bool done = false;
  fx.deployer->shutdown([&] { done = true; });
  REQUIRE(fx.run_until([&] { return done; }));
  fx.deployer.reset();
  fx.units.states[kOldUnit] = "inactive";
  fx.boot();
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.units.state_of(kSpareUnit) == "inactive");
  CHECK(serving_models(fx) == std::vector<std::string>{"old"});
}

TEST_CASE("rm refuses every model in service, not only the active one") {
  Fixture fx;
  serve_old_and_spare(fx);
  fx.boot();
  auto r = fx.run(fx.deployer->remove("old"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::model_active);
}

TEST_CASE("at boot, of two services that the configuration now makes conflict, the later one starts") {
  Fixture fx;
  serve_old_and_spare(fx);
  fx.units.states[kOldUnit] = "inactive";
  fx.units.states[kSpareUnit] = "inactive";
  fx.cfg->models["spare"].serve.gpu_ids.reset();  // now on every GPU, as "old" is
  fx.boot();
  CHECK(fx.units.state_of(kSpareUnit) == "active");
  CHECK(fx.units.state_of(kOldUnit) == "inactive");
  CHECK(serving_models(fx) == std::vector<std::string>{"spare"});
}

TEST_CASE("a watcher restarts a service as it ran when today's configuration would put it onto another's GPUs") {
  Fixture fx;
  serve_old_and_spare(fx);
  const auto ran_with = fx.started_now("spare");  // no GPU
  fx.cfg->models["spare"].health.watch_interval = 10ms;
  fx.cfg->models["spare"].serve.gpu_ids.reset();  // today: every GPU, as "old" has
  fx.boot();
  CHECK(serving_models(fx) == std::vector<std::string>{"old", "spare"});  // both run: what runs decides
  fx.units.states[kSpareUnit] = "failed";
  REQUIRE(fx.run_until([&] { return fx.units.state_of(kSpareUnit) == "active" && fx.position("start " + kSpareUnit) >= 0; }));
  REQUIRE(fx.run_until([&] { return recorded_started(fx) == ran_with; }));
  CHECK(recorded_started(fx)->gpu_ids == std::vector<unsigned>{});
  CHECK(fx.units.dropins[kSpareUnit].find("CUDA_VISIBLE_DEVICES=") != std::string::npos);
}

namespace {

// What the state records "spare" to have started with.
std::optional<deploy::StartedSettings> spare_started(Fixture& fx) {
  auto st = fx.states.load();
  REQUIRE(st);
  const auto* a = st->active.find("spare");
  REQUIRE(a);
  return a->started;
}

}  // namespace

TEST_CASE("a watcher restart keeps a service out of the place of the model a running deploy is about to start") {
  Fixture fx;
  serve_old_and_spare(fx);  // spare started on no GPU and a port of its own; new conflicts with old only
  fx.cfg->models["spare"].health.watch_interval = 10ms;
  const auto ran_with = fx.started_now("spare");
  // Since spare started, the configuration gave it new's port: today spare would conflict with
  // new, not with old (and at boot it keeps running as it was started).
  fx.cfg->models["spare"].serve.port = fx.cfg->models["new"].serve.port;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(d.previous.size() == 1);
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  fx.units.states[kSpareUnit] = "failed";
  REQUIRE(fx.run_until([&] { return fx.units.state_of(kSpareUnit) == "active" && fx.position("start " + kSpareUnit) >= 0; }));
  // Restarted with what it ran with (its own port), not today's port, which new is about to take.
  REQUIRE(fx.run_until([&] { return spare_started(fx) == ran_with; }));
  CHECK(spare_started(fx)->port == ran_with.port);
  CHECK(ran_with.port != fx.cfg->models["new"].serve.port);
  fx.file_gate.release();
  CHECK(fx.wait_end(d.id).state == State::succeeded);
  CHECK(serving_models(fx) == std::vector<std::string>{"spare", "new"});
}

TEST_CASE("a deploy whose place a service it does not stop has come into fails before stopping anything, naming it") {
  Fixture fx;
  serve_old_and_spare(fx);
  // Recorded before started settings were kept: spare's placement is what the configuration says.
  auto st = fx.states.load();
  REQUIRE(st);
  for (auto& a : st->active.services) a.started.reset();
  REQUIRE(fx.states.save(*st).has_value());
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(d.previous.size() == 1);  // old only: spare is on no GPU and a port of its own
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  fx.cfg->models["spare"].serve.port = fx.cfg->models["new"].serve.port;  // a reload moves spare onto new's port
  fx.file_gate.release();
  auto end = fx.wait_end(d.id);
  CHECK(end.state == State::failed);
  REQUIRE(end.error);
  CHECK(end.error->code == Errc::model_active);
  CHECK_THAT(end.error->message, Catch::Contains("not starting new beside spare") &&
                                     Catch::Contains(fmt::format("both use port {}", fx.cfg->models["new"].serve.port)));
  CHECK(fx.position("stop " + kOldUnit) == -1);
  CHECK(fx.units.state_of(kOldUnit) == "active");
  CHECK(fx.position("start " + kNewUnit) == -1);
  CHECK(serving_models(fx) == std::vector<std::string>{"old", "spare"});
}

// ---- the stop's 409 rules (deployer.cpp: stop() and refuse_new_record()) ----

TEST_CASE("a stop while a deployment runs is refused as deployment_running even for a model not in service") {
  Fixture fx;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  for (const char* model : {"old", "spare"}) {  // "spare" is not in service: refused, not "nothing to do"
    CAPTURE(model);
    auto stop = fx.deployer->stop(model);
    REQUIRE_FALSE(stop);
    CHECK(modeld::to_string(stop.error().code) == std::string_view("deployment_running"));
    CHECK(stop.error().message == fmt::format("deployment {} of new is running (phase downloading)", d.id));
  }
  CHECK(fx.deployer->current()->id == d.id);
  CHECK(fx.position("stop " + kOldUnit) == -1);
  fx.file_gate.release();
  check_new_serves(fx, fx.wait_end(d.id));
  CHECK(fx.deployer->history(10).size() == 1);  // no stop record was made
}

TEST_CASE("a deploy or a pull or a stop or a verify while a stop runs is refused as deployment_running") {
  Fixture fx;
  fx.boot();
  auto& stop_unit = fx.units.gates["stop " + kOldUnit];
  stop_unit.armed = true;
  auto s = fx.deployer->stop("old");
  REQUIRE(s);
  REQUIRE(fx.run_until([&] { return stop_unit.waiting == 1; }));
  const std::string running = fmt::format("stop {} of old is running (phase stopping_old)", s->id);
  for (const auto& r : {deploy::DeployRequest{"new"}, deploy::DeployRequest{"old"}, pull_of("new"), pull_of("spare")}) {
    CAPTURE(r.model, deploy::to_string(r.kind));
    auto again = fx.deployer->start(r);
    REQUIRE_FALSE(again);
    CHECK(modeld::to_string(again.error().code) == std::string_view("deployment_running"));
    CHECK(again.error().message == running);
  }
  for (const char* model : {"old", "spare"}) {
    CAPTURE(model);
    auto stop = fx.deployer->stop(model);
    REQUIRE_FALSE(stop);
    CHECK(stop.error().code == Errc::deployment_running);
    CHECK(stop.error().message == running);
  }
  auto v = fx.run(fx.deployer->verify("old"));
  REQUIRE_FALSE(v);
  CHECK(v.error().code == Errc::deployment_running);
  CHECK(v.error().message == running + "; verify old when it has ended");
  CHECK(fx.hub_targets.empty());  // no planning began
  stop_unit.release();
  auto end = fx.wait_end(s->id);
  CHECK(end.state == State::succeeded);
  CHECK(fx.deployer->history(10).size() == 1);
  CHECK_FALSE(fx.deployer->active());
  // Once the stop has ended, a deploy goes ahead.
  auto d = fx.deploy("new");
  CHECK(fx.wait_end(d.id).state == State::succeeded);
}

TEST_CASE("after a restart a stop is refused until the interrupted deployment continues") {
  Fixture fx;
  fx.leave_crashed_in(Phase::downloading);
  fx.load();
  auto stop = fx.deployer->stop("old");
  REQUIRE_FALSE(stop);
  CHECK(stop.error().code == Errc::deployment_running);
  CHECK(stop.error().message ==
        fmt::format("deployment {} of new, interrupted by modeld's restart, is about to continue", kRecordId));
  CHECK(fx.units.unit_calls.empty());
  bool recovered = false;
  asio::co_spawn(fx.ioc, fx.deployer->recover(), [&](std::exception_ptr) { recovered = true; });
  REQUIRE(fx.run_until([&] { return recovered; }));
  check_new_serves(fx, fx.wait_end(kRecordId));
}

TEST_CASE("after a restart an rm, an rm --commit and a verify are refused until recovery has decided what resumes") {
  Fixture fx;
  fx.leave_crashed_in(Phase::downloading);
  fx.load();
  const std::string why =
      fmt::format("deployment {} of new, interrupted by modeld's restart, is about to continue", kRecordId);
  auto rm = fx.run(fx.deployer->remove("spare"));
  REQUIRE_FALSE(rm);
  CHECK(rm.error().code == Errc::deployment_running);
  CHECK(rm.error().message == why);
  auto one = fx.run(fx.deployer->remove_revision("spare", kSpare));
  REQUIRE_FALSE(one);
  CHECK(one.error().message == why);
  auto v = fx.run(fx.deployer->verify("spare"));
  REQUIRE_FALSE(v);
  CHECK(v.error().message == why);
  auto pull = fx.deployer->start({"spare", false, false, deploy::Kind::pull});
  REQUIRE_FALSE(pull);
  CHECK(pull.error().message == why);
  CHECK(fs::exists(fx.store.revision_dir("spare", kSpare)));
  bool recovered = false;
  asio::co_spawn(fx.ioc, fx.deployer->recover(), [&](std::exception_ptr) { recovered = true; });
  REQUIRE(fx.run_until([&] { return recovered; }));
  fx.wait_end(kRecordId);
  // Recovery has ended: the same rm goes ahead.
  auto after = fx.run(fx.deployer->remove("spare"));
  REQUIRE(after);
  CHECK_FALSE(fs::exists(fx.store.revision_dir("spare", kSpare)));
}

TEST_CASE("a stop and a deploy while modeld shuts down are refused as cancelled") {
  Fixture fx;
  fx.boot();
  bool done = false;
  fx.deployer->shutdown([&] { done = true; });
  REQUIRE(fx.run_until([&] { return done; }));
  auto stop = fx.deployer->stop("old");
  REQUIRE_FALSE(stop);
  CHECK(stop.error().code == Errc::cancelled);
  CHECK(stop.error().message == "modeld is shutting down");
  auto d = fx.deployer->start({"new", false});
  REQUIRE_FALSE(d);
  CHECK(d.error().code == Errc::cancelled);
  CHECK(fx.position("stop " + kOldUnit) == -1);
  CHECK(fx.deployer->history(10).empty());
}

// -- the pre-flight (preflight.hpp) as the Deployer runs it ---------------------------------------

namespace {

// A TCP listener on 127.0.0.1:`port` (0: one the kernel picks): a process that is no model service.
struct PortSquatter {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::uint16_t port = 0;
  explicit PortSquatter(std::uint16_t want = 0) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(want);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~PortSquatter() { ::close(fd); }
};

const deploy::PreflightCheck* find_check(const deploy::PlanReport& p, const std::string& name) {
  for (const auto& c : p.preflight)
    if (c.check == name) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("a deploy whose program systemd cannot find fails in planning, before the Hub and any stop") {
  Fixture fx;
  fx.cfg->models["new"].serve.command = {"no-such-inference-server", "serve"};
  fx.cfg->models["new"].source_file = "/etc/modeld/models.d/new.toml";
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new").id);
  CHECK(end.state == State::failed);
  CHECK(end.phase == Phase::planning);
  REQUIRE(end.error);
  CHECK(end.error->code == Errc::unit_failed);
  CHECK_THAT(end.error->message,
             Catch::StartsWith("pre-flight failed: command: models.new.serve.command[0] (set in "
                               "/etc/modeld/models.d/new.toml): 'no-such-inference-server' is in none of") &&
                 Catch::EndsWith("; not deploying"));
  CHECK(fx.hub_targets.empty());
  CHECK(fx.units.unit_calls.empty());
  check_old_untouched(fx);
}

TEST_CASE("plan shows the pre-flight: each check, the failing one naming its key") {
  Fixture fx;
  fx.cfg->models["new"].serve.gpu_ids = std::vector<unsigned>{0};  // no NVML in these tests: not visible
  fx.boot();
  auto plan = fx.run(fx.deployer->plan("new", false, std::nullopt));
  REQUIRE(plan.has_value());
  REQUIRE(plan->preflight.size() == 3);
  CHECK(find_check(*plan, "command")->ok);
  CHECK(find_check(*plan, "port")->ok);
  const auto* gpus = find_check(*plan, "gpus");
  REQUIRE(gpus);
  CHECK_FALSE(gpus->ok);
  CHECK_THAT(gpus->message, Catch::StartsWith("models.new.serve.gpu_ids = [0]") && Catch::Contains("no NVIDIA GPU"));
  CHECK(plan->fits);  // the disk side is unchanged: the pre-flight is its own verdict
}

TEST_CASE("plan counts the port of a service a deploy would stop as free, and a foreign holder as not") {
  Fixture fx;
  PortSquatter squatter;
  fx.cfg->models["new"].serve.port = squatter.port;
  fx.boot();
  auto plan = fx.run(fx.deployer->plan("new", false, std::nullopt));
  REQUIRE(plan.has_value());
  CHECK(plan->stops == std::vector<std::string>{"old"});
  CHECK_FALSE(find_check(*plan, "port")->ok);
  // The same holder as the process of "old", which the deploy stops: the port will be free.
  fx.units.unit_pids[kOldUnit] = {static_cast<std::uint32_t>(::getpid())};
  fx.cfg->models["old"].serve.port = squatter.port;
  plan = fx.run(fx.deployer->plan("new", false, std::nullopt));
  REQUIRE(plan.has_value());
  CHECK(find_check(*plan, "port")->ok);
}

TEST_CASE("the pre-flight runs again right before stopping_old: a port taken during the download spares the old model") {
  Fixture fx;
  const std::uint16_t port = PortSquatter().port;  // free again once that one is closed
  fx.cfg->models["new"].serve.port = port;
  fx.boot();
  fx.file_gate.armed = true;
  auto d = fx.deploy("new");
  REQUIRE(fx.run_until([&] { return fx.file_gate.waiting == 1; }));
  PortSquatter squatter(port);
  fx.file_gate.release();
  auto end = fx.wait_end(d.id);
  CHECK(end.state == State::failed);
  CHECK(end.phase == Phase::stopping_old);
  REQUIRE(end.error);
  CHECK_THAT(end.error->message, Catch::StartsWith("pre-flight failed: port: models.new.serve.port") &&
                                     Catch::EndsWith("; not stopping old"));
  CHECK_FALSE(end.old_stopped);
  check_old_untouched(fx);
}

namespace {
// The daemon's stop: shutdown() to its end, then the Deployer gone (a next boot() makes another).
void shut_down(Fixture& fx) {
  bool done = false;
  fx.deployer->shutdown([&] { done = true; });
  REQUIRE(fx.run_until([&] { return done; }));
  fx.deployer.reset();
}
}  // namespace

TEST_CASE("a start with an empty state adopts the model service that runs, and rm then refuses it") {
  Fixture fx;
  // What recover() writes for "old" when its state is known: the drop-in of today's configuration.
  fx.boot();
  const auto dropin = fx.units.dropins.at(kOldUnit);
  shut_down(fx);
  for (const std::string text : {"null", "[]"}) {
    INFO("state.json: " << text);
    std::ofstream(fx.cfg->daemon.state_dir / "state.json", std::ios::trunc) << text;
    fs::remove(fx.cfg->daemon.state_dir / "state.json.prev");
    fx.units.dropins[kOldUnit] = dropin;
    fx.boot();
    auto services = fx.deployer->services();
    REQUIRE(services.size() == 1);
    CHECK(services[0].model == "old");
    CHECK(services[0].commit == kOld);
    // Adopted with the settings its drop-in shows, so a redeploy of the same is a no-op.
    auto st = fx.states.load();
    REQUIRE(st);
    REQUIRE(st->active.find("old"));
    REQUIRE(st->active.find("old")->started);
    CHECK(*st->active.find("old")->started == fx.started_now("old"));
    auto rm = fx.run(fx.deployer->remove("old"));
    REQUIRE_FALSE(rm);
    CHECK(rm.error().code == Errc::model_active);
    CHECK(fs::exists(fx.store.revision_dir("old", kOld)));
    shut_down(fx);
  }
}

TEST_CASE("a running unit that cannot be adopted is reported, and rm of its model is refused while it runs") {
  Fixture fx;
  fx.record_active("spare", kSpare);  // "old" runs, but the state has only "spare"
  fx.units.states["modeld-serve@spare.service"] = "active";
  REQUIRE(fs::remove(fx.store.model_path("old")));  // what "old" serves is unknown now
  fx.boot();
  CHECK(serving_models(fx) == std::vector<std::string>{"spare"});
  CHECK(fx.units.state_of(kOldUnit) == "active");  // left alone
  auto rm = fx.run(fx.deployer->remove("old"));
  REQUIRE_FALSE(rm);
  CHECK(rm.error().code == Errc::model_active);
  CHECK(rm.error().message.find("systemctl stop modeld-serve@old.service") != std::string::npos);
  auto one = fx.run(fx.deployer->remove_revision("old", kOld));
  REQUIRE_FALSE(one);
  CHECK(one.error().code == Errc::model_active);
  CHECK(fs::exists(fx.store.revision_dir("old", kOld)));
  fx.units.states[kOldUnit] = "inactive";
  auto after = fx.run(fx.deployer->remove("old"));
  REQUIRE(after);
}

TEST_CASE("a start whose state.json is damaged falls back to its copy and writes a good state.json again") {
  Fixture fx;
  std::ofstream(fx.cfg->daemon.state_dir / "state.json", std::ios::trunc) << "{\"services\": [";
  fx.boot();
  CHECK(serving_models(fx) == std::vector<std::string>{"old"});
  auto st = fx.states.load();
  REQUIRE(st);
  CHECK(st->active.find("old"));
  CHECK(fs::exists(fx.cfg->daemon.state_dir / "state.json.bad"));
}

// --- The switch strategy seam (switch_strategy.hpp) ---

namespace {

// Test strategies: "gives_up" runs one step of its own (a launching that touches nothing) whose
// row gives up; "never" does not apply. Both fall back to restart unless `fallback` is empty.
asio::awaitable<Result<void>> give_up(deploy::RecordRun& r) {
  // GCC 12: no co_await in a condition, and no class temporary passed to a coroutine.
  const std::string why = "the test strategy gives up";
  const bool fell_back = co_await r.fall_back(why);
  if (fell_back) co_return Result<void>{};
  co_return make_error(Errc::internal, "the test strategy gives up and has no fallback");
}

constexpr deploy::PhaseRow kGiveUpRows[] = {
    {deploy::Step::launching, Phase::launching, "launching", "launching", false, true, give_up, nullptr}};

deploy::SwitchSteps own_launch(bool) { return {{}, {deploy::Step::launching}}; }
std::span<const deploy::PhaseRow> give_up_rows() { return kGiveUpRows; }
bool never_committed(const deploy::Deployment&) { return false; }
deploy::SwitchVerdict applies(const deploy::SwitchQuery&) { return {true, "the test asks for it"}; }
deploy::SwitchVerdict does_not_apply(const deploy::SwitchQuery&) { return {false, "the test says no"}; }

constexpr deploy::SwitchStrategy kGivesUp{"gives_up", "restart", applies, own_launch, give_up_rows,
                                          deploy::Step::rolling_back, never_committed, "restart"};
constexpr deploy::SwitchStrategy kGivesUpAlone{"gives_up", "restart", applies, own_launch, give_up_rows,
                                               deploy::Step::rolling_back, never_committed, ""};
constexpr deploy::SwitchStrategy kNever{"never", "restart", does_not_apply, own_launch, give_up_rows,
                                        deploy::Step::rolling_back, never_committed, "restart"};

}  // namespace

TEST_CASE("a strategy that gives up mid-run falls back to a restart, recorded, and the deployment succeeds") {
  Fixture fx;
  fx.switches = {&kGivesUp, &deploy::restart_switch()};
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new").id);
  check_new_serves(fx, end);
  CHECK(end.switch_method.empty());  // restart
  CHECK(end.switch_fallback == "the test strategy gives up");
  // Its own launching showed first, then the restart's steps from stopping_old on.
  const std::vector<Phase> order{Phase::planning,     Phase::freeing_disk,    Phase::downloading,
                                 Phase::verifying,    Phase::warming,         Phase::launching,
                                 Phase::stopping_old, Phase::launching,       Phase::health_checking,
                                 Phase::benchmarking};
  CHECK(phase_list(fx.phases()) == phase_list(order));
  CHECK(fx.position("stop " + kOldUnit) >= 0);
  // Persisted for a restarted daemon, never shown in the API.
  auto hist = fx.states.load_history(10);
  REQUIRE_FALSE(hist.empty());
  CHECK(hist.front().switch_fallback == "the test strategy gives up");
  CHECK_FALSE(deploy::to_json(end).contains("switch_fallback"));
}

TEST_CASE("a strategy that gives up without a fallback fails the deployment and the old model serves on") {
  Fixture fx;
  fx.switches = {&kGivesUpAlone, &deploy::restart_switch()};
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new").id);
  CHECK(end.state == State::failed);
  REQUIRE(end.error);
  CHECK(end.error->message == "the test strategy gives up and has no fallback");
  CHECK(end.switch_method == "gives_up");  // chosen after planning and recorded
  CHECK(fx.position("stop " + kOldUnit) == -1);
  CHECK(fx.units.states[kOldUnit] == "active");
  auto active = fx.deployer->active();
  REQUIRE(active);
  CHECK(active->model == "old");
}

TEST_CASE("a strategy that does not apply hands the switch to its fallback, which runs as today") {
  Fixture fx;
  fx.switches = {&kNever, &deploy::restart_switch()};
  fx.boot();
  auto end = fx.wait_end(fx.deploy("new").id);
  check_new_serves(fx, end);
  CHECK(end.switch_method.empty());
  CHECK(end.switch_fallback.empty());
  CHECK(phase_list(fx.phases()) == phase_list(kOrder));
}

TEST_CASE("the built-in restart strategy always applies, commits at stopping_old and rolls back by rolling_back") {
  const auto& r = deploy::restart_switch();
  config::ModelConfig m;
  deploy::Deployment d;
  const auto v = r.applies(deploy::SwitchQuery{d, m});
  CHECK(v.applies);
  CHECK(v.why == "serve.switch is \"restart\"");
  CHECK_FALSE(r.committed(d));
  d.old_stopped = true;
  CHECK(r.committed(d));
  CHECK(r.rollback == deploy::Step::rolling_back);
  CHECK(r.fallback.empty());
  CHECK(deploy::builtin_switches().front() == &r);
  const auto late = r.steps(false), early = r.steps(true);
  CHECK(late.after_planning.empty());
  CHECK(late.after_warming.size() == 3);
  CHECK(early.after_planning == std::vector{deploy::Step::stopping_old});
}
