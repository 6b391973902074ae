// Golden tests of the wire contract (tests/fixtures/golden/README.md): the JSON of every route,
// the SSE frames and the /metrics text, made from the fixed records of golden_records.hpp by the
// routes (handle_async against a fake deploy::Control), compared byte for byte with committed files.
// Taken before issue 26 reshapes where that JSON is made; they must pass unchanged after it.

#include "control/metrics.hpp"
#include "control/routes.hpp"
#include "unit/control/fake_control.hpp"
#include "unit/control/golden_records.hpp"
#include "unit/golden.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <string>

using namespace modeld;
using namespace modeld::control;
using control::test::FakeControl;
namespace g = control::golden;

namespace {

const Peer member{1000, 1000, 4242};
const Peer stranger{1001, 1001, 4343};

Access members_only() {
  Access a;
  a.group = "modeld";
  a.is_member = [](const Peer& p, const std::string&) { return p.uid == 1000; };
  return a;
}

// Asks routes and checks each body against its golden file; keeps one line per request (method,
// target, peer, status, content type, extra headers, file) for api/responses.txt.
struct Transcript {
  std::string index;

  // Answers `method target` with `body` for `peer`; the body is checked against `file` (for JSON
  // with a newline after it), or must be empty when `file` is "-".
  Response ask(FakeControl& e, const std::string& method, const std::string& target, const std::string& file,
               const std::string& body = {}, const Peer& peer = member) {
    auto r = control::test::answer(e, Request{method, target, body}, peer, members_only());
    std::string headers;
    for (const auto& [k, v] : r.headers) headers += fmt::format(" [{}: {}]", k, v);
    index += fmt::format("{} {}{}{} (uid {}) -> {} {}{}{} -> {}\n", method, target, body.empty() ? "" : " ", body,
                         peer.uid, r.status, r.content_type, headers, r.event_stream ? " (event stream)" : "", file);
    if (file == "-") {
      CHECK(r.body.empty());
    } else {
      const bool is_json = r.content_type == "application/json";
      modeld::test::check_golden(file, is_json ? r.body + "\n" : r.body);
    }
    return r;
  }
};

// The deploy::Control with every record of golden_records.hpp: two services, a running deployment.
void make_rich(FakeControl& e) {
  e.known = {"alpha", "beta", "gamma", "delta"};
  e.active_model = g::active();
  e.in_service = g::services();
  e.watched = {g::watchdog("alpha"), g::watchdog("beta")};
  e.deployments = g::history();
  e.configured = g::models();
  e.plan_result = g::plan_fits();
  e.verify_result = g::verify_problems();
  e.remove_result = g::removal_all();
}

// A deploy::Control with nothing in service and no history.
void make_idle(FakeControl& e) { e.known = {"alpha", "beta", "gamma", "delta"}; }

// The running deployment of gamma at its end: succeeded, with its switch, warm and benchmark.
deploy::Deployment gamma_finished() {
  auto d = g::gamma_running();
  d.state = deploy::State::succeeded;
  d.phase = deploy::Phase::benchmarking;
  d.finished_at = "2026-03-01T15:12:00Z";
  d.progress = {5000000000, 5000000000, 6, 6, 0, std::nullopt, {}};
  d.warm = deploy::WarmReport{5000000000, 1000000000, 4000000000, 4999999000};
  d.switch_report = deploy::SwitchReport{12.5, 0, 0.75, 9.5, 2.25};
  d.benchmark_ttft_s = 0.0875;
  d.benchmark_decode_tokens_per_s = 42;
  return d;
}

}  // namespace

TEST_CASE("golden: the read routes answer the fixed records byte for byte") {
  FakeControl e;
  make_rich(e);
  Transcript t;
  t.ask(e, "GET", "/v1/status", "api/status.json");
  t.ask(e, "GET", "/v1/deployments", "api/deployments.json");
  t.ask(e, "GET", "/v1/deployments?limit=3", "api/deployments_limit_3.json");
  for (const auto& d : g::history())
    t.ask(e, "GET", "/v1/deployments/" + d.id, "api/deployment_" + d.id + ".json");
  t.ask(e, "GET", "/v1/models", "api/models.json");
  t.ask(e, "GET", "/v1/models/gamma/plan", "api/plan.json");
  e.plan_result = g::plan_short();
  t.ask(e, "GET", "/v1/models/beta/plan?allow_downtime=false", "api/plan_short.json");
  e.plan_result = g::plan_serving();
  t.ask(e, "GET", "/v1/models/alpha/plan?commit=" + g::kA1, "api/plan_serving.json");
  t.ask(e, "GET", "/v1/events", "-");
  t.ask(e, "GET", "/metrics", "metrics/history.txt");
  FakeControl idle;
  make_idle(idle);
  t.ask(idle, "GET", "/v1/status", "api/status_idle.json");
  t.ask(idle, "GET", "/v1/deployments", "api/deployments_empty.json");
  t.ask(idle, "GET", "/v1/models", "api/models_empty.json");
  t.ask(idle, "GET", "/metrics", "metrics/idle.txt");
  FakeControl failed;  // nothing in service, the last deployment failed
  make_idle(failed);
  failed.deployments = {g::gamma_failed(), g::alpha_rolled_back()};
  t.ask(failed, "GET", "/v1/status", "api/status_failed.json");
  modeld::test::check_golden("api/responses_read.txt", t.index);
}

TEST_CASE("golden: the mutating routes answer the fixed records byte for byte") {
  FakeControl e;
  make_rich(e);
  Transcript t;
  t.ask(e, "POST", "/v1/models/alpha/verify", "api/verify_problems.json");
  e.verify_result = g::verify_clean();
  t.ask(e, "POST", "/v1/models/beta/verify", "api/verify_clean.json");
  t.ask(e, "DELETE", "/v1/models/gamma", "api/rm.json");
  e.remove_result = g::removal_one();
  t.ask(e, "DELETE", "/v1/models/beta?commit=" + g::kB1, "api/rm_commit.json");
  t.ask(e, "POST", "/v1/deployments/20260301T150000Z-gamma/cancel", "api/cancel.json");
  e.deployments.front() = gamma_finished();
  t.ask(e, "GET", "/v1/deployments/20260301T150000Z-gamma", "api/deployment_20260301T150000Z-gamma_finished.json");
  t.ask(e, "GET", "/v1/status", "api/status_finished.json");
  FakeControl idle1, idle2, idle3;
  for (auto* i : {&idle1, &idle2, &idle3}) make_idle(*i);
  t.ask(idle1, "POST", "/v1/deployments", "api/deploy_accepted.json", R"({"model": "alpha", "allow_downtime": true})");
  t.ask(idle2, "POST", "/v1/models/beta/pull", "api/pull_accepted.json", R"({"commit": ")" + g::kB1 + R"("})");
  t.ask(idle3, "POST", "/v1/models/gamma/stop", "api/stop_accepted.json");
  modeld::test::check_golden("api/responses_mutating.txt", t.index);
}

TEST_CASE("golden: refusals and errors answer byte for byte") {
  FakeControl e;
  make_rich(e);
  Transcript t;
  t.ask(e, "GET", "/v1/deployments/nope", "api/error_deployment_not_found.json");
  t.ask(e, "GET", "/v1/deployments?limit=0", "api/error_bad_limit.json");
  t.ask(e, "GET", "/v1/nothing", "api/error_no_route.json");
  t.ask(e, "PUT", "/v1/status", "api/error_method.json");
  t.ask(e, "POST", "/v1/deployments", "api/error_deploy_running.json", R"({"model": "alpha"})");
  t.ask(e, "POST", "/v1/deployments", "api/error_forbidden.json", R"({"model": "alpha"})", stranger);
  t.ask(e, "POST", "/v1/deployments", "api/error_bad_field.json", R"({"model": 1})");
  t.ask(e, "POST", "/v1/deployments", "api/error_unknown_field.json", R"({"model": "alpha", "force": true})");
  t.ask(e, "POST", "/v1/deployments", "api/error_not_json.json", "{model");
  t.ask(e, "POST", "/v1/deployments/20260301T100000Z-alpha/cancel", "api/error_cancel_ended.json");
  t.ask(e, "GET", "/v1/models/gamma/plan?allow_downtime=maybe", "api/error_plan_bad_bool.json");
  t.ask(e, "GET", "/v1/models/gamma/plan?comit=x", "api/error_plan_unknown_query.json");
  t.ask(e, "GET", "/v1/models/omega/plan", "api/error_unknown_model.json");
  t.ask(e, "DELETE", "/v1/models/alpha", "api/error_rm_active.json");
  t.ask(e, "DELETE", "/v1/models/beta?commit=abc", "api/error_rm_bad_commit.json");
  FakeControl idle;
  make_idle(idle);
  t.ask(idle, "POST", "/v1/deployments", "api/error_unknown_model_deploy.json",
        R"({"model": "omega"})");
  modeld::test::check_golden("api/responses_errors.txt", t.index);
}

namespace {

// The SSE messages of one run of gamma, from planning to its end, as the server streams them.
std::string run_frames() {
  using deploy::EventKind;
  using deploy::Phase;
  auto d = g::gamma_running();
  std::string out;
  auto phase = [&](Phase p) {
    d.phase = p;
    out += sse_message(deploy::deployment_event(EventKind::phase, d));
  };
  for (auto p : {Phase::planning, Phase::freeing_disk, Phase::downloading}) phase(p);
  out += sse_message(deploy::deployment_event(EventKind::progress, d));
  d.progress = {5000000000, 5000000000, 6, 6, 0, 0.0, {}};
  out += sse_message(deploy::deployment_event(EventKind::progress, d));
  phase(Phase::verifying);
  phase(Phase::warming);
  d.warm = deploy::WarmReport{5000000000, 1000000000, 4000000000, std::nullopt};
  out += sse_message(deploy::deployment_event(EventKind::progress, d));
  for (auto p : {Phase::stopping_old, Phase::launching, Phase::health_checking, Phase::benchmarking}) phase(p);
  d.state = deploy::State::succeeded;
  out += sse_message(deploy::deployment_event(EventKind::state, d));
  return out;
}

}  // namespace

TEST_CASE("golden: SSE frames of a run, of every end and of a multi-line payload") {
  using deploy::EventKind;
  modeld::test::check_golden("sse/run.txt", run_frames());
  std::string ends;
  for (const auto& d : {g::gamma_failed(), g::alpha_rolled_back(), g::beta_cancelled(), g::gamma_stopped()})
    ends += sse_message(deploy::deployment_event(EventKind::state, d));
  auto warming = g::beta_cancelled();
  warming.state = deploy::State::running;
  warming.warm.reset();
  ends += sse_message(deploy::deployment_event(EventKind::progress, warming));
  ends += sse_frame("phase", "{\"a\":1}\n{\"b\":2}");
  modeld::test::check_golden("sse/ends.txt", ends);
  deploy::Event watcher;
  watcher.kind = EventKind::watcher;
  watcher.model = "alpha";
  watcher.watcher = g::watchdog("alpha");
  CHECK(sse_message(watcher).empty());  // the stream does not carry the watcher's events
}

TEST_CASE("golden: /metrics text of fixed counters") {
  FakeControl e;
  make_rich(e);
  MetricCounters c = counts_from_history(e);
  c.phases["planning"] = {3, 4.5, 1.25};
  c.phases["downloading"] = {2, 3600.125, 1800};
  c.phases["health_checking"] = {1, 95.5, 95.5};
  c.download_bytes = 12345678901;
  c.verification_failures["deployment"] = 1;
  c.verification_failures["verify"] = 2;
  c.reloads["success"] = 4;
  c.reloads["failure"] = 1;
  c.last_reload_ok = false;
  c.switches.observe("beta", 0.5);
  c.switches.observe("beta", 65.25);
  modeld::test::check_golden("metrics/counters.txt", metrics_text(e, c));
}
