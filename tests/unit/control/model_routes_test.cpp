// The plan, verify and rm routes, answered by handle_async() against a fake deploy::Control on an
// io_context, without sockets.

#include "control/hub_reads.hpp"
#include "control/routes.hpp"
#include "unit/control/fake_control.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <optional>

using namespace modeld;
using namespace modeld::control;
using control::test::FakeControl;
using control::test::body_of;
using control::test::require_error;
using nlohmann::json;

namespace {

const Peer root{0, 0, 1};
const Peer member{1000, 1000, 4242};
const Peer stranger{1001, 1001, 4343};

Access members_only() {
  Access a;
  a.group = "modeld";
  a.is_member = [](const Peer& p, const std::string&) { return p.uid == 1000; };
  return a;
}

Response call(FakeControl& e, std::string method, std::string target, const Peer& peer = member,
              std::string body = {}) {
  return control::test::answer(e, Request{std::move(method), std::move(target), std::move(body)}, peer,
                               members_only());
}


deploy::PlanReport sample_plan() {
  deploy::PlanReport p;
  p.model = "llama";
  p.repo = "meta/llama";
  p.revision = "main";
  p.commit = std::string(40, 'a');
  p.files_total = 5;
  p.bytes_total = 1000;
  p.files_to_fetch = 2;
  p.bytes_to_fetch = 600;
  p.bytes_local = 400;
  p.bytes_linkable = 100;
  p.bytes_partial = 50;
  p.bytes_needed = 550;
  p.bytes_free = 10000;
  p.disk_reserve = 9800;
  p.evictions.push_back({"kimi-k2-5", 700, std::string("2026-11-29T19:00:00Z"), true});
  p.fits = true;
  p.allow_downtime = true;
  p.active_model = "kimi-k2-5";
  p.rollback_possible = false;
  return p;
}

}  // namespace

TEST_CASE("a plan is answered with every number, the evictions and whether rollback stays possible") {
  FakeControl e;
  e.plan_result = sample_plan();
  auto r = call(e, "GET", "/v1/models/llama/plan?allow_downtime=true", stranger);
  REQUIRE(r.status == 200);
  CHECK(e.asked == std::vector<std::string>{"plan llama true"});
  auto j = body_of(r);
  CHECK(j["commit"] == std::string(40, 'a'));
  CHECK(j["files_to_fetch"] == 2);
  CHECK(j["bytes_to_fetch"] == 600);
  CHECK(j["bytes_local"] == 400);
  CHECK(j["bytes_linkable"] == 100);
  CHECK(j["bytes_partial"] == 50);
  CHECK(j["bytes_needed"] == 550);
  CHECK(j["bytes_free"] == 10000);
  CHECK(j["disk_reserve"] == 9800);
  CHECK(j["evictions"] == json::array({{{"name", "kimi-k2-5"}, {"bytes", 700},
                                        {"last_active", "2026-11-29T19:00:00Z"}, {"active", true}}}));
  CHECK(j["fits"] == true);
  CHECK(j["rollback_possible"] == false);
  CHECK(j["active_model"] == "kimi-k2-5");
}

TEST_CASE("plan is a read route and defaults to no downtime") {
  FakeControl e;
  auto r = call(e, "GET", "/v1/models/kimi-k2-5/plan", stranger);
  CHECK(r.status == 200);
  CHECK(e.asked == std::vector<std::string>{"plan kimi-k2-5 false"});
}

TEST_CASE("plan of an unknown or invalid model name is 404 unknown_model") {
  FakeControl e;
  require_error(call(e, "GET", "/v1/models/nope/plan"), 404, "unknown_model");
  require_error(call(e, "GET", "/v1/models/..%2Fetc/plan"), 404, "not_found");
  require_error(call(e, "GET", "/v1/models/UPPER/plan"), 404, "unknown_model");
  CHECK(e.asked == std::vector<std::string>{"plan nope false"});
}

TEST_CASE("a plan the Hub cannot answer is an error naming the Hub's code") {
  FakeControl e;
  e.plan_result = make_error(Errc::hub_unavailable, "listing meta/llama at main: 503 after 4 tries");
  auto r = call(e, "GET", "/v1/models/llama/plan");
  require_error(r, 500, "hub_unavailable");
  CHECK(body_of(r)["error"]["message"] == "listing meta/llama at main: 503 after 4 tries");
}

TEST_CASE("a malformed allow_downtime is 400 and the control is not asked") {
  FakeControl e;
  require_error(call(e, "GET", "/v1/models/llama/plan?allow_downtime=maybe"), 400, "bad_request");
  CHECK(e.asked.empty());
}

TEST_CASE("the model routes answer 405 with Allow for other methods") {
  FakeControl e;
  auto r = call(e, "POST", "/v1/models/llama/plan");
  CHECK(r.status == 405);
  CHECK(r.headers == std::vector<std::pair<std::string, std::string>>{{"Allow", "GET"}});
  CHECK(call(e, "GET", "/v1/models/llama/verify").status == 405);
  CHECK(call(e, "GET", "/v1/models/llama").status == 405);
  CHECK(e.asked.empty());
}

TEST_CASE("verify and rm are refused 403 to a peer that is neither root nor a member") {
  FakeControl e;
  require_error(call(e, "POST", "/v1/models/llama/verify", stranger), 403, "forbidden");
  require_error(call(e, "DELETE", "/v1/models/llama", stranger), 403, "forbidden");
  CHECK(e.asked.empty());
  CHECK(call(e, "POST", "/v1/models/llama/verify", root).status == 200);
  CHECK(call(e, "DELETE", "/v1/models/llama", root).status == 200);
}

TEST_CASE("a clean verify reports ok and an empty problem list") {
  FakeControl e;
  e.verify_result = deploy::VerifyReport{"llama", std::string(40, 'b'), 5, 1000, {}};
  auto j = body_of(call(e, "POST", "/v1/models/llama/verify"));
  CHECK(j == json{{"model", "llama"}, {"commit", std::string(40, 'b')}, {"files", 5}, {"bytes", 1000},
                  {"ok", true}, {"problems", json::array()}});
}

TEST_CASE("verify lists each problem with its file, tensor and code") {
  FakeControl e;
  deploy::VerifyReport rep{"llama", "c", 2, 10, {}};
  rep.problems.push_back({"checksum_mismatch", "model-00001.safetensors", "", "model-00001.safetensors: sha256 ..."});
  rep.problems.push_back({"checkpoint_incomplete", "model-00002.safetensors", "w.2",
                          "model-00002.safetensors: tensor 'w.2': ..."});
  e.verify_result = rep;
  auto r = call(e, "POST", "/v1/models/llama/verify");
  REQUIRE(r.status == 200);
  auto j = body_of(r);
  CHECK(j["ok"] == false);
  REQUIRE(j["problems"].size() == 2);
  CHECK(j["problems"][0]["file"] == "model-00001.safetensors");
  CHECK(j["problems"][0]["tensor"].is_null());
  CHECK(j["problems"][0]["code"] == "checksum_mismatch");
  CHECK(j["problems"][1]["tensor"] == "w.2");
}

// Only the route's mapping of the error (planted in FakeControl) to 409 and its code; the real rule is
// tested against the real Deployer in tests/unit/deploy/deployer_test.cpp: "verify, and rm of the model deployed, during a deployment are refused as deployment_running".
TEST_CASE("verify while a deployment runs is 409 deployment_running, and of a model not on disk 404") {
  FakeControl e;
  e.verify_result = make_error(Errc::deployment_running, "deployment d1 of llama is running");
  require_error(call(e, "POST", "/v1/models/llama/verify"), 409, "deployment_running");
  e.verify_result = make_error(Errc::not_found, "model llama has no verified revision on disk");
  require_error(call(e, "POST", "/v1/models/llama/verify"), 404, "not_found");
  require_error(call(e, "POST", "/v1/models/ghost/verify"), 404, "unknown_model");
}

TEST_CASE("rm answers what it deleted") {
  FakeControl e;
  e.remove_result = deploy::Removal{"llama", 4096, {"c1", "c2"}};
  auto r = call(e, "DELETE", "/v1/models/llama");
  REQUIRE(r.status == 200);
  CHECK(body_of(r) == json{{"model", "llama"}, {"bytes_freed", 4096}, {"commits", {"c1", "c2"}}});
  CHECK(e.asked == std::vector<std::string>{"remove llama"});
}

// Only the route's mapping of the error (planted in FakeControl) to 409 and its code; the real rule is
// tested against the real Deployer in tests/unit/deploy/deployer_test.cpp: "rm of the model in service is refused as model_active and deletes nothing".
TEST_CASE("rm of the active model is 409 model_active naming it") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "abc", "modeld-serve@llama.service", 8000, "2026-11-29T19:00:00Z"};
  auto r = call(e, "DELETE", "/v1/models/llama");
  require_error(r, 409, "model_active");
  CHECK(body_of(r)["error"]["message"].get<std::string>().find("llama") != std::string::npos);
}

// Only the route's mapping of the error (planted in FakeControl) to 409 and its code; the real rule is
// tested against the real Deployer in tests/unit/deploy/deployer_test.cpp: "verify, and rm of the model deployed, during a deployment are refused as deployment_running".
TEST_CASE("rm of a model a running deployment uses is 409 deployment_running, of an unknown one 404") {
  FakeControl e;
  e.remove_result = make_error(Errc::deployment_running, "deployment d1 of llama is running");
  require_error(call(e, "DELETE", "/v1/models/llama"), 409, "deployment_running");
  require_error(call(e, "DELETE", "/v1/models/ghost"), 404, "unknown_model");
}

TEST_CASE("a pull starts a record of kind pull and answers 202 with it") {
  FakeControl e;
  auto r = call(e, "POST", "/v1/models/llama/pull");
  REQUIRE(r.status == 202);
  CHECK(body_of(r)["kind"] == "pull");
  CHECK(body_of(r)["model"] == "llama");
  REQUIRE(e.deployments.size() == 1);
  CHECK(e.deployments[0].kind == deploy::Kind::pull);
  CHECK_FALSE(e.deployments[0].commit);
}

TEST_CASE("a pull of a commit passes it on, and a body that is not {commit} is 400") {
  FakeControl e;
  const std::string c(40, 'b');
  auto r = call(e, "POST", "/v1/models/llama/pull", member, R"({"commit": ")" + c + R"("})");
  REQUIRE(r.status == 202);
  REQUIRE(e.deployments.size() == 1);
  CHECK(e.deployments[0].commit == c);
  require_error(call(e, "POST", "/v1/models/llama/pull", member, R"({"commit": "main"})"), 400, "bad_request");
  require_error(call(e, "POST", "/v1/models/llama/pull", member, R"({"revision": "main"})"), 400, "bad_request");
  require_error(call(e, "POST", "/v1/models/llama/pull", member, "[1]"), 400, "bad_request");
  CHECK(e.deployments.size() == 1);
}

TEST_CASE("a plan of a commit passes it on and answers already_serving, a bad commit is 400") {
  FakeControl e;
  e.plan_result = sample_plan();
  e.plan_result->already_serving = true;
  const std::string c(40, 'c');
  auto r = call(e, "GET", "/v1/models/llama/plan?commit=" + c, stranger);
  REQUIRE(r.status == 200);
  CHECK(e.asked == std::vector<std::string>{"plan llama false " + c});
  CHECK(body_of(r)["already_serving"] == true);
  require_error(call(e, "GET", "/v1/models/llama/plan?commit=main"), 400, "bad_request");
  CHECK(e.asked.size() == 1);
}

TEST_CASE("a pull is refused 403 to a stranger, 404 for an unknown model, 405 for GET, 409 while a record runs") {
  FakeControl e;
  require_error(call(e, "POST", "/v1/models/llama/pull", stranger), 403, "forbidden");
  CHECK(e.starts == 0);
  CHECK(call(e, "POST", "/v1/models/llama/pull", root).status == 202);
  require_error(call(e, "POST", "/v1/models/ghost/pull"), 404, "unknown_model");
  auto get = call(e, "GET", "/v1/models/llama/pull");
  CHECK(get.status == 405);
  CHECK(get.headers == std::vector<std::pair<std::string, std::string>>{{"Allow", "POST"}});
  // The pull runs: a deploy and another pull are refused (the real rule: deployer_test.cpp).
  require_error(call(e, "POST", "/v1/models/kimi-k2-5/pull"), 409, "deployment_running");
}

TEST_CASE("a stop asks the control to stop that model and answers 202 with the record of kind stop") {
  FakeControl e;
  auto r = call(e, "POST", "/v1/models/llama/stop");
  REQUIRE(r.status == 202);
  const auto j = body_of(r);
  CHECK(j["kind"] == "stop");
  CHECK(j["model"] == "llama");
  CHECK(j["id"] == "stop-llama");
  CHECK(e.stops == std::vector<std::string>{"llama"});
  CHECK(e.starts == 0);  // a stop is no deployment the control starts
}

TEST_CASE("a stop is refused 403 to a stranger, 404 for an unknown model, 405 for GET, 409 while a record runs") {
  FakeControl e;
  require_error(call(e, "POST", "/v1/models/llama/stop", stranger), 403, "forbidden");
  CHECK(e.stops.empty());
  auto get = call(e, "GET", "/v1/models/llama/stop");
  CHECK(get.status == 405);
  CHECK(get.headers == std::vector<std::pair<std::string, std::string>>{{"Allow", "POST"}});
  CHECK(e.stops.empty());
  require_error(call(e, "POST", "/v1/models/ghost/stop"), 404, "unknown_model");
  CHECK(call(e, "POST", "/v1/models/llama/stop", root).status == 202);
  // The stop runs: another stop is refused as a deploy would be. The 409 here is FakeControl's; the
  // real rule is tested against the real Deployer in tests/unit/deploy/deployer_test.cpp: "a stop
  // while a deployment runs is refused as deployment_running even for a model not in service" and
  // "a deploy or a pull or a stop or a verify while a stop runs is refused as deployment_running".
  require_error(call(e, "POST", "/v1/models/kimi-k2-5/stop"), 409, "deployment_running");
  CHECK(e.stops == std::vector<std::string>{"ghost", "llama", "kimi-k2-5"});
}

TEST_CASE("rm with ?commit= removes that revision, refuses the one in service and a malformed commit") {
  FakeControl e;
  const std::string c(40, 'c');
  e.remove_result = deploy::Removal{"llama", 10, {c}};
  auto r = call(e, "DELETE", "/v1/models/llama?commit=" + c);
  REQUIRE(r.status == 200);
  CHECK(body_of(r) == json{{"model", "llama"}, {"bytes_freed", 10}, {"commits", {c}}});
  CHECK(e.asked == std::vector<std::string>{"remove llama " + c});
  require_error(call(e, "DELETE", "/v1/models/llama?commit=main"), 400, "bad_request");
  CHECK(e.asked.size() == 1);
  e.active_model = deploy::Active{"llama", c, "modeld-serve@llama.service", 8000, "2026-11-29T19:00:00Z"};
  require_error(call(e, "DELETE", "/v1/models/llama?commit=" + c), 409, "model_active");
}

TEST_CASE("a misspelt or repeated query parameter on a route that changes something is 400 naming it, and nothing is done") {
  FakeControl e;
  const std::string c(40, 'c');
  e.remove_result = deploy::Removal{"llama", 10, {c}};
  auto misspelt = call(e, "DELETE", "/v1/models/llama?comit=" + c);
  require_error(misspelt, 400, "bad_request");
  CHECK_THAT(body_of(misspelt)["error"]["message"].get<std::string>(),
             Catch::Contains("\"comit\"") && Catch::Contains("known: commit"));
  require_error(call(e, "DELETE", "/v1/models/llama?Commit=" + c), 400, "bad_request");
  require_error(call(e, "DELETE", "/v1/models/llama?commit=" + c + "&commit=" + std::string(40, 'd')), 400,
                "bad_request");
  CHECK(e.asked.empty());  // neither the model nor a revision was removed
  require_error(call(e, "GET", "/v1/models/llama/plan?comit=" + c), 400, "bad_request");
  require_error(call(e, "POST", "/v1/models/llama/verify?fix=true"), 400, "bad_request");
  require_error(call(e, "POST", "/v1/models/llama/pull?commit=" + c), 400, "bad_request");
  require_error(call(e, "POST", "/v1/models/llama/stop?force=true"), 400, "bad_request");
  CHECK(e.asked.empty());
  CHECK(e.stops.empty());
  e.known = {"llama"};
  require_error(call(e, "POST", "/v1/deployments?allow_downtime=true", member, R"({"model":"llama"})"), 400,
                "bad_request");
  CHECK(e.starts == 0);
  e.deployments.push_back(control::test::make_deployment("d1", "llama", deploy::State::running));
  require_error(call(e, "POST", "/v1/deployments/d1/cancel?now=1"), 400, "bad_request");
  CHECK(e.cancels == 0);
  // The parameters a route knows still pass, and an empty query part is no parameter.
  CHECK(call(e, "DELETE", "/v1/models/llama?commit=" + c + "&").status == 200);
}

TEST_CASE("a stop's body is empty or {}: a field there is 400 naming it and no stop starts") {
  FakeControl e;
  e.known = {"llama"};
  auto r = call(e, "POST", "/v1/models/llama/stop", member, R"({"force": true})");
  require_error(r, 400, "bad_request");
  CHECK_THAT(body_of(r)["error"]["message"].get<std::string>(), Catch::Contains("\"force\""));
  require_error(call(e, "POST", "/v1/models/llama/stop", member, "[1]"), 400, "bad_request");
  CHECK(e.stops.empty());
  CHECK(call(e, "POST", "/v1/models/llama/stop", member, "{}").status == 202);
  CHECK(e.stops == std::vector<std::string>{"llama"});
}

TEST_CASE("handle_async answers the other routes as handle does") {
  FakeControl e;
  auto r = call(e, "GET", "/v1/status");
  CHECK(r.status == 200);
  CHECK(body_of(r)["daemon"]["version"] == MODELD_VERSION);
  require_error(call(e, "GET", "/v1/models/llama/other"), 404, "not_found");
  require_error(call(e, "GET", "/v1/models/llama/plan/x"), 404, "not_found");
}

TEST_CASE("plans in progress are bounded per user and in all, with a reserve for root and the group") {
  boost::asio::io_context io;
  FakeControl e;
  e.plan_result = sample_plan();
  e.plan_gate = std::make_shared<boost::asio::steady_timer>(io, std::chrono::hours(1));
  HubReads reads(HubReadLimits{2, 3, 1});
  const Access access = members_only();
  const Peer other{1002, 1002, 4444};
  std::vector<std::optional<Response>> out(7);
  auto ask = [&](std::size_t i, const Peer& peer) {
    boost::asio::co_spawn(io, handle_async(Request{"GET", "/v1/models/llama/plan", {}}, peer, e, access, &reads),
                          [&out, i](std::exception_ptr ex, Response r) {
                            REQUIRE_FALSE(ex);
                            out[i] = std::move(r);
                          });
    io.poll();
  };
  ask(0, stranger);
  ask(1, stranger);
  ask(2, stranger);  // a third of the same user: refused at once
  ask(3, other);     // 3 in all now
  ask(4, other);     // all of the unprivileged share is taken
  ask(5, root);      // the reserve
  ask(6, member);    // the reserve is taken too
  CHECK(reads.in_progress() == 4);
  for (std::size_t i : {0, 1, 3, 5}) CHECK_FALSE(out[i]);
  for (std::size_t i : {2, 4, 6}) {
    REQUIRE(out[i]);
    require_error(*out[i], 429, "too_many_requests");
    CHECK(std::find(out[i]->headers.begin(), out[i]->headers.end(), std::pair<std::string, std::string>{"Retry-After", "1"}) !=
          out[i]->headers.end());
  }
  CHECK(body_of(*out[2])["error"]["message"].get<std::string>().find("uid 1001 has 2 requests") != std::string::npos);
  CHECK(body_of(*out[4])["error"]["message"].get<std::string>().find("3 requests that list the Hub") != std::string::npos);

  e.plan_gate->cancel();
  io.run();
  for (std::size_t i : {0, 1, 3, 5}) {
    REQUIRE(out[i]);
    CHECK(out[i]->status == 200);
  }
  CHECK(reads.in_progress() == 0);
  ask(0, stranger);  // places are given back
  io.run();
  CHECK(out[0]->status == 200);
}
