#include "units/service_manager.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <sys/stat.h>

using namespace modeld;
using namespace modeld::units;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// A service manager whose unit reports `active` until its `inactive_after`-th status() call.
class FakeManager final : public ServiceManager {
 public:
  explicit FakeManager(int inactive_after, std::string final_state = "inactive")
      : inactive_after_(inactive_after), final_state_(std::move(final_state)) {}

  int polls = 0;
  std::optional<Error> status_error;

  asio::awaitable<Result<void>> start(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<void>> stop(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<UnitStatus>> status(const std::string&) override {
    ++polls;
    if (status_error) co_return *status_error;
    UnitStatus st;
    st.loaded = true;
    bool stopped = inactive_after_ > 0 && polls >= inactive_after_;
    st.active_state = parse_active_state(stopped ? final_state_ : "active");
    st.sub_state = stopped ? "dead" : "running";
    co_return st;
  }
  asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string&) override {
    co_return std::vector<std::uint32_t>{};
  }
  asio::awaitable<Result<void>> reset_failed(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string&, const std::string&, const std::string&) override { return {}; }

 private:
  int inactive_after_;  // 0: never
  std::string final_state_;
};

// Runs wait_inactive to completion on a fresh io_context (bounded by a generous deadline).
Result<void> run_wait(ServiceManager& m, std::chrono::milliseconds timeout) {
  asio::io_context ctx;
  std::optional<Result<void>> out;
  asio::co_spawn(ctx, wait_inactive(m, "modeld-serve@x.service", timeout),
                 [&](std::exception_ptr e, Result<void> r) {
                   if (e) std::rethrow_exception(e);
                   out = std::move(r);
                 });
  ctx.run_for(30s);
  REQUIRE(out);
  return *out;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/modeld-units-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("a model's service is an instance of the modeld-serve template") {
  CHECK(serve_unit("kimi-k2-5") == "modeld-serve@kimi-k2-5.service");
  CHECK(serve_unit("qwen3.5_32b") == "modeld-serve@qwen3.5_32b.service");
}

TEST_CASE("a drop-in is written into a new UNIT.d folder with mode 0644, whatever the umask") {
  TempDir tmp;
  auto old_mask = ::umask(077);
  auto r = write_dropin_file(tmp.path, "modeld-serve@x.service", "50-modeld.conf",
                             "[Service]\nEnvironment=A=1\n");
  ::umask(old_mask);
  REQUIRE(r.has_value());
  auto dir = tmp.path / "modeld-serve@x.service.d";
  CHECK(mode_of(dir) == 0755);
  CHECK(mode_of(dir / "50-modeld.conf") == 0644);
  CHECK(slurp(dir / "50-modeld.conf") == "[Service]\nEnvironment=A=1\n");
}

TEST_CASE("writing a drop-in again replaces its content and leaves no temporary file") {
  TempDir tmp;
  REQUIRE(write_dropin_file(tmp.path, "u.service", "a.conf", "old\n").has_value());
  REQUIRE(write_dropin_file(tmp.path, "u.service", "a.conf", "new\n").has_value());
  auto dir = tmp.path / "u.service.d";
  CHECK(slurp(dir / "a.conf") == "new\n");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
}

TEST_CASE("a drop-in name that would leave the UNIT.d folder is refused") {
  TempDir tmp;
  auto r = write_dropin_file(tmp.path, "u.service", "../escape.conf", "x");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::internal);
  CHECK_FALSE(write_dropin_file(tmp.path, "../u.service", "a.conf", "x").has_value());
  CHECK_FALSE(write_dropin_file(tmp.path, "u.service", "", "x").has_value());
  CHECK_FALSE(fs::exists(tmp.path.parent_path() / "escape.conf"));
}

TEST_CASE("a drop-in that cannot be written is an io_error naming the path") {
  TempDir tmp;
  { std::ofstream(tmp.path / "file") << "x"; }
  auto r = write_dropin_file(tmp.path / "file", "u.service", "a.conf", "x");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  CHECK(r.error().message.find((tmp.path / "file").string()) != std::string::npos);
}

TEST_CASE("waiting for a unit that stops after three polls succeeds on the third") {
  FakeManager m(3);
  auto r = run_wait(m, 10s);
  CHECK(r.has_value());
  CHECK(m.polls == 3);
}

TEST_CASE("a failed unit counts as stopped") {
  FakeManager m(1, "failed");
  CHECK(run_wait(m, 10s).has_value());
  CHECK(m.polls == 1);
}

TEST_CASE("a unit that never stops is a stop_timeout naming the unit and its state") {
  FakeManager m(0);
  auto start = std::chrono::steady_clock::now();
  auto r = run_wait(m, 300ms);
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::stop_timeout);
  CHECK(r.error().message.find("modeld-serve@x.service") != std::string::npos);
  CHECK(r.error().message.find("active/running") != std::string::npos);
  CHECK(took >= 300ms);
  CHECK(m.polls >= 2);
}

TEST_CASE("a status error ends the wait with that error") {
  FakeManager m(0);
  m.status_error = make_error(Errc::unit_failed, "modeld-serve@x.service: LoadUnit: no bus");
  auto r = run_wait(m, 10s);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK(m.polls == 1);
}

TEST_CASE("cancelling the wait between polls returns cancelled at once") {
  FakeManager m(0);
  asio::io_context ctx;
  asio::cancellation_signal cancel;
  std::optional<Result<void>> out;
  asio::co_spawn(ctx, wait_inactive(m, "modeld-serve@x.service", 60s),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, Result<void> r) {
                   if (e) std::rethrow_exception(e);
                   out = std::move(r);
                 }));
  // The fake answers without suspending, so once the first poll is done the wait sits on its timer.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (m.polls < 1 && std::chrono::steady_clock::now() < deadline) ctx.run_one_for(100ms);
  REQUIRE(m.polls == 1);
  auto start = std::chrono::steady_clock::now();
  cancel.emit(asio::cancellation_type::terminal);
  ctx.run_for(10s);
  REQUIRE(out);
  REQUIRE_FALSE(out->has_value());
  CHECK(out->error().code == Errc::cancelled);
  CHECK(std::chrono::steady_clock::now() - start < 150ms);
  CHECK(m.polls == 1);
}

TEST_CASE("unit states are systemd's words, parsed once, unknown for any other") {
  for (auto s : {ActiveState::inactive, ActiveState::active, ActiveState::activating, ActiveState::deactivating,
                 ActiveState::reloading, ActiveState::failed, ActiveState::maintenance, ActiveState::refreshing})
    CHECK(parse_active_state(to_string(s)) == s);
  CHECK(to_string(ActiveState::activating) == "activating");
  CHECK(parse_active_state("Active") == ActiveState::unknown);
  CHECK(parse_active_state("") == ActiveState::unknown);
  CHECK(is_stopped(ActiveState::failed));
  CHECK(is_stopped(ActiveState::inactive));
  CHECK_FALSE(is_stopped(ActiveState::deactivating));
  CHECK(is_up(ActiveState::reloading));
  CHECK_FALSE(is_up(ActiveState::deactivating));
}

namespace {
// Records the calls reset_failed_and_start makes; ResetFailed itself fails, which must not matter.
class CallLog final : public ServiceManager {
 public:
  std::vector<std::string> calls;
  std::optional<Error> start_error;
  asio::awaitable<Result<void>> start(const std::string& u) override {
    calls.push_back("start " + u);
    if (start_error) co_return *start_error;
    co_return Result<void>{};
  }
  asio::awaitable<Result<void>> stop(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<UnitStatus>> status(const std::string&) override { co_return UnitStatus{}; }
  asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string&) override {
    co_return std::vector<std::uint32_t>{};
  }
  asio::awaitable<Result<void>> reset_failed(const std::string& u) override {
    calls.push_back("reset_failed " + u);
    co_return make_error(Errc::unit_failed, "no such unit");
  }
  asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string&, const std::string&, const std::string&) override { return {}; }
};

Result<void> run_start(ServiceManager& m) {
  asio::io_context ctx;
  std::optional<Result<void>> out;
  asio::co_spawn(ctx, reset_failed_and_start(m, "modeld-serve@x.service"), [&](std::exception_ptr e, Result<void> r) {
    if (e) std::rethrow_exception(e);
    out = std::move(r);
  });
  ctx.run_for(30s);
  REQUIRE(out);
  return *out;
}
}  // namespace

TEST_CASE("reset-failed-then-start resets, then starts, and answers what the start answers") {
  CallLog m;
  CHECK(run_start(m).has_value());
  CHECK(m.calls == std::vector<std::string>{"reset_failed modeld-serve@x.service", "start modeld-serve@x.service"});
  m.start_error = make_error(Errc::unit_failed, "start refused");
  auto r = run_start(m);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message == "start refused");
}

TEST_CASE("the default journal of a unit is systemd's: by unit and invocation, readable") {
  CallLog m;
  auto j = m.journal_of("modeld-serve@x.service");
  CHECK(j.identifier.empty());
  CHECK(j.readable);
}
