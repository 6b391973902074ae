#include "health/health.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include <deque>
#include <filesystem>
#include <unistd.h>

using namespace modeld;
using modeld::test::Exchange;
using modeld::test::HeaderList;
using modeld::test::TestServer;
namespace asio = boost::asio;
using nlohmann::json;

namespace {

// A ServiceManager whose status() plays a script: each call takes the next state, the last one
// repeats.
class FakeManager : public units::ServiceManager {
 public:
  std::deque<units::UnitStatus> script;
  int status_calls = 0;

  static units::UnitStatus state(std::string active, std::string result = "success", int exit_status = 0) {
    units::UnitStatus s;
    s.active_state = units::parse_active_state(active);
    s.sub_state = s.active_state == units::ActiveState::active ? "running" : "dead";
    s.result = std::move(result);
    s.exec_main_status = exit_status;
    s.loaded = true;
    return s;
  }

  asio::awaitable<Result<void>> start(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<void>> stop(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<units::UnitStatus>> status(const std::string&) override {
    ++status_calls;
    auto s = script.front();
    if (script.size() > 1) script.pop_front();
    co_return s;
  }
  asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string&) override {
    co_return std::vector<std::uint32_t>{};
  }
  asio::awaitable<Result<void>> reset_failed(const std::string&) override { co_return Result<void>{}; }
  asio::awaitable<Result<void>> reload() override { co_return Result<void>{}; }
  Result<void> write_dropin(const std::string&, const std::string&, const std::string&) override { return {}; }
};

// A stand-in for vLLM's OpenAI surface; each answer can be changed by the test.
struct FakeServer {
  unsigned health_status = 200;
  int loading_answers = 0;  // the first this many health answers are 503, as while loading
  std::string models = R"({"object": "list", "data": [{"id": "kimi-k2.5", "object": "model"}]})";
  unsigned completion_status = 200;
  std::string completion = R"({"choices": [{"index": 0, "text": " there", "finish_reason": "length"}]})";
  int health_calls = 0;

  TestServer::Handler handler() {
    return [this](Exchange& ex) -> asio::awaitable<void> {
      auto target = std::string(ex.request.target());
      if (target == "/health") {
        ++health_calls;
        unsigned status = health_calls <= loading_answers ? 503 : health_status;
        co_await ex.respond(status, status == 200 ? "" : "loading");
      } else if (target == "/v1/models") {
        co_await ex.respond(200, models);
      } else if (target == "/v1/completions") {
        co_await ex.respond(completion_status, completion);
      } else {
        co_await ex.respond(404, "no route");
      }
    };
  }
};

struct Fixture {
  asio::io_context ioc;
  FakeServer fake;
  TestServer server{ioc, fake.handler()};
  http::Client client{ioc.get_executor(), {}};
  health::Target target;

  Fixture() {
    target.port = server.port();
    target.served_name = "kimi-k2.5";
    target.request_timeout = std::chrono::seconds(5);
  }

  Result<void> probe() { return test::run(ioc, health::probe_once(client, target)); }
};

}  // namespace

TEST_CASE("a server that passes every check is ready in one probe") {
  Fixture f;
  f.target.api_key = "sk-local";
  auto r = f.probe();
  REQUIRE(r);
  const auto& reqs = f.server.requests();
  REQUIRE(reqs.size() == 3);
  CHECK(reqs[0].target() == "/health");
  CHECK(reqs[1].target() == "/v1/models");
  CHECK(reqs[2].target() == "/v1/completions");
  CHECK(reqs[2].method_string() == "POST");
  auto body = json::parse(reqs[2].body());
  CHECK(body["model"] == "kimi-k2.5");
  CHECK(body["prompt"] == "Hello");
  CHECK(body["max_tokens"] == 1);
  CHECK(body["temperature"] == 0);
  for (const auto& req : reqs) CHECK(req[boost::beast::http::field::authorization] == "Bearer sk-local");
}

TEST_CASE("without completion the probe makes no completion request") {
  Fixture f;
  f.target.completion = false;
  REQUIRE(f.probe());
  CHECK(f.server.requests().size() == 2);
}

TEST_CASE("a health path that does not answer 200 is health_failed naming the check and answer") {
  Fixture f;
  f.fake.health_status = 503;
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("/health answered 503: loading") != std::string::npos);
  CHECK(f.server.requests().size() == 1);
}

TEST_CASE("a models list without the served name is health_failed saying which names it has") {
  Fixture f;
  f.fake.models = R"({"data": [{"id": "llama"}, {"id": "qwen"}]})";
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("'kimi-k2.5'") != std::string::npos);
  CHECK(r.error().message.find("llama, qwen") != std::string::npos);
}

TEST_CASE("a server's answer quoted in an error keeps its control characters, escaped") {
  Fixture f;
  f.fake.models = "<html>\n\toops\x1b[2J</html>";
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find(": <html>\\n\\toops\\u001b[2J</html>") != std::string::npos);
  CHECK(r.error().message.find('\n') == std::string::npos);
}

TEST_CASE("each readiness step has the contract's name, the journal's and the messages' alike") {
  using S = health::Step;
  CHECK(health::step_name(S::unit_active) == "unit_active");
  CHECK(health::step_name(S::port) == "port");
  CHECK(health::step_name(S::health) == "health");
  CHECK(health::step_name(S::models) == "models");
  CHECK(health::step_name(S::completion) == "completion");
  CHECK(health::step_name(S::ready) == "ready");
}

TEST_CASE("a models answer that is not the OpenAI list is health_failed") {
  Fixture f;
  f.fake.models = "<html>oops</html>";
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("models check") != std::string::npos);
}

TEST_CASE("a failed completion is health_failed naming the completion check") {
  Fixture f;
  f.fake.completion_status = 500;
  f.fake.completion = R"({"error": "CUDA out of memory"})";
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("completion check") != std::string::npos);
  CHECK(r.error().message.find("CUDA out of memory") != std::string::npos);
}

TEST_CASE("a completion without a token is health_failed") {
  Fixture f;
  f.fake.completion = R"({"choices": []})";
  auto r = f.probe();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("choices[0].text") != std::string::npos);
}

TEST_CASE("a server that does not listen is network_error") {
  asio::io_context ioc;
  asio::ip::tcp::acceptor a(ioc, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  health::Target t;
  t.port = a.local_endpoint().port();
  a.close();
  t.served_name = "x";
  http::Client client(ioc.get_executor(), {});
  auto r = test::run(ioc, health::probe_once(client, t));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
}

TEST_CASE("wait_ready reports each step once, in order, and returns when ready") {
  Fixture f;
  FakeManager m;
  m.script = {FakeManager::state("activating", ""), FakeManager::state("active")};
  f.fake.loading_answers = 1;
  std::vector<health::Step> steps;
  auto task = [&]() -> asio::awaitable<Result<void>> {
    co_return co_await health::wait_ready(
        f.client, m, "modeld-serve@kimi.service", f.target, std::chrono::seconds(10),
        [&](health::Step s, const std::string&) { steps.push_back(s); },
        std::chrono::milliseconds(10));
  };
  auto r = test::run(f.ioc, task());
  REQUIRE(r);
  using S = health::Step;
  CHECK(steps == std::vector<S>{S::unit_active, S::port, S::health, S::models, S::completion, S::ready});
  CHECK(f.fake.health_calls == 2);
}

TEST_CASE("wait_ready reports a unit that failed as unit_failed with its result and exit status") {
  Fixture f;
  FakeManager m;
  m.script = {FakeManager::state("activating", ""), FakeManager::state("failed", "exit-code", 1)};
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "modeld-serve@kimi.service", f.target,
                                               std::chrono::seconds(10), {}, std::chrono::milliseconds(10)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::unit_failed);
  CHECK(r.error().message.find("modeld-serve@kimi.service") != std::string::npos);
  CHECK(r.error().message.find("exit-code") != std::string::npos);
  CHECK(r.error().message.find("exit status 1") != std::string::npos);
  CHECK(f.server.requests().empty());
}

TEST_CASE("wait_ready reports a unit that became inactive after being active as unit_failed") {
  Fixture f;
  f.fake.health_status = 503;
  FakeManager m;
  m.script = {FakeManager::state("active"), FakeManager::state("inactive", "success", 0)};
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, std::chrono::seconds(10), {},
                                               std::chrono::milliseconds(10)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::unit_failed);
}

TEST_CASE("wait_ready reports an inactive unit with a failed result as unit_failed") {
  Fixture f;
  FakeManager m;
  m.script = {FakeManager::state("inactive", "signal", 9)};
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, std::chrono::seconds(10), {},
                                               std::chrono::milliseconds(10)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::unit_failed);
  CHECK(r.error().message.find("signal") != std::string::npos);
}

TEST_CASE("wait_ready gives up with readiness_timeout naming the last step and answer") {
  Fixture f;
  f.fake.models = R"({"data": [{"id": "other"}]})";
  FakeManager m;
  m.script = {FakeManager::state("active")};
  auto start = std::chrono::steady_clock::now();
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, std::chrono::milliseconds(300), {},
                                               std::chrono::milliseconds(20)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::readiness_timeout);
  CHECK(r.error().message.find("last step reached: health") != std::string::npos);
  CHECK(r.error().message.find("it lists: other") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
  CHECK(m.status_calls > 2);
}

TEST_CASE("wait_ready is cancelled by the awaiting coroutine's cancellation slot") {
  Fixture f;
  FakeManager m;
  m.script = {FakeManager::state("activating", "")};
  auto r = test::run_cancelling(f.ioc,
                                health::wait_ready(f.client, m, "u.service", f.target, std::chrono::seconds(60), {},
                                                   std::chrono::seconds(10)),
                                [&] { return m.status_calls >= 1; });
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::cancelled);
}

namespace {

// A journal stand-in: each read() gives the lines and cursor the test set; `fresh` makes every
// read look like a new line arrived.
struct FakeOutput {
  std::vector<std::string> lines = {"INFO loading"};
  std::string cursor = "c1";
  bool fresh = false;
  bool broken = false;
  int reads = 0;

  health::OutputReader reader() {
    return [this](const units::UnitStatus&) -> asio::awaitable<Result<sys::UnitOutput>> {
      ++reads;
      if (broken) co_return make_error(Errc::io_error, "cannot open the journal to read u.service's lines: denied");
      sys::UnitOutput out;
      out.lines = lines;
      out.newest_cursor = fresh ? fmt::format("c{}", reads) : cursor;
      co_return out;
    };
  }
};

// A running unit whose main process is this test process (certainly alive).
units::UnitStatus alive_unit() {
  auto s = FakeManager::state("active");
  s.main_pid = static_cast<std::uint32_t>(::getpid());
  return s;
}

// A port on which nothing listens, as while a server loads.
std::uint16_t closed_port(asio::io_context& ioc) {
  asio::ip::tcp::acceptor a(ioc, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  auto port = a.local_endpoint().port();
  a.close();
  return port;
}

health::ReadyOptions quick(std::chrono::milliseconds timeout, std::chrono::milliseconds stall) {
  health::ReadyOptions o;
  o.timeout = timeout;
  o.stall_timeout = stall;
  o.interval = std::chrono::milliseconds(20);
  o.progress_every = std::chrono::milliseconds(50);
  return o;
}

}  // namespace

TEST_CASE("a server alive but silent for stall_timeout is hung, long before startup_timeout") {
  Fixture f;
  f.target.port = closed_port(f.ioc);
  FakeManager m;
  m.script = {alive_unit()};
  FakeOutput out;
  out.lines = {"INFO Loading weights..."};
  auto o = quick(std::chrono::seconds(15), std::chrono::milliseconds(300));
  o.output = out.reader();
  auto start = std::chrono::steady_clock::now();
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::readiness_timeout);
  const auto& msg = r.error().message;
  CHECK(msg.find("u.service is hung") != std::string::npos);
  CHECK(msg.find(fmt::format("main process {} is alive but has been silent for", ::getpid())) != std::string::npos);
  CHECK(msg.find("stall_timeout 0.3 s") != std::string::npos);
  CHECK(msg.find("last step reached: unit_active") != std::string::npos);
  CHECK(msg.find("does not accept connections") != std::string::npos);
  CHECK(msg.find("last server line: 'INFO Loading weights...'") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("a server that keeps writing lines is loading, never hung, and progress names its last line") {
  Fixture f;
  f.target.port = closed_port(f.ioc);
  FakeManager m;
  m.script = {alive_unit()};
  FakeOutput out;
  out.fresh = true;
  out.lines = {"INFO Loading weights... 12s left"};
  auto o = quick(std::chrono::milliseconds(600), std::chrono::milliseconds(100));
  o.output = out.reader();
  std::vector<health::Progress> progress;
  o.on_progress = [&](const health::Progress& p) { progress.push_back(p); };
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::readiness_timeout);
  CHECK(r.error().message.find("was not ready within 0.6 s") != std::string::npos);
  CHECK(r.error().message.find("hung") == std::string::npos);
  REQUIRE(progress.size() >= 2);
  CHECK(progress.size() <= 13);  // at most one per progress_every (50 ms) over 600 ms
  CHECK(progress.back().last_line == "INFO Loading weights... 12s left");
  CHECK(progress.back().waited >= progress.front().waited + std::chrono::milliseconds(50));
  CHECK(progress.back().silent < std::chrono::milliseconds(100));
}

TEST_CASE("a server that answers HTTP, even with errors, is not silent") {
  Fixture f;
  f.fake.health_status = 503;
  FakeManager m;
  m.script = {alive_unit()};
  FakeOutput out;  // the journal never changes
  auto o = quick(std::chrono::milliseconds(500), std::chrono::milliseconds(100));
  o.output = out.reader();
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("was not ready within") != std::string::npos);
  CHECK(r.error().message.find("last step reached: port") != std::string::npos);
  CHECK(r.error().message.find("/health answered 503") != std::string::npos);
}

TEST_CASE("a unit that dies while loading is unit_failed quoting its last journal lines, API key hidden") {
  Fixture f;
  f.target.api_key = "sk-local-secret";
  FakeManager m;
  m.script = {FakeManager::state("activating", ""), FakeManager::state("failed", "exit-code", 3)};
  FakeOutput out;
  out.lines = {"INFO args: api_key=sk-local-secret", "INFO Loading weights... shard group 2",
               "ERROR CUDA error: out of memory"};
  auto o = quick(std::chrono::seconds(10), std::chrono::seconds(5));
  o.output = out.reader();
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "modeld-serve@kimi.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::unit_failed);
  const auto& msg = r.error().message;
  CHECK(msg.find("modeld-serve@kimi.service failed while starting") != std::string::npos);
  CHECK(msg.find("exit status 3") != std::string::npos);
  CHECK(msg.find("its last journal lines:\n  INFO args: api_key=***\n  INFO Loading weights... shard group 2\n"
                 "  ERROR CUDA error: out of memory") != std::string::npos);
  CHECK(msg.find("sk-local-secret") == std::string::npos);
  CHECK(f.server.requests().empty());
}

TEST_CASE("a unit that dies without a line says it wrote nothing") {
  Fixture f;
  FakeManager m;
  m.script = {FakeManager::state("failed", "exit-code", 1)};
  FakeOutput out;
  out.lines = {};
  out.cursor = "";
  auto o = quick(std::chrono::seconds(10), std::chrono::seconds(5));
  o.output = out.reader();
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("it wrote nothing to its journal") != std::string::npos);
}

TEST_CASE("an unreadable journal is reported once and the server counts as loading, not hung") {
  Fixture f;
  f.target.port = closed_port(f.ioc);
  FakeManager m;
  m.script = {alive_unit()};
  FakeOutput out;
  out.broken = true;
  auto o = quick(std::chrono::milliseconds(500), std::chrono::milliseconds(50));
  o.output = out.reader();
  std::vector<std::string> notes;
  o.on_output_unreadable = [&](const std::string& why) { notes.push_back(why); };
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("was not ready within") != std::string::npos);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("cannot open the journal") != std::string::npos);
  CHECK(out.reads == 1);
}

TEST_CASE("an active unit whose main process is gone is not probed") {
  Fixture f;
  FakeManager m;
  auto s = FakeManager::state("active");
  s.main_pid = 0x3FFFFFFF;  // above any pid_max: no such process
  m.script = {s};
  auto o = quick(std::chrono::milliseconds(200), std::chrono::seconds(0));
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find(fmt::format("main process {} has exited", 0x3FFFFFFF)) != std::string::npos);
  CHECK(r.error().message.find("last step reached: none") != std::string::npos);
  CHECK(f.server.requests().empty());
}

TEST_CASE("a port that accepts connections is a step of its own before the health check") {
  Fixture f;
  f.fake.health_status = 503;
  FakeManager m;
  m.script = {alive_unit()};
  std::vector<std::pair<health::Step, std::string>> steps;
  auto o = quick(std::chrono::milliseconds(200), std::chrono::seconds(0));
  o.on_step = [&](health::Step s, const std::string& text) { steps.emplace_back(s, text); };
  auto r = test::run(f.ioc, health::wait_ready(f.client, m, "u.service", f.target, o));
  REQUIRE_FALSE(r);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].first == health::Step::unit_active);
  CHECK(steps[0].second == fmt::format("u.service is active, main process {} alive", ::getpid()));
  CHECK(steps[1].first == health::Step::port);
  CHECK(steps[1].second == fmt::format("port {} accepts connections", f.target.port));
}

TEST_CASE("journal_output reads on the pool and opens the journal again for a new invocation") {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("modeld-health-journal-{}", ::getpid());
  std::filesystem::create_directories(dir);
  asio::io_context ioc;
  asio::thread_pool pool(1);
  auto reader = health::journal_output(pool, "modeld-serve@kimi.service", std::chrono::system_clock::now(), 10, dir);
  units::UnitStatus st = FakeManager::state("active");
  auto task = [&]() -> asio::awaitable<Result<sys::UnitOutput>> {
    auto first = co_await reader(st);
    if (!first) co_return first;
    st.invocation_id = "0123456789abcdef0123456789abcdef";
    co_return co_await reader(st);
  };
  auto r = test::run(ioc, task());
  REQUIRE(r);
  CHECK(r->lines.empty());
  CHECK(r->newest_cursor.empty());
  pool.join();
  std::filesystem::remove_all(dir);
}

TEST_CASE("journal_output of a folder that is not there is io_error naming the unit") {
  asio::io_context ioc;
  asio::thread_pool pool(1);
  auto reader = health::journal_output(pool, "u.service", std::chrono::system_clock::now(), 10, "/nonexistent/journal");
  auto r = test::run(ioc, reader(FakeManager::state("active")));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::io_error);
  CHECK(r.error().message.find("u.service") != std::string::npos);
  pool.join();
}

TEST_CASE("the benchmark times the first streamed token and counts the rest") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    asio::steady_timer pace(co_await asio::this_coro::executor);
    for (int i = 0; i < 5; ++i) {
      // The stand-in server paces its tokens; the test itself waits for nothing but the answer.
      pace.expires_after(std::chrono::milliseconds(5));
      co_await pace.async_wait(asio::use_awaitable);
      std::string event = fmt::format("data: {{\"choices\": [{{\"index\": 0, \"text\": \"t{}\"}}]}}\n\n", i);
      co_await ex.write(fmt::format("{:x}\r\n{}\r\n", event.size(), event));
    }
    std::string done = "data: [DONE]\n\n";
    co_await ex.write(fmt::format("{:x}\r\n{}\r\n0\r\n\r\n", done.size(), done));
  });
  http::Client client(ioc.get_executor(), {});
  health::Target t;
  t.port = server.port();
  t.served_name = "m";
  auto r = test::run(ioc, health::benchmark(client, t, "Write a haiku about GPUs.", 5));
  REQUIRE(r);
  CHECK(r->ttft_s > 0.004);
  CHECK(r->decode_tokens_per_s > 0);
  auto body = json::parse(server.requests().at(0).body());
  CHECK(body["stream"] == true);
  CHECK(body["max_tokens"] == 5);
  CHECK(body["prompt"] == "Write a haiku about GPUs.");
}

TEST_CASE("a benchmark answered with an error status is health_failed") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(400, "bad model"); });
  http::Client client(ioc.get_executor(), {});
  health::Target t;
  t.port = server.port();
  t.served_name = "m";
  auto r = test::run(ioc, health::benchmark(client, t, "p", 4));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::health_failed);
  CHECK(r.error().message.find("400") != std::string::npos);
}
