#include "deploy/state_store.hpp"
#include "util/json.hpp"

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace modeld;
using namespace modeld::deploy;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("modeld-state-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

Deployment make(const std::string& id) {
  Deployment d;
  d.id = id;
  d.model = "m";
  d.started_at = "2026-11-29T19:39:42Z";
  return d;
}
}  // namespace

TEST_CASE("a fresh state directory has no active model") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  auto st = s.load();
  REQUIRE(st.has_value());
  CHECK_FALSE(st->active);
  CHECK((fs::status(t.path).permissions() & fs::perms::others_all) == fs::perms::none);
}

TEST_CASE("the active model survives a save and a load") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  DaemonState st;
  st.active.put(ActiveRecord{"kimi", std::string(40, 'c'), "2026-11-29T19:39:42Z"});
  st.last_active["old"] = "2026-11-28T10:00:00Z";
  REQUIRE(s.save(st).has_value());
  auto back = StateStore(t.path).load();
  REQUIRE(back.has_value());
  REQUIRE(back->active);
  CHECK(back->active.last()->model == "kimi");
  CHECK(back->last_active.at("old") == "2026-11-28T10:00:00Z");
}

TEST_CASE("a corrupt state file is an error, not an empty state") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  std::ofstream(t.path / "state.json") << "{ not json";
  auto st = s.load();
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().message.find("state.json") != std::string::npos);
}

TEST_CASE("history comes back newest first and is pruned to the limit") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  for (int i = 0; i < 5; ++i) REQUIRE(s.save_deployment(make("2026112" + std::to_string(i) + "T000000Z-m"), 3).has_value());
  auto h = s.load_history(10);
  REQUIRE(h.size() == 3);
  CHECK(h.front().id == "20261124T000000Z-m");
  CHECK(h.back().id == "20261122T000000Z-m");
}

TEST_CASE("deployments started in one second come back in start order, -10 after -9") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  const std::string second = "20261124T101101Z-m";
  std::vector<std::string> ids{"20261124T101100Z-m-3", second};
  for (int i = 2; i <= 12; ++i) ids.push_back(second + "-" + std::to_string(i));
  ids.push_back("20261124T101102Z-m");
  for (const auto& id : ids) REQUIRE(s.save_deployment(make(id), 13).has_value());
  // Pruned to 13: the one of the earlier second went first.
  auto h = s.load_history(100);
  REQUIRE(h.size() == 13);
  std::vector<std::string> got;
  for (const auto& d : h) got.push_back(d.id);
  std::vector<std::string> want(ids.rbegin(), ids.rend() - 1);
  CHECK(got == want);
}

TEST_CASE("an unreadable deployment file is skipped") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  REQUIRE(s.save_deployment(make("a")).has_value());
  std::ofstream(t.path / "deployments" / "b.json") << "garbage";
  auto h = s.load_history(10);
  REQUIRE(h.size() == 1);
  CHECK(h.front().id == "a");
}

TEST_CASE("an error message quoting bytes that are not UTF-8 is saved and read back, not thrown") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  auto d = make("20261129T000000Z-m");
  // A Hub's X-Error-Message, or a health body, quoted as it came.
  d.error = Error{Errc::hub_bad_response, "the Hub answered 401: \xff\xfe not ready"};
  REQUIRE(s.save_deployment(d).has_value());
  auto back = s.load_history(10);
  REQUIRE(back.size() == 1);
  REQUIRE(back[0].error);
  CHECK(back[0].error->message == "the Hub answered 401: \xef\xbf\xbd\xef\xbf\xbd not ready");
  // The API's and events' text of it is valid JSON too.
  CHECK(nlohmann::json::parse(util::dump_json(to_json(d)))["error"]["message"] ==
        "the Hub answered 401: \xef\xbf\xbd\xef\xbf\xbd not ready");
}

TEST_CASE("state.json lists the services in service and keeps the form an older modeld reads") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  DaemonState st;
  st.active.put(ActiveRecord{"kimi", std::string(40, 'c'), "2026-11-29T19:39:42Z"});
  REQUIRE(s.save(st).has_value());
  std::ifstream in(t.path / "state.json");
  auto j = nlohmann::json::parse(in);
  REQUIRE(j["services"].size() == 1);
  CHECK(j["services"][0]["model"] == "kimi");
  CHECK(j["active"]["model"] == "kimi");
  CHECK(j["active"]["commit"] == std::string(40, 'c'));
}

TEST_CASE("a state.json written before the list of services loads its active model") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  std::ofstream(t.path / "state.json")
      << R"({"active": {"model": "old", "commit": "abc", "since": "2026-01-01T00:00:00Z"}, "last_active": {}})";
  auto st = s.load();
  REQUIRE(st.has_value());
  REQUIRE(st->active.services.size() == 1);
  CHECK(st->active.last()->model == "old");
  CHECK(st->active.last()->commit == "abc");
}

TEST_CASE("state.json keeps the settings each service was started with, and one written before them loads without") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  std::ofstream(t.path / "state.json")
      << R"({"services": [{"model": "old", "commit": "abc", "since": "2026-01-01T00:00:00Z"}], "last_active": {}})";
  auto st = s.load();
  REQUIRE(st.has_value());
  REQUIRE(st->active);
  CHECK_FALSE(st->active.last()->started);

  StartedSettings started{{"srv", "--port", "8000"}, {{"VLLM_X", "1"}}, "/m/kimi", 2};
  DaemonState next;
  next.active.put(ActiveRecord{"kimi", std::string(40, 'c'), "2026-11-29T19:39:42Z", started});
  REQUIRE(s.save(next).has_value());
  auto back = s.load();
  REQUIRE(back.has_value());
  REQUIRE(back->active);
  REQUIRE(back->active.last()->started);
  CHECK(*back->active.last()->started == started);
}

TEST_CASE("pulled revisions are kept in state.json, and a file without them loads with none") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  DaemonState st;
  st.pulled["kimi"] = {std::string(40, 'd'), std::string(40, 'e')};
  REQUIRE(s.save(st).has_value());
  auto back = s.load();
  REQUIRE(back.has_value());
  CHECK(back->pulled == st.pulled);
  std::ofstream(t.path / "state.json", std::ios::trunc)
      << R"({"active": null, "services": [], "last_active": {}})";
  back = s.load();
  REQUIRE(back.has_value());
  CHECK(back->pulled.empty());
}

TEST_CASE("several services survive a save and a load in the order they were put into service, the last as active") {
  TempDir t;
  const auto dir = t.path;
  StateStore store(dir);
  REQUIRE(store.init().has_value());
  DaemonState st;
  StartedSettings on_gpus{{"srv"}, {}, "/m/a", 4, 8001, std::vector<unsigned>{0, 1, 2, 3}};
  st.active.put(ActiveRecord{"a", std::string(40, 'a'), "2026-11-29T19:00:00Z", on_gpus});
  st.active.put(ActiveRecord{"b", std::string(40, 'b'), "2026-11-29T20:00:00Z"});
  REQUIRE(store.save(st).has_value());
  auto back = store.load();
  REQUIRE(back.has_value());
  REQUIRE(back->active.services.size() == 2);
  CHECK(back->active.services[0].model == "a");
  CHECK(back->active.last()->model == "b");
  REQUIRE(back->active.find("a"));
  REQUIRE(back->active.find("a")->started);
  CHECK(back->active.find("a")->started->gpu_ids == std::vector<unsigned>{0, 1, 2, 3});
  CHECK(back->active.find("a")->started->port == 8001);
  std::ifstream in(dir / "state.json");
  auto j = nlohmann::json::parse(in);
  CHECK(j["active"]["model"] == "b");
  // Put into service again: it moves to the end, once.
  back->active.put(ActiveRecord{"a", std::string(40, 'c'), "2026-11-29T21:00:00Z"});
  REQUIRE(back->active.services.size() == 2);
  CHECK(back->active.last()->commit == std::string(40, 'c'));
  CHECK(back->active.erase("b"));
  CHECK_FALSE(back->active.erase("b"));
  CHECK(back->active.services.size() == 1);
}

namespace {
DaemonState serving(const std::string& model) {
  DaemonState st;
  st.active.put(ActiveRecord{model, std::string(40, 'c'), "2026-12-02T10:00:00Z"});
  return st;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("a state.json that is not an object of services is refused by name, never read as nothing in service") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  for (const std::string text : {"null", "[]", "{}", "", "{\"services\": [", "{\"services\": {}}", "\x01\x02garbage"}) {
    INFO("state.json: " << text);
    std::ofstream(t.path / "state.json", std::ios::trunc) << text;
    auto st = s.load();
    REQUIRE_FALSE(st.has_value());
    CHECK(st.error().message.find((t.path / "state.json").string() + ": not a valid state file") != std::string::npos);
  }
}

TEST_CASE("every save keeps a copy in state.json.prev, which a start falls back to when state.json is damaged") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  REQUIRE(s.save(serving("a")).has_value());
  REQUIRE(s.save(serving("b")).has_value());
  CHECK(slurp(t.path / "state.json.prev") == slurp(t.path / "state.json"));
  for (const std::string text : {"null", "[]", "", "{\"services\": [{\"model\": "}) {
    INFO("state.json: " << text);
    std::ofstream(t.path / "state.json", std::ios::trunc) << text;
    auto loaded = s.load_or_fall_back();
    CHECK(loaded.source == StateSource::previous);
    REQUIRE(loaded.state.active.last());
    CHECK(loaded.state.active.last()->model == "b");
    REQUIRE(loaded.problems.size() == 1);
    CHECK(loaded.problems[0].find("state.json: not a valid state file") != std::string::npos);
    CHECK(slurp(t.path / "state.json.bad") == text);
  }
}

TEST_CASE("a missing state.json beside its copy falls back to the copy and says so") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  REQUIRE(s.save(serving("a")).has_value());
  fs::remove(t.path / "state.json");
  auto loaded = s.load_or_fall_back();
  CHECK(loaded.source == StateSource::previous);
  REQUIRE(loaded.state.active.find("a"));
  REQUIRE(loaded.problems.size() == 1);
  CHECK(loaded.problems[0].find("missing") != std::string::npos);
}

TEST_CASE("with neither state.json nor its copy readable the state is to be rebuilt, and with neither present it is fresh") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  auto fresh = s.load_or_fall_back();
  CHECK(fresh.source == StateSource::fresh);
  CHECK(fresh.problems.empty());
  std::ofstream(t.path / "state.json") << "[]";
  auto no_copy = s.load_or_fall_back();
  CHECK(no_copy.source == StateSource::rebuilt);
  CHECK_FALSE(no_copy.state.active);
  std::ofstream(t.path / "state.json.prev") << "null";
  auto both_bad = s.load_or_fall_back();
  CHECK(both_bad.source == StateSource::rebuilt);
  CHECK_FALSE(both_bad.state.active);
  CHECK(both_bad.problems.size() == 2);
}

TEST_CASE("a good state.json is what a start uses, whatever its copy holds") {
  TempDir t;
  StateStore s(t.path);
  REQUIRE(s.init().has_value());
  REQUIRE(s.save(serving("a")).has_value());
  std::ofstream(t.path / "state.json.prev", std::ios::trunc) << "garbage";
  auto loaded = s.load_or_fall_back();
  CHECK(loaded.source == StateSource::current);
  REQUIRE(loaded.state.active.find("a"));
  CHECK(loaded.problems.empty());
}
