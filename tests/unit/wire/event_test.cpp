#include "wire/event.hpp"

#include "unit/golden.hpp"
#include "util/json.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace modeld;
using nlohmann::json;

namespace {

// The (event, data) frames of a golden SSE file whose data is one line.
std::vector<std::pair<std::string, std::string>> frames(const char* name) {
  std::ifstream in(test::golden_dir() / "sse" / name);
  std::vector<std::pair<std::string, std::string>> out;
  std::string line, kind;
  int data_lines = 0;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) {
      kind = line.substr(7);
      data_lines = 0;
    } else if (line.rfind("data: ", 0) == 0 && data_lines++ == 0) {
      out.emplace_back(kind, line.substr(6));
    } else if (line.rfind("data: ", 0) == 0) {
      out.pop_back();  // a multi-line payload is no event's JSON
    }
  }
  return out;
}

}  // namespace

TEST_CASE("every golden SSE frame reads as its event and writes back to the same bytes") {
  std::size_t read = 0;
  for (const char* file : {"run.txt", "ends.txt"}) {
    for (const auto& [name, data] : frames(file)) {
      INFO(file << ": " << name << " " << data);
      auto kind = wire::event_kind_from_string(name);
      REQUIRE(kind);
      auto e = wire::event_from_json(*kind, json::parse(data));
      REQUIRE(e.has_value());
      CHECK(util::dump_json(wire::to_json(*e)) == data);
      ++read;
    }
  }
  CHECK(read == 18);  // 13 frames of the run, 5 of the ends (the multi-line payload is none)
}

TEST_CASE("an event reads its fields: a progress without phase is the download's") {
  auto p = wire::event_from_json(wire::EventKind::progress, json::parse(R"({"id":"d1","model":"m","progress":
      {"bytes_done":5,"bytes_total":10,"files_done":0,"files_total":1,"rate_bytes_per_s":2.5,"eta_s":null}})"));
  REQUIRE(p.has_value());
  CHECK(p->id == "d1");
  CHECK(p->model == "m");
  CHECK(p->phase == wire::Phase::downloading);
  CHECK(p->progress.bytes_done == 5);
  CHECK_FALSE(p->warm);
  auto s = wire::event_from_json(wire::EventKind::state, json::parse(
      R"({"id":"d1","model":"m","phase":"launching","state":"failed","error":{"code":"unit_failed","message":"x"}})"));
  REQUIRE(s.has_value());
  CHECK(s->state == wire::State::failed);
  CHECK(s->phase == wire::Phase::launching);
  REQUIRE(s->error);
  CHECK(s->error->code == Errc::unit_failed);
  wire::Event w;
  w.kind = wire::EventKind::watcher;
  w.model = "m";
  w.watcher = wire::WatchdogStatus{};
  w.watcher->restarts = 2;
  auto back = wire::event_from_json(wire::EventKind::watcher, wire::to_json(w));
  REQUIRE(back.has_value());
  REQUIRE(back->watcher);
  CHECK(back->watcher->restarts == 2);
}

TEST_CASE("an event that does not read names why") {
  auto check = [](wire::EventKind kind, const char* data, const char* says) {
    auto e = wire::event_from_json(kind, json::parse(data));
    REQUIRE_FALSE(e.has_value());
    CHECK(e.error().code == Errc::bad_request);
    CHECK_THAT(e.error().message, Catch::StartsWith("event: ") && Catch::Contains(says));
  };
  check(wire::EventKind::phase, R"({"id":"d1","model":"m","phase":"sleeping"})", "unknown name \"sleeping\"");
  check(wire::EventKind::phase, R"({"id":"d1","model":"m"})", "phase");
  check(wire::EventKind::state, R"({"id":"d1","model":"m","phase":"planning","state":7})", "string");
  check(wire::EventKind::phase, R"({"id":1,"model":"m","phase":"planning"})", "string");
  check(wire::EventKind::progress, R"({"id":"d1","model":"m"})", "progress");
  check(wire::EventKind::phase, "[1]", "object");
  CHECK_FALSE(wire::event_kind_from_string("hello"));
  CHECK(wire::event_kind_from_string("state") == wire::EventKind::state);
}

TEST_CASE("GET /v1/deployments reads as its records, newest first") {
  wire::Record a, b;
  a.id = "20260301T100000Z-a";
  a.model = "a";
  a.started_at = "2026-03-01T10:00:00Z";
  b = a;
  b.id = "20260301T090000Z-b";
  b.model = "b";
  b.kind = wire::Kind::pull;
  auto list = wire::deployments_from_json(json{{"deployments", {wire::to_json(a), wire::to_json(b)}}});
  REQUIRE(list.has_value());
  REQUIRE(list->size() == 2);
  CHECK((*list)[0].id == a.id);
  CHECK((*list)[1].kind == wire::Kind::pull);
  CHECK(wire::deployments_from_json(json{{"deployments", json::array()}})->empty());
  auto bad = wire::deployments_from_json(json{{"deployments", {json{{"id", 1}}}}});
  REQUIRE_FALSE(bad.has_value());
  CHECK_THAT(bad.error().message, Catch::StartsWith("deployment record: "));
  auto shape = wire::deployments_from_json(json::array());
  REQUIRE_FALSE(shape.has_value());
  CHECK_THAT(shape.error().message, Catch::StartsWith("deployments: "));
}
