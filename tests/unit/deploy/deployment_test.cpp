#include "deploy/deployment.hpp"
#include "deploy/record_file.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

using namespace modeld;
using namespace modeld::deploy;

TEST_CASE("phase and state names are the contract's") {
  CHECK(to_string(Phase::freeing_disk) == "freeing_disk");
  CHECK(to_string(Phase::health_checking) == "health_checking");
  CHECK(to_string(Phase::rolling_back) == "rolling_back");
  CHECK(to_string(State::rolled_back) == "rolled_back");
  CHECK(phase_from_string("stopping_old") == Phase::stopping_old);
  CHECK_FALSE(phase_from_string("stopping"));
  CHECK_FALSE(state_from_string("done"));
}

TEST_CASE("a deployment's JSON carries every field of the contract's DEPLOYMENT") {
  Deployment d;
  d.id = "20261129T193942Z-kimi";
  d.model = "kimi";
  d.started_at = "2026-11-29T19:39:42Z";
  auto j = to_json(d);
  for (const char* key : {"id", "model", "commit", "phase", "state", "progress", "error", "started_at",
                          "finished_at", "benchmark"})
    CHECK(j.contains(key));
  for (const char* key : {"bytes_done", "bytes_total", "files_done", "files_total", "rate_bytes_per_s", "eta_s"})
    CHECK(j["progress"].contains(key));
  CHECK(j["commit"].is_null());
  CHECK(j["error"].is_null());
  CHECK(j["progress"]["eta_s"].is_null());
  CHECK(j["phase"] == "planning");
  CHECK(j["state"] == "running");
  CHECK_FALSE(j.contains("old_stopped"));
}

TEST_CASE("a deployment written with its bookkeeping reads back the same") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.commit = std::string(40, 'a');
  d.phase = Phase::launching;
  d.state = State::rolled_back;
  d.progress.bytes_done = 5;
  d.progress.bytes_total = 10;
  d.progress.eta_s = 3.5;
  d.error = Error{Errc::readiness_timeout, "not ready"};
  d.started_at = "2026-11-29T19:39:42Z";
  d.finished_at = "2026-11-29T19:40:42Z";
  d.previous = {ActiveRecord{"old", std::string(40, 'b'), "2026-11-29T19:00:00Z"}};
  d.old_stopped = true;
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  CHECK(back->commit == d.commit);
  CHECK(back->phase == Phase::launching);
  CHECK(back->state == State::rolled_back);
  CHECK(back->progress.eta_s == 3.5);
  CHECK(back->error->code == Errc::readiness_timeout);
  REQUIRE(back->previous.size() == 1);
  CHECK(back->previous.front().model == "old");
  CHECK(back->previous.front().commit == std::string(40, 'b'));
  CHECK(back->old_stopped);
}

TEST_CASE("a record keeps every service it stops, in order, and reads the one of a record written before the list") {
  Deployment d;
  d.id = "x";
  d.model = "d";
  d.started_at = "2026-11-29T19:39:42Z";
  d.previous = {ActiveRecord{"a", std::string(40, 'a'), "s1"}, ActiveRecord{"b", std::string(40, 'b'), "s2"}};
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  REQUIRE(back->previous.size() == 2);
  CHECK(back->previous[0].model == "a");
  CHECK(back->previous[1].model == "b");
  CHECK(back->previous[1].since == "s2");
  auto older = record_file_json(d);
  older.erase("previous");
  older["previous_model"] = "old";
  older["previous_commit"] = std::string(40, 'c');
  older["previous_started"] = to_json(StartedSettings{{"srv"}, {}, "/m/old", 0});
  auto read = record_from_file_json(older);
  REQUIRE(read.has_value());
  REQUIRE(read->previous.size() == 1);
  CHECK(read->previous.front().model == "old");
  CHECK(read->previous.front().commit == std::string(40, 'c'));
  REQUIRE(read->previous.front().started);
  CHECK(read->previous.front().started->working_directory == "/m/old");
}

TEST_CASE("a malformed deployment record is refused with a message") {
  auto r = record_from_file_json(nlohmann::json{{"id", "x"}});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::bad_request);
  auto bad_phase = nlohmann::json::parse(R"({"id":"x","model":"m","commit":null,"phase":"dancing","state":"running",
    "progress":{"bytes_done":0,"bytes_total":0,"files_done":0,"files_total":0,"rate_bytes_per_s":0,"eta_s":null},
    "error":null,"started_at":"","finished_at":null})");
  CHECK_FALSE(record_from_file_json(bad_phase).has_value());
}

TEST_CASE("a malformed deployment record's message names the field") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  d.benchmark_ttft_s = 0.5;
  d.benchmark_decode_tokens_per_s = 40;
  auto good = record_file_json(d);
  auto message = [&](auto change) {
    auto j = good;
    change(j);
    auto r = record_from_file_json(j);
    return r ? std::string("(read)") : r.error().message;
  };
  CHECK(message([](auto&) {}) == "(read)");
  CHECK(message([](auto& j) { j.erase("model"); }) ==
        "deployment record: [json.exception.out_of_range.403] key 'model' not found");
  CHECK(message([](auto& j) { j["progress"].erase("eta_s"); }) ==
        "deployment record: [json.exception.out_of_range.403] key 'eta_s' not found");
  CHECK(message([](auto& j) { j["benchmark"].erase("ttft_s"); }) ==
        "deployment record: [json.exception.out_of_range.403] key 'ttft_s' not found");
  CHECK(message([](auto& j) { j["phase"] = "dancing"; }) == "deployment record: unknown phase \"dancing\"");
  CHECK(message([](auto& j) { j["state"] = "done"; }) == "deployment record: unknown state \"done\"");
  CHECK(message([](auto& j) { j["kind"] = "teleport"; }) == "deployment record: unknown kind \"teleport\"");
  CHECK(message([](auto& j) { j["switch_marks"] = 3; }) ==
        "deployment record: [json.exception.type_error.302] expected an object, not number");
  CHECK(message([](auto& j) { j["old_stopped"] = "yes"; }) ==
        "deployment record: [json.exception.type_error.302] type must be boolean, but is string");
  auto back = record_from_file_json(good);
  REQUIRE(back.has_value());
  CHECK(back->benchmark_ttft_s == 0.5);
  CHECK(back->benchmark_decode_tokens_per_s == 40);
}

TEST_CASE("error objects use the stable snake_case code") {
  auto j = to_json(Error{Errc::deployment_running, "busy"});
  CHECK(j["code"] == "deployment_running");
  CHECK(j["message"] == "busy");
}

TEST_CASE("the files in flight appear under progress.files with their own rate and ETA") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  d.progress.files.push_back(FileProgress{"model-00001-of-00002.safetensors", 100, 400, 50.0, 6.0, 3});
  d.progress.files.push_back(FileProgress{"config.json", 0, 10, 0.0, std::nullopt, 1});
  auto j = to_json(d);
  REQUIRE(j["progress"]["files"].size() == 2);
  const auto& f = j["progress"]["files"][0];
  CHECK(f["path"] == "model-00001-of-00002.safetensors");
  CHECK(f["bytes_done"] == 100);
  CHECK(f["bytes_total"] == 400);
  CHECK(f["rate_bytes_per_s"] == 50.0);
  CHECK(f["eta_s"] == 6.0);
  CHECK(f["connections"] == 3);
  CHECK(j["progress"]["files"][1]["eta_s"].is_null());
}

TEST_CASE("a record keeps its kind, shown in the API, and whether its cleanup began, and one without them is a deploy not cleaning up") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  d.cleanup_begun = true;
  auto j = record_file_json(d);
  CHECK(j["kind"] == "deploy");
  CHECK(to_json(d)["kind"] == "deploy");  // the API's DEPLOYMENT names it (issue 15: pull records)
  CHECK_FALSE(to_json(d).contains("cleanup_begun"));  // internal
  auto back = record_from_file_json(j);
  REQUIRE(back.has_value());
  CHECK(back->kind == Kind::deploy);
  CHECK(back->cleanup_begun);
  j.erase("kind");
  j.erase("cleanup_begun");
  auto old = record_from_file_json(j);
  REQUIRE(old.has_value());
  CHECK(old->kind == Kind::deploy);
  CHECK_FALSE(old->cleanup_begun);
  j["kind"] = "teleport";
  CHECK_FALSE(record_from_file_json(j).has_value());
}

TEST_CASE("a record keeps whether it changed anything, its warming and its switch, and older records read as changed with neither") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  d.changed = false;
  d.warm = WarmReport{100, 40, 60, std::nullopt};
  d.switch_report = SwitchReport{12.5, 4, 1, 2.5, 5};
  auto j = to_json(d);
  CHECK(j["changed"] == false);
  CHECK(j["warm"]["bytes_warmed"] == 60);
  CHECK(j["warm"]["bytes_resident_at_launch"].is_null());
  CHECK(j["switch"]["downtime_s"] == 12.5);
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  CHECK_FALSE(back->changed);
  REQUIRE(back->warm);
  CHECK(back->warm->bytes_resident_before == 40);
  CHECK_FALSE(back->warm->bytes_resident_at_launch);
  REQUIRE(back->switch_report);
  CHECK(back->switch_report->port_to_ready_s == 5);
  auto old = record_file_json(d);
  old.erase("changed");
  old.erase("warm");
  old.erase("switch");
  auto older = record_from_file_json(old);
  REQUIRE(older.has_value());
  CHECK(older->changed);
  CHECK_FALSE(older->warm);
  CHECK_FALSE(older->switch_report);
}

TEST_CASE("a switch's report runs from the stop request to ready, its parts between the marks") {
  constexpr std::int64_t s = 1'000'000'000;
  SwitchMarks m{100 * s, 104 * s, 105 * s, 227 * s, 232 * s};
  auto r = switch_report_of(m);
  REQUIRE(r);
  CHECK(r->downtime_s == Approx(132));
  CHECK(r->stop_s == Approx(4));
  CHECK(r->launch_s == Approx(1));
  CHECK(r->start_to_port_s == Approx(122));
  CHECK(r->port_to_ready_s == Approx(5));
}

TEST_CASE("with nothing stopped a switch runs from the start request, and without a port mark the load runs to ready") {
  constexpr std::int64_t s = 1'000'000'000;
  auto r = switch_report_of(SwitchMarks{0, 0, 10 * s, 0, 13 * s});
  REQUIRE(r);
  CHECK(r->downtime_s == Approx(3));
  CHECK(r->stop_s == 0);
  CHECK(r->launch_s == 0);
  CHECK(r->start_to_port_s == Approx(3));
  CHECK(r->port_to_ready_s == 0);
}

TEST_CASE("a switch has no report until a start and a ready are marked, and spans backwards read as 0") {
  constexpr std::int64_t s = 1'000'000'000;
  CHECK_FALSE(switch_report_of(SwitchMarks{}));
  CHECK_FALSE(switch_report_of(SwitchMarks{1 * s, 2 * s, 0, 0, 0}));
  CHECK_FALSE(switch_report_of(SwitchMarks{1 * s, 2 * s, 3 * s, 4 * s, 0}));
  // A wall clock set back between two marks.
  auto r = switch_report_of(SwitchMarks{10 * s, 9 * s, 12 * s, 11 * s, 14 * s});
  REQUIRE(r);
  CHECK(r->stop_s == 0);
  CHECK(r->start_to_port_s == 0);
  CHECK(r->downtime_s == Approx(4));
}

TEST_CASE("a record keeps its switch marks as bookkeeping, never in the API, and an older record reads as unmarked") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-01-01T00:00:00Z";
  d.switch_marks = SwitchMarks{1, 2, 3, 4, 5};
  CHECK_FALSE(to_json(d).contains("switch_marks"));
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  CHECK(back->switch_marks.stop_requested_ns == 1);
  CHECK(back->switch_marks.stop_done_ns == 2);
  CHECK(back->switch_marks.start_requested_ns == 3);
  CHECK(back->switch_marks.port_ns == 4);
  CHECK(back->switch_marks.ready_ns == 5);
  auto older = record_from_file_json(to_json(d));
  REQUIRE(older.has_value());
  CHECK(older->switch_marks.ready_ns == 0);
}

TEST_CASE("a record keeps whether a restart was asked for and the previous service's settings, internal fields") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  d.restart = true;
  d.previous = {ActiveRecord{"old", std::string(40, 'b'), "", StartedSettings{{"srv"}, {{"A", "1"}}, "/m/m", 0}}};
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  CHECK(back->restart);
  REQUIRE(back->previous.size() == 1);
  REQUIRE(back->previous.front().started);
  CHECK(*back->previous.front().started == *d.previous.front().started);
  const auto shown = to_json(d);
  CHECK_FALSE(shown.contains("previous"));
  CHECK_FALSE(shown.contains("restart"));
  Deployment plain;
  plain.id = "y";
  plain.model = "m";
  plain.started_at = d.started_at;
  auto older = record_file_json(plain);
  older.erase("restart");
  older.erase("previous");
  auto read = record_from_file_json(older);
  REQUIRE(read.has_value());
  CHECK_FALSE(read->restart);
  CHECK(read->previous.empty());
}

TEST_CASE("an end not logged yet is kept in state_dir's record and never shown by the API") {
  Deployment d;
  d.id = "x";
  d.model = "m";
  d.state = State::succeeded;
  d.started_at = "2026-01-01T00:00:00Z";
  d.end_unlogged = true;
  CHECK(record_file_json(d).at("end_unlogged") == true);
  CHECK_FALSE(to_json(d).contains("end_unlogged"));
  auto back = record_from_file_json(record_file_json(d));
  REQUIRE(back.has_value());
  CHECK(back->end_unlogged);
  d.end_unlogged = false;
  CHECK_FALSE(record_file_json(d).contains("end_unlogged"));  // a logged record's file is unchanged
  auto logged = record_from_file_json(record_file_json(d));
  REQUIRE(logged.has_value());
  CHECK_FALSE(logged->end_unlogged);
}
