// stopping_old refuses while the old model still serves when the new revision's files are no
// longer the verified ones: nothing is stopped for a launch that would fail.

#include "deploy/stop_old.hpp"

#include "http/client.hpp"
#include "store/store.hpp"

#include "unit/deploy/fake_units.hpp"
#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <filesystem>
#include <fstream>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

const std::string kCommit(40, 'c');

std::shared_ptr<config::Config> two_models() {
  auto c = std::make_shared<config::Config>();
  for (const char* name : {"old", "new"}) {
    config::ModelConfig m;
    m.name = name;
    m.repo = std::string("acme/") + name;
    m.serve.port = 1;
    m.serve.stop_timeout = 1s;
    m.serve.command = {"true"};  // a program systemd finds (/usr/bin/true): the pre-flight passes
    c->models[name] = m;
  }
  return c;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

struct Fixture {
  asio::io_context ioc;
  asio::thread_pool pool{1};
  fs::path dir = fs::temp_directory_path() / ("stop-old-test-" + std::to_string(::getpid()));
  store::Store store{(fs::create_directories(dir), dir)};
  http::Client client{ioc.get_executor(), {}};
  hub::Hub hub{client, "http://127.0.0.1:1"};
  test::FakeUnits units;
  deploy::Services services{two_models(), store, hub, client, client, units, pool};
  deploy::Deployment record;

  // A verified revision of "new" holding config.json.
  Fixture() {
    REQUIRE(store.prepare_revision("new", kCommit).has_value());
    const auto file = store.revision_dir("new", kCommit) / "config.json";
    write_file(file, "{}");
    store::Manifest m;
    m.repo = "acme/new";
    m.revision = "main";
    m.commit = kCommit;
    auto id = store::identity_of(file);
    REQUIRE(id.has_value());
    m.files.push_back(store::ManifestFile{"config.json", 2, "", std::string(40, 'b'), *id});
    REQUIRE(store.write_manifest("new", m).has_value());
    REQUIRE(store.manifest_still_matches("new", kCommit));
    record.model = "new";
    record.commit = kCommit;
    record.phase = deploy::Phase::stopping_old;
  }
  ~Fixture() {
    pool.join();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // The driver's side: the decision to stop lands in the record, as the Deployer records it.
  struct Decisions final : deploy::Decisions {
    deploy::Deployment& record;
    explicit Decisions(deploy::Deployment& r) : record(r) {}
    asio::awaitable<void> commit_chosen(const std::string& c) override {
      record.commit = c;
      co_return;
    }
    asio::awaitable<void> stopping_old() override {
      record.old_stopped = true;
      co_return;
    }
    void progress(const fetch::Progress&) override {}
  };

  Result<void> stopping_old() {
    record.previous = {deploy::ActiveRecord{"old", kCommit, ""}};
    deploy::Run run{.record = record, .model = *services.config->find_model("new")};
    Decisions decisions(record);
    auto stopped = test::run(ioc, deploy::run_stopping_old(services, run, decisions));
    if (!stopped) return stopped.error();
    stop_done_ns = stopped->stop_done_ns;
    return {};
  }
  std::int64_t stop_done_ns = 0;  ///< what the last stopping_old() returned
};

}  // namespace

TEST_CASE("stopping_old refuses before StopUnit when a file of the new revision changed after verifying") {
  Fixture f;
  write_file(f.store.revision_dir("new", kCommit) / "config.json", "{\"x\": 1}");
  auto r = f.stopping_old();
  REQUIRE(!r.has_value());
  CHECK(r.error().code == Errc::checkpoint_incomplete);
  CHECK_THAT(r.error().message, Catch::Contains("changed after their verification") && Catch::Contains("not stopping old"));
  CHECK(f.units.calls.empty());
  CHECK_FALSE(f.record.old_stopped);
}

TEST_CASE("stopping_old stops the old model when the new revision is as verified") {
  Fixture f;
  auto r = f.stopping_old();
  INFO((r ? std::string("ok") : r.error().message));
  CHECK(f.units.calls == std::vector<std::string>{"stop"});
  CHECK(f.record.old_stopped);
}

TEST_CASE("stopping_old returns when nothing of the old model was left, after it asked for the stop") {
  Fixture f;
  const auto before = deploy::wall_clock_ns();
  auto r = f.stopping_old();
  INFO((r ? std::string("ok") : r.error().message));
  REQUIRE(r.has_value());
  CHECK(f.stop_done_ns >= before);
  CHECK(f.stop_done_ns <= deploy::wall_clock_ns());
}
