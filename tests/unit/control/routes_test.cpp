// The control API's routes, answered by handle() (through handle_async) against a fake deploy::Control,
// without sockets.

#include "control/routes.hpp"
#include "unit/control/fake_control.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace modeld;
using namespace modeld::control;
using control::test::FakeControl;
using control::test::body_of;
using control::test::make_deployment;
using control::test::require_error;
using nlohmann::json;

namespace {

const Peer root{0, 0, 1};
const Peer member{1000, 1000, 4242};
const Peer stranger{1001, 1001, 4343};

// Members are uid 1000 only; records who was asked about.
struct Members {
  std::vector<std::pair<uid_t, std::string>> asked;
  Access access() {
    Access a;
    a.group = "modeld";
    a.is_member = [this](const Peer& p, const std::string& g) {
      asked.emplace_back(p.uid, g);
      return p.uid == 1000;
    };
    return a;
  }
};

// Answers through handle_async(), which answers what handle() does and GET /v1/models.
Response call(FakeControl& e, std::string method, std::string target, std::string body = {},
              const Peer& peer = member) {
  Members m;
  return control::test::answer(e, Request{std::move(method), std::move(target), std::move(body)}, peer, m.access());
}

}  // namespace

TEST_CASE("status reports the daemon and nulls when nothing is active or was deployed") {
  FakeControl e;
  auto r = call(e, "GET", "/v1/status");
  REQUIRE(r.status == 200);
  auto j = body_of(r);
  CHECK(j["daemon"]["version"] == MODELD_VERSION);
  CHECK(j["daemon"]["uptime_s"] == 12.5);
  CHECK(j["active"].is_null());
  CHECK(j["services"] == json::array());
  CHECK(j["watchdog"].is_null());
  CHECK(j["deployment"].is_null());
}

namespace {

deploy::WatchdogStatus restarted_watchdog(std::string model) {
  deploy::WatchdogStatus w;
  w.model = model;
  w.unit = "modeld-serve@" + model + ".service";
  w.state = "backoff";
  w.consecutive_failures = 2;
  w.restarts = 3;
  w.probe_failures = 7;
  w.last_restart_at = "2026-11-29T19:10:00Z";
  w.last_restart_reason = "modeld-serve@" + model + ".service left the active state: it is inactive (dead)";
  w.last_probe_at = "2026-11-29T19:11:00Z";
  w.last_probe_ok = false;
  w.last_probe_seconds = 0.25;
  return w;
}

}  // namespace

TEST_CASE("status shows the active model's watchdog with its counters and last restart") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "abc123", "modeld-serve@llama.service", 8000, "2026-11-29T19:00:00Z"};
  e.watched = {restarted_watchdog("llama"), restarted_watchdog("kimi-k2-5")};
  auto w = body_of(call(e, "GET", "/v1/status"))["watchdog"];
  CHECK(w["model"] == "llama");
  CHECK(w["state"] == "backoff");
  CHECK(w["consecutive_failures"] == 2);
  CHECK(w["restarts"] == 3);
  CHECK(w["last_restart_at"] == "2026-11-29T19:10:00Z");
  CHECK(w["last_restart_reason"] == "modeld-serve@llama.service left the active state: it is inactive (dead)");
  CHECK(w["last_probe_at"] == "2026-11-29T19:11:00Z");
  CHECK(w["last_probe_ok"] == false);

  SECTION("a watchdog that never restarted or probed has nulls") {
    deploy::WatchdogStatus fresh;
    fresh.model = "llama";
    fresh.state = "watching";
    e.watched = {fresh};
    w = body_of(call(e, "GET", "/v1/status"))["watchdog"];
    CHECK(w["state"] == "watching");
    CHECK(w["restarts"] == 0);
    for (const char* key : {"last_restart_at", "last_restart_reason", "last_probe_at", "last_probe_ok"})
      CHECK(w[key].is_null());
  }
  SECTION("a watchdog of another model than the active one is not shown") {
    e.watched = {restarted_watchdog("kimi-k2-5")};
    CHECK(body_of(call(e, "GET", "/v1/status"))["watchdog"].is_null());
  }
}

namespace {

deploy::ServiceInfo service(std::string model, std::uint16_t port, std::optional<std::vector<unsigned>> gpus) {
  deploy::ServiceInfo s;
  s.model = model;
  s.commit = std::string(40, model[0]);
  s.unit = "modeld-serve@" + model + ".service";
  s.port = port;
  s.gpu_ids = std::move(gpus);
  s.since = "2026-11-29T19:0" + std::to_string(port % 10) + ":00Z";
  return s;
}

}  // namespace

TEST_CASE("status lists every service in the order put into service, with its GPUs and its watchdog") {
  FakeControl e;
  e.in_service = {service("llama", 8000, std::vector<unsigned>{0, 1, 2, 3}), service("kimi-k2-5", 8001, std::nullopt),
                  service("embed", 8002, std::vector<unsigned>{})};
  e.in_service[0].watchdog = restarted_watchdog("llama");
  e.active_model = deploy::Active{"embed", e.in_service[2].commit, "modeld-serve@embed.service", 8002,
                                  e.in_service[2].since};
  const auto j = body_of(call(e, "GET", "/v1/status"));
  const auto& services = j["services"];
  REQUIRE(services.size() == 3);
  CHECK(services[0] == json{{"model", "llama"},
                            {"commit", std::string(40, 'l')},
                            {"unit", "modeld-serve@llama.service"},
                            {"port", 8000},
                            {"gpu_ids", {0, 1, 2, 3}},
                            {"since", "2026-11-29T19:00:00Z"},
                            {"watchdog", deploy::to_json(restarted_watchdog("llama"))}});
  CHECK(services[1]["model"] == "kimi-k2-5");
  CHECK(services[1]["gpu_ids"].is_null());  // every GPU
  CHECK(services[1]["watchdog"].is_null());  // never watched
  CHECK(services[2]["gpu_ids"] == json::array());  // no GPU
  // "active" keeps its shape: the service put into service last.
  CHECK(j["active"] == json{{"model", "embed"}, {"commit", std::string(40, 'e')},
                            {"unit", "modeld-serve@embed.service"}, {"port", 8002},
                            {"since", "2026-11-29T19:02:00Z"}});
}

TEST_CASE("the top-level watchdog is the active model's, whichever model the watcher probed last") {
  FakeControl e;
  e.in_service = {service("llama", 8000, std::nullopt), service("kimi-k2-5", 8001, std::nullopt)};
  auto active_one = restarted_watchdog("kimi-k2-5");
  active_one.state = "watching";
  e.in_service[0].watchdog = restarted_watchdog("llama");
  e.in_service[1].watchdog = active_one;
  e.watched = {restarted_watchdog("llama"), active_one};  // llama probed last
  e.active_model = deploy::Active{"kimi-k2-5", e.in_service[1].commit, e.in_service[1].unit, 8001, "x"};
  auto w = body_of(call(e, "GET", "/v1/status"))["watchdog"];
  CHECK(w["model"] == "kimi-k2-5");
  CHECK(w["state"] == "watching");
}

TEST_CASE("status reports the active model and the current deployment") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "abc123", "modeld-serve@llama.service", 8000,
                                  "2026-11-29T19:00:00Z"};
  e.deployments.push_back(make_deployment("d1", "kimi-k2-5", deploy::State::running,
                                          deploy::Phase::downloading));
  auto j = body_of(call(e, "GET", "/v1/status"));
  CHECK(j["active"] == json{{"model", "llama"}, {"commit", "abc123"},
                            {"unit", "modeld-serve@llama.service"}, {"port", 8000},
                            {"since", "2026-11-29T19:00:00Z"}});
  CHECK(j["deployment"]["id"] == "d1");
  CHECK(j["deployment"]["phase"] == "downloading");
  CHECK(j["deployment"]["state"] == "running");
}

TEST_CASE("models lists every configured model with the contract's fields") {
  FakeControl e;
  deploy::ModelInfo m;
  m.name = "llama";
  m.repo = "meta/llama";
  m.revision = "main";
  m.commit = "abc";
  m.state = "verified";
  m.size_bytes = 1234;
  m.active = true;
  e.configured = {m, deploy::ModelInfo{"kimi-k2-5", "moonshotai/Kimi-K2.5", "main", std::nullopt,
                                       "absent", 0, false, true, std::nullopt}};
  auto j = body_of(call(e, "GET", "/v1/models"));
  REQUIRE(j["models"].size() == 2);
  CHECK(j["models"][0] == json{{"name", "llama"}, {"repo", "meta/llama"}, {"revision", "main"},
                               {"commit", "abc"}, {"state", "verified"}, {"size_bytes", 1234},
                               {"active", true}, {"pinned", false}, {"last_active", nullptr},
                               {"revisions", json::array()}});
  CHECK(j["models"][1]["commit"].is_null());
  CHECK(j["models"][1]["pinned"] == true);
}

TEST_CASE("models lists each model's revisions on disk with their state and marks") {
  FakeControl e;
  deploy::ModelInfo m;
  m.name = "llama";
  m.state = "verified";
  m.revisions = {{std::string(40, 'a'), "verified", false, true}, {std::string(40, 'b'), "partial", true, false}};
  e.configured = {m};
  auto j = body_of(call(e, "GET", "/v1/models"));
  CHECK(j["models"][0]["revisions"] ==
        json::array({{{"commit", std::string(40, 'a')}, {"state", "verified"}, {"pulled", false}, {"in_service", true}},
                     {{"commit", std::string(40, 'b')}, {"state", "partial"}, {"pulled", true}, {"in_service", false}}}));
}

TEST_CASE("a deploy body's commit is passed on, and one that is not 40 lowercase hex digits is 400") {
  FakeControl e;
  const std::string c(40, 'e');
  auto r = call(e, "POST", "/v1/deployments", R"({"model": "llama", "commit": ")" + c + R"("})");
  REQUIRE(r.status == 202);
  CHECK(body_of(r)["commit"] == c);
  CHECK(e.deployments.at(0).commit == c);
  CHECK(e.deployments.at(0).kind == deploy::Kind::deploy);
  for (const std::string& bad : std::vector<std::string>{R"("main")", R"(7)", "\"" + std::string(40, 'E') + "\"",
                                                        "\"" + std::string(39, 'e') + "\""}) {
    CAPTURE(bad);
    auto refused = call(e, "POST", "/v1/deployments", R"({"model": "llama", "commit": )" + bad + "}");
    require_error(refused, 400, "bad_request");
    CHECK_THAT(body_of(refused)["error"]["message"].get<std::string>(), Catch::Contains("\"commit\""));
  }
  CHECK(e.starts == 1);
  auto unknown = call(e, "POST", "/v1/deployments", R"({"model": "llama", "comit": "x"})");
  CHECK_THAT(body_of(unknown)["error"]["message"].get<std::string>(), Catch::Contains("model, allow_downtime, restart, commit"));
}

TEST_CASE("a member starts a deployment and gets 202 with the DEPLOYMENT") {
  FakeControl e;
  auto r = call(e, "POST", "/v1/deployments", R"({"model": "llama", "allow_downtime": true})");
  REQUIRE(r.status == 202);
  auto j = body_of(r);
  CHECK(j["model"] == "llama");
  CHECK(j["state"] == "running");
  CHECK(j["commit"].is_null());
  REQUIRE(e.deployments.size() == 1);
  CHECK(e.deployments[0].allow_downtime);
}

TEST_CASE("allow_downtime defaults to false") {
  FakeControl e;
  REQUIRE(call(e, "POST", "/v1/deployments", R"({"model": "llama"})").status == 202);
  CHECK_FALSE(e.deployments.at(0).allow_downtime);
}

TEST_CASE("restart reaches the control, defaults to false and must be a boolean") {
  FakeControl e;
  REQUIRE(call(e, "POST", "/v1/deployments", R"({"model": "llama"})").status == 202);
  CHECK_FALSE(e.deployments.at(0).restart);
  e.deployments.clear();
  REQUIRE(call(e, "POST", "/v1/deployments", R"({"model": "llama", "restart": true})").status == 202);
  CHECK(e.deployments.at(0).restart);
  auto r = call(e, "POST", "/v1/deployments", R"({"model": "llama", "restart": 1})");
  require_error(r, 400, "bad_request");
  CHECK_THAT(body_of(r)["error"]["message"].get<std::string>(), Catch::Contains("\"restart\" must be true or false"));
}

TEST_CASE("root may deploy without being asked about group membership") {
  FakeControl e;
  Members m;
  auto r = handle(Request{"POST", "/v1/deployments", R"({"model": "llama"})"}, root, e, m.access());
  CHECK(r.status == 202);
  CHECK(m.asked.empty());
}

TEST_CASE("a non-member is refused 403 forbidden on deploy and cancel, and the control is not called") {
  FakeControl e;
  e.deployments.push_back(make_deployment("d1", "llama", deploy::State::running));
  Members m;
  auto r = handle(Request{"POST", "/v1/deployments", R"({"model": "llama"})"}, stranger, e, m.access());
  require_error(r, 403, "forbidden");
  CHECK(body_of(r)["error"]["message"].get<std::string>().find("modeld") != std::string::npos);
  r = handle(Request{"POST", "/v1/deployments/d1/cancel", ""}, stranger, e, m.access());
  require_error(r, 403, "forbidden");
  CHECK(e.starts == 0);
  CHECK(e.cancels == 0);
  REQUIRE(m.asked.size() == 2);
  CHECK(m.asked[0] == std::pair<uid_t, std::string>{1001, "modeld"});
}

TEST_CASE("a non-member may still read") {
  FakeControl e;
  CHECK(call(e, "GET", "/v1/status", "", stranger).status == 200);
  CHECK(call(e, "GET", "/v1/deployments", "", stranger).status == 200);
  CHECK(call(e, "GET", "/v1/models", "", stranger).status == 200);
}

TEST_CASE("deploying an unknown model is 404 unknown_model") {
  FakeControl e;
  require_error(call(e, "POST", "/v1/deployments", R"({"model": "nope"})"), 404, "unknown_model");
}

// Only the route's mapping of the error (planted in FakeControl) to 409 and its code; the real rule is
// tested against the real Deployer in tests/unit/deploy/deployer_test.cpp: "a deploy while another deployment runs is refused as deployment_running naming it and its phase".
TEST_CASE("deploying while one runs is 409 deployment_running") {
  FakeControl e;
  e.deployments.push_back(make_deployment("d1", "llama", deploy::State::running));
  require_error(call(e, "POST", "/v1/deployments", R"({"model": "kimi-k2-5"})"), 409,
                "deployment_running");
}

TEST_CASE("malformed deploy bodies are 400 bad_request with a message naming the problem") {
  FakeControl e;
  struct Case {
    const char* body;
    const char* mentions;
  };
  auto c = GENERATE(Case{"{\"model\": ", "not valid JSON"},
                    Case{"", "empty"},
                    Case{"[\"llama\"]", "JSON object"},
                    Case{R"({"model": 7})", "\"model\" must be a string"},
                    Case{R"({"model": "llama", "allow_downtime": "yes"})",
                         "\"allow_downtime\" must be true or false"},
                    Case{R"({"model": "llama", "allow_dowtime": true})",
                         "unknown field \"allow_dowtime\""},
                    Case{R"({"allow_downtime": true})", "\"model\" is missing"});
  CAPTURE(c.body);
  auto r = call(e, "POST", "/v1/deployments", c.body);
  require_error(r, 400, "bad_request");
  CHECK_THAT(body_of(r)["error"]["message"].get<std::string>(), Catch::Contains(c.mentions));
  CHECK(e.starts == 0);
}

TEST_CASE("the deployment history is newest first and honours ?limit=") {
  FakeControl e;
  e.deployments = {make_deployment("d3", "llama", deploy::State::running),
                   make_deployment("d2", "llama", deploy::State::failed),
                   make_deployment("d1", "llama", deploy::State::succeeded)};
  auto j = body_of(call(e, "GET", "/v1/deployments"));
  REQUIRE(j["deployments"].size() == 3);
  CHECK(j["deployments"][0]["id"] == "d3");
  CHECK(j["deployments"][2]["id"] == "d1");
  j = body_of(call(e, "GET", "/v1/deployments?limit=2"));
  REQUIRE(j["deployments"].size() == 2);
  CHECK(j["deployments"][1]["id"] == "d2");
  for (auto bad : {"0", "-1", "x", "", "2a"}) {
    CAPTURE(bad);
    require_error(call(e, "GET", std::string("/v1/deployments?limit=") + bad), 400, "bad_request");
  }
}

TEST_CASE("one deployment is found by id, and an unknown id is 404 not_found") {
  FakeControl e;
  e.deployments = {make_deployment("20261129T193942Z-llama", "llama", deploy::State::succeeded)};
  auto r = call(e, "GET", "/v1/deployments/20261129T193942Z-llama");
  REQUIRE(r.status == 200);
  CHECK(body_of(r)["state"] == "succeeded");
  require_error(call(e, "GET", "/v1/deployments/nope"), 404, "not_found");
}

TEST_CASE("cancel answers 200 for a running deployment, 409 once ended, 404 when unknown") {
  FakeControl e;
  e.deployments = {make_deployment("d2", "llama", deploy::State::running),
                   make_deployment("d1", "llama", deploy::State::succeeded)};
  auto r = call(e, "POST", "/v1/deployments/d2/cancel");
  REQUIRE(r.status == 200);
  CHECK(body_of(r)["id"] == "d2");
  CHECK(e.deployments[0].cancel_requested);
  require_error(call(e, "POST", "/v1/deployments/d1/cancel"), 409, "deployment_ended");
  require_error(call(e, "POST", "/v1/deployments/d9/cancel"), 404, "not_found");
}

TEST_CASE("unknown routes are 404 not_found and known routes with another method 405") {
  FakeControl e;
  for (auto target : {"/", "/v2/status", "/v1/nothing", "/v1/deployments/d1/pause", "/metrics/x"}) {
    CAPTURE(target);
    require_error(call(e, "GET", target), 404, "not_found");
  }
  auto r = call(e, "DELETE", "/v1/status");
  require_error(r, 405, "bad_request");
  REQUIRE(r.headers.size() == 1);
  CHECK(r.headers[0] == std::pair<std::string, std::string>{"Allow", "GET"});
  require_error(call(e, "PUT", "/v1/deployments"), 405, "bad_request");
  require_error(call(e, "GET", "/v1/deployments/d1/cancel"), 405, "bad_request");
  require_error(call(e, "POST", "/v1/events"), 405, "bad_request");
  require_error(call(e, "POST", "/metrics"), 405, "bad_request");
}

TEST_CASE("GET /v1/events asks the server for an event stream") {
  FakeControl e;
  auto r = call(e, "GET", "/v1/events");
  CHECK(r.event_stream);
  CHECK(r.content_type == "text/event-stream");
  CHECK_FALSE(call(e, "GET", "/v1/status").event_stream);
}

TEST_CASE("an event is framed as event: KIND and data: JSON, one data line per payload line") {
  CHECK(sse_frame("phase", R"({"id":"d1","phase":"downloading"})") ==
        "event: phase\ndata: {\"id\":\"d1\",\"phase\":\"downloading\"}\n\n");
  CHECK(sse_frame("state", "{\n\"a\":1}") == "event: state\ndata: {\ndata: \"a\":1}\n\n");
}

TEST_CASE("typed events become the contract's SSE text, and watcher events none") {
  deploy::Deployment d = make_deployment("d1", "llama", deploy::State::running, deploy::Phase::downloading);
  CHECK(sse_message(deploy::deployment_event(deploy::EventKind::phase, d)) ==
        "event: phase\ndata: {\"id\":\"d1\",\"model\":\"llama\",\"phase\":\"downloading\"}\n\n");
  d.progress.bytes_done = 5;
  d.progress.bytes_total = 10;
  d.progress.files_total = 1;
  d.progress.rate_bytes_per_s = 2.5;
  d.progress.eta_s = 2;
  d.progress.files.push_back({"a.bin", 5, 10, 2.5, std::nullopt, 1});
  CHECK(sse_message(deploy::deployment_event(deploy::EventKind::progress, d)) ==
        "event: progress\ndata: {\"id\":\"d1\",\"model\":\"llama\",\"progress\":{\"bytes_done\":5,"
        "\"bytes_total\":10,\"eta_s\":2.0,\"files\":[{\"bytes_done\":5,\"bytes_total\":10,\"connections\":1,"
        "\"eta_s\":null,\"path\":\"a.bin\",\"rate_bytes_per_s\":2.5}],\"files_done\":0,\"files_total\":1,"
        "\"rate_bytes_per_s\":2.5}}\n\n");
  d.state = deploy::State::failed;
  d.error = make_error(Errc::disk_full, "no room");
  CHECK(sse_message(deploy::deployment_event(deploy::EventKind::state, d)) ==
        "event: state\ndata: {\"error\":{\"code\":\"disk_full\",\"message\":\"no room\"},\"id\":\"d1\","
        "\"model\":\"llama\",\"phase\":\"downloading\",\"state\":\"failed\"}\n\n");
  deploy::Event w;
  w.kind = deploy::EventKind::watcher;
  w.model = "llama";
  w.watcher = deploy::WatchdogStatus{};
  CHECK(sse_message(w).empty());
  CHECK(deploy::to_json(w)["watchdog"]["state"] == "stopped");
}

TEST_CASE("metrics are a valid Prometheus exposition with HELP and TYPE lines") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "ab\"c", "modeld-serve@llama.service", 8000, "x"};
  e.deployments = {make_deployment("d4", "llama", deploy::State::running),
                   make_deployment("d3", "llama", deploy::State::failed),
                   make_deployment("d2", "llama", deploy::State::succeeded),
                   make_deployment("d1", "llama", deploy::State::succeeded)};
  auto r = call(e, "GET", "/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.content_type == "text/plain; version=0.0.4; charset=utf-8");
  const auto& t = r.body;
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_up gauge\nmodeld_up 1\n"));
  CHECK_THAT(t, Catch::Contains("# HELP modeld_deployments_total "));
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_deployments_total counter\n"));
  CHECK_THAT(t, Catch::Contains("modeld_deployments_total{result=\"succeeded\"} 2\n"));
  CHECK_THAT(t, Catch::Contains("modeld_deployments_total{result=\"failed\"} 1\n"));
  CHECK_THAT(t, Catch::Contains("modeld_deployments_total{result=\"rolled_back\"} 0\n"));
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_active_model_info gauge\n"));
  CHECK_THAT(t, Catch::Contains(
                   "modeld_active_model_info{model=\"llama\",commit=\"ab\\\"c\",unit=\"modeld-serve@llama.service\"} 1\n"));
  // Every line is a comment or "name{labels} value", and the text ends with a line feed.
  CHECK(t.back() == '\n');
  std::size_t start = 0;
  while (start < t.size()) {
    auto end = t.find('\n', start);
    auto line = t.substr(start, end - start);
    CAPTURE(line);
    CHECK((line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0 ||
           line.rfind("modeld_", 0) == 0));
    start = end + 1;
  }
}

TEST_CASE("metrics carry the watchdog's counters per model and the last benchmark of each model") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "abc", "modeld-serve@llama.service", 8000, "x"};
  auto older = restarted_watchdog("kimi-k2-5");
  older.last_probe_seconds.reset();
  e.watched = {restarted_watchdog("llama"), older};
  auto bench = [](std::string id, std::string model, double ttft, double rate) {
    auto d = make_deployment(std::move(id), std::move(model), deploy::State::succeeded);
    d.benchmark_ttft_s = ttft;
    d.benchmark_decode_tokens_per_s = rate;
    return d;
  };
  e.deployments = {bench("d3", "llama", 0.125, 80.5), make_deployment("d2", "llama", deploy::State::failed),
                   bench("d1", "llama", 9, 1)};
  const auto t = call(e, "GET", "/metrics").body;
  for (const char* family : {"modeld_watchdog_restarts_total counter", "modeld_watchdog_probe_failures_total counter",
                             "modeld_watchdog_consecutive_failures gauge", "modeld_readiness_probe_seconds gauge",
                             "modeld_benchmark_ttft_seconds gauge", "modeld_benchmark_decode_tokens_per_second gauge"}) {
    CAPTURE(family);
    CHECK_THAT(t, Catch::Contains(std::string("# TYPE ") + family + "\n"));
    CHECK_THAT(t, Catch::Contains(std::string("# HELP ") + std::string(family).substr(0, std::string(family).find(' '))));
  }
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_restarts_total{model=\"llama\"} 3\n"));
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_restarts_total{model=\"kimi-k2-5\"} 3\n"));
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_probe_failures_total{model=\"llama\"} 7\n"));
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_consecutive_failures{model=\"llama\"} 2\n"));
  CHECK_THAT(t, Catch::Contains("modeld_readiness_probe_seconds{model=\"llama\"} 0.25\n"));
  CHECK(t.find("modeld_readiness_probe_seconds{model=\"kimi-k2-5\"}") == std::string::npos);
  // The newest measurement of the model, not an older one.
  CHECK_THAT(t, Catch::Contains("modeld_benchmark_ttft_seconds{model=\"llama\"} 0.125\n"));
  CHECK_THAT(t, Catch::Contains("modeld_benchmark_decode_tokens_per_second{model=\"llama\"} 80.5\n"));
}

TEST_CASE("metrics have one service info series per service and one active model info series") {
  FakeControl e;
  e.in_service = {service("llama", 8000, std::vector<unsigned>{0, 1, 2, 3}), service("kimi-k2-5", 8001, std::nullopt),
                  service("embed", 8002, std::vector<unsigned>{})};
  e.active_model = deploy::Active{"embed", e.in_service[2].commit, e.in_service[2].unit, 8002, "x"};
  const auto t = call(e, "GET", "/metrics").body;
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_service_info gauge\n"));
  CHECK_THAT(t, Catch::Contains("modeld_service_info{model=\"llama\",commit=\"" + std::string(40, 'l') +
                                "\",unit=\"modeld-serve@llama.service\",port=\"8000\",gpu_ids=\"0,1,2,3\"} 1\n"));
  CHECK_THAT(t, Catch::Contains("modeld_service_info{model=\"kimi-k2-5\",commit=\"" + std::string(40, 'k') +
                                "\",unit=\"modeld-serve@kimi-k2-5.service\",port=\"8001\",gpu_ids=\"all\"} 1\n"));
  CHECK_THAT(t, Catch::Contains("port=\"8002\",gpu_ids=\"none\"} 1\n"));
  CHECK_THAT(t, Catch::Contains("modeld_active_model_info{model=\"embed\","));
  std::size_t series = 0, info = 0;
  for (auto at = t.find("\nmodeld_service_info{"); at != std::string::npos; at = t.find("\nmodeld_service_info{", at + 1))
    ++series;
  for (auto at = t.find("\nmodeld_active_model_info{"); at != std::string::npos;
       at = t.find("\nmodeld_active_model_info{", at + 1))
    ++info;
  CHECK(series == 3);
  CHECK(info == 1);
}

TEST_CASE("metrics carry the watchdog series of every watched service, also one the watcher's list leaves out") {
  FakeControl e;
  e.in_service = {service("llama", 8000, std::nullopt), service("kimi-k2-5", 8001, std::nullopt)};
  e.in_service[0].watchdog = restarted_watchdog("llama");
  auto kimi = restarted_watchdog("kimi-k2-5");
  kimi.restarts = 5;
  e.in_service[1].watchdog = kimi;
  e.watched = {restarted_watchdog("llama")};
  const auto t = call(e, "GET", "/metrics").body;
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_restarts_total{model=\"llama\"} 3\n"));
  CHECK_THAT(t, Catch::Contains("modeld_watchdog_restarts_total{model=\"kimi-k2-5\"} 5\n"));
  CHECK_THAT(t, Catch::Contains("modeld_readiness_probe_seconds{model=\"kimi-k2-5\"} 0.25\n"));
  // One series per model: llama is in both lists.
  CHECK(t.find("modeld_watchdog_restarts_total{model=\"llama\"}") ==
        t.rfind("modeld_watchdog_restarts_total{model=\"llama\"}"));
}

TEST_CASE("metrics leave out watchdog and benchmark families when there is nothing to report") {
  FakeControl e;
  const auto t = call(e, "GET", "/metrics").body;
  CHECK(t.find("modeld_watchdog_") == std::string::npos);
  CHECK(t.find("modeld_benchmark_") == std::string::npos);
}

TEST_CASE("metrics leave out the active model info and the service info when nothing serves") {
  FakeControl e;
  auto r = call(e, "GET", "/metrics");
  CHECK(r.body.find("modeld_active_model_info{") == std::string::npos);
  CHECK(r.body.find("modeld_service_info{") == std::string::npos);
  CHECK_THAT(r.body, Catch::Contains("# TYPE modeld_service_info gauge\n"));
}

TEST_CASE("error statuses follow the error codes") {
  CHECK(http_status(Errc::bad_request) == 400);
  CHECK(http_status(Errc::forbidden) == 403);
  CHECK(http_status(Errc::unknown_model) == 404);
  CHECK(http_status(Errc::not_found) == 404);
  CHECK(http_status(Errc::deployment_running) == 409);
  CHECK(http_status(Errc::deployment_ended) == 409);
  CHECK(http_status(Errc::io_error) == 500);
}

TEST_CASE("the real membership check finds primary groups and rejects unknown groups") {
  CHECK(peer_in_group(Peer{0, 0, 0}, "root"));
  CHECK_FALSE(peer_in_group(Peer{0, 0, 0}, "no-such-group-modeld-test"));
  CHECK_FALSE(peer_in_group(Peer{65534, 65534, 0}, "root"));
}
