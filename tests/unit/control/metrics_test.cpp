// The metrics counters fed by the Deployer's events, the exposition they produce, and the TCP listener
// of [metrics] listen through a real loopback socket (blocking client with deadlines).

#include "control/metrics.hpp"
#include "control/accept.hpp"
#include "control/routes.hpp"
#include "unit/control/fake_control.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>
#include <regex>
#include <set>
#include <thread>

using namespace modeld;
using namespace modeld::control;
using control::test::FakeControl;
using control::test::make_deployment;
namespace asio = boost::asio;

namespace {

deploy::Event phase(const std::string& id, const std::string& p) {
  deploy::Event e;
  e.kind = deploy::EventKind::phase;
  e.id = id;
  e.model = "llama";
  e.phase = *deploy::phase_from_string(p);
  return e;
}

deploy::Event progress(const std::string& id, std::uint64_t done) {
  deploy::Event e;
  e.kind = deploy::EventKind::progress;
  e.id = id;
  e.model = "llama";
  e.phase = deploy::Phase::downloading;
  e.progress.bytes_done = done;
  e.progress.bytes_total = 1000;
  return e;
}

deploy::Event ended(const std::string& id, const std::string& state, const std::string& code = "") {
  deploy::Event e;
  e.kind = deploy::EventKind::state;
  e.id = id;
  e.model = "llama";
  e.phase = deploy::Phase::verifying;
  e.state = *deploy::state_from_string(state);
  if (!code.empty()) e.error = make_error(errc_from_string(code), "x");
  return e;
}

// The value of the sample line that starts with `series` ("name{labels}"), or -1 when none.
double sample(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  auto start = at + series.size() + 2;
  return std::stod(text.substr(start, text.find('\n', start) - start));
}

// Every line is a HELP or TYPE comment or a sample of a family declared before it.
void check_exposition(const std::string& text) {
  static const std::regex line_re(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? (-?[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|[+-]Inf)$)");
  REQUIRE(!text.empty());
  CHECK(text.back() == '\n');
  std::set<std::string> typed;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    start = end + 1;
    CAPTURE(line);
    if (line.rfind("# TYPE ", 0) == 0) {
      auto name = line.substr(7, line.find(' ', 7) - 7);
      CHECK(typed.insert(name).second);
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    std::smatch m;
    REQUIRE(std::regex_match(line, m, line_re));
    std::string name = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(name) && name.size() > std::strlen(suffix) && name.ends_with(suffix))
        name = name.substr(0, name.size() - std::strlen(suffix));
    CHECK(typed.count(name));
  }
}

}  // namespace

TEST_CASE("phase durations become the last value, a total and a count per phase") {
  FakeControl e;
  MetricsCollector c(e);
  c.on_event(phase("d1", "planning"));
  c.on_event(phase("d1", "downloading"));
  c.on_event(ended("d1", "succeeded"));
  const auto& phases = c.counters().phases;
  REQUIRE(phases.count("planning"));
  REQUIRE(phases.count("downloading"));
  CHECK(phases.at("planning").count == 1);
  CHECK(phases.at("downloading").count == 1);
  // Measured on a steady clock within this test.
  CHECK(phases.at("planning").last >= 0);
  CHECK(phases.at("planning").last < 5);
  const auto t = c.text();
  check_exposition(t);
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_phase_duration_seconds gauge\n"));
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_phase_seconds_total counter\n"));
  CHECK_THAT(t, Catch::Contains("# TYPE modeld_phase_runs_total counter\n"));
  CHECK(sample(t, R"(modeld_phase_runs_total{phase="planning"})") == 1);
  CHECK(sample(t, R"(modeld_phase_runs_total{phase="downloading"})") == 1);
  CHECK(sample(t, R"(modeld_phase_seconds_total{phase="planning"})") == Approx(phases.at("planning").sum));
  CHECK(sample(t, R"(modeld_phase_duration_seconds{phase="planning"})") >= 0);
  CHECK(sample(t, R"(modeld_deployments_total{result="succeeded"})") == 1);
}

TEST_CASE("a phase's observations add up and the newest is the last") {
  PhaseDurations d;
  d.observe(0.05);
  d.observe(2);
  d.observe(20000);
  CHECK(d.count == 3);
  CHECK(d.sum == Approx(20002.05));
  CHECK(d.last == 20000);
}

TEST_CASE("bytes downloaded count every increase of bytes on disk and never a decrease") {
  FakeControl e;
  MetricsCollector c(e);
  c.on_event(progress("d1", 100));
  c.on_event(progress("d1", 400));
  c.on_event(progress("d1", 300));  // a partial started over
  c.on_event(progress("d1", 350));
  c.on_event(ended("d1", "failed", "network_error"));
  c.on_event(progress("d2", 50));
  CHECK(c.counters().download_bytes == 400 + 50 + 50);
  CHECK(sample(c.text(), "modeld_download_bytes_total") == 500);
}

TEST_CASE("deployments that fail a checkpoint check and verify runs with problems count as verification failures") {
  FakeControl e;
  MetricsCollector c(e);
  c.on_event(ended("d1", "failed", "checksum_mismatch"));
  c.on_event(ended("d2", "failed", "hub_unavailable"));
  c.on_event(ended("d3", "rolled_back", "size_mismatch"));
  c.observe(Request{"POST", "/v1/models/llama/verify", ""}, Response{200, "application/json", R"({"ok":false})"});
  c.observe(Request{"POST", "/v1/models/llama/verify", ""}, Response{200, "application/json", R"({"ok":true})"});
  c.observe(Request{"POST", "/v1/models/llama/verify", ""}, Response{409, "application/json", R"({"ok":false})"});
  const auto t = c.text();
  CHECK(sample(t, R"(modeld_verification_failures_total{source="deployment"})") == 2);
  CHECK(sample(t, R"(modeld_verification_failures_total{source="verify"})") == 1);
  CHECK(sample(t, R"(modeld_deployments_total{result="failed"})") == 2);
  CHECK(sample(t, R"(modeld_deployments_total{result="rolled_back"})") == 1);
}

TEST_CASE("deployment counts start from the history and grow with terminal events") {
  FakeControl e;
  e.deployments = {make_deployment("d2", "llama", deploy::State::cancelled),
                   make_deployment("d1", "llama", deploy::State::succeeded)};
  MetricsCollector c(e);
  REQUIRE(e.listeners.size() == 1);
  // Through the Deployer's subscription, as the daemon feeds it.
  for (auto& [token, listener] : e.listeners) listener(ended("d3", "succeeded"));
  const auto t = c.text();
  CHECK(sample(t, R"(modeld_deployments_total{result="succeeded"})") == 2);
  CHECK(sample(t, R"(modeld_deployments_total{result="cancelled"})") == 1);
  CHECK(sample(t, R"(modeld_deployments_total{result="failed"})") == 0);
}

TEST_CASE("the collector unsubscribes when it goes") {
  FakeControl e;
  { MetricsCollector c(e); CHECK(e.listeners.size() == 1); }
  CHECK(e.listeners.empty());
}

TEST_CASE("the download rate is the running deployment's while it downloads, else 0") {
  FakeControl e;
  auto d = make_deployment("d1", "llama", deploy::State::running, deploy::Phase::downloading);
  d.progress.rate_bytes_per_s = 1.5e9;
  e.deployments = {d};
  MetricCounters none;
  CHECK(sample(metrics_text(e, none), "modeld_download_rate_bytes_per_second") == 1.5e9);
  CHECK(sample(metrics_text(e, none), "modeld_deployment_running") == 1);
  e.deployments.front().phase = deploy::Phase::verifying;
  CHECK(sample(metrics_text(e, none), "modeld_download_rate_bytes_per_second") == 0);
  e.deployments.front().state = deploy::State::failed;
  CHECK(sample(metrics_text(e, none), "modeld_deployment_running") == 0);
}

TEST_CASE("the model watcher's events count no deployment, phase or byte") {
  FakeControl e;
  MetricsCollector c(e);
  deploy::Event w;
  w.kind = deploy::EventKind::watcher;
  w.model = "llama";
  w.watcher = deploy::WatchdogStatus{};
  e.emit(w);
  CHECK(c.counters().deployments.empty());
  CHECK(c.counters().phases.empty());
  CHECK(c.counters().download_bytes == 0);
}

TEST_CASE("configuration reloads are counted by result with the last one's outcome") {
  FakeControl e;
  MetricsCollector c(e);
  CHECK(sample(c.text(), "modeld_config_last_reload_successful") == 1);
  c.reloaded(true);
  c.reloaded(false);
  const auto t = c.text();
  CHECK(sample(t, R"(modeld_config_reloads_total{result="success"})") == 1);
  CHECK(sample(t, R"(modeld_config_reloads_total{result="failure"})") == 1);
  CHECK(sample(t, "modeld_config_last_reload_successful") == 0);
}

TEST_CASE("every family of a full exposition is declared once before its samples") {
  FakeControl e;
  e.active_model = deploy::Active{"llama", "abc", "modeld-serve@llama.service", 8000, "x"};
  deploy::WatchdogStatus w;
  w.model = "llama";
  w.last_probe_seconds = 0.02;
  e.watched = {w};
  deploy::ServiceInfo other{"kimi-k2-5", "def", "modeld-serve@kimi-k2-5.service", 8001, std::vector<unsigned>{4, 5}, "x"};
  other.watchdog = w;
  other.watchdog->model = "kimi-k2-5";
  e.in_service = {deploy::ServiceInfo{"llama", "abc", "modeld-serve@llama.service", 8000, std::nullopt, "x"}, other};
  MetricsCollector c(e);
  c.on_event(phase("d1", "planning"));
  c.on_event(phase("d1", "health_checking"));
  c.on_event(ended("d1", "succeeded"));
  const auto t = c.text();
  check_exposition(t);
  CHECK_THAT(t, Catch::Contains(
                   "modeld_active_model_info{model=\"llama\",commit=\"abc\",unit=\"modeld-serve@llama.service\"} 1\n"));
  CHECK(sample(t, R"(modeld_readiness_probe_seconds{model="llama"})") == Approx(0.02));
  CHECK(sample(t, R"(modeld_readiness_probe_seconds{model="kimi-k2-5"})") == Approx(0.02));
  CHECK(sample(t, R"(modeld_service_info{model="kimi-k2-5",commit="def",unit="modeld-serve@kimi-k2-5.service",port="8001",gpu_ids="4,5"})") == 1);
}

namespace {

// What `promtool check metrics` says about `text` (its exit status and output); promtool comes
// with the Debian package prometheus that scripts/install-deps.sh installs.
std::pair<int, std::string> promtool_check(const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / fmt::format("modeld-metrics-{}.txt", ::getpid());
  {
    std::ofstream f(path);
    f << text;
  }
  std::string out;
  FILE* p = ::popen(fmt::format("promtool check metrics < '{}' 2>&1", path.string()).c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  std::filesystem::remove(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("promtool accepts the exposition of several services, each watched, one active") {
  FakeControl e;
  e.active_model = deploy::Active{"kimi-k2-5", "def", "modeld-serve@kimi-k2-5.service", 8001, "x"};
  deploy::WatchdogStatus w;
  w.model = "llama";
  w.last_probe_seconds = 0.02;
  deploy::ServiceInfo llama{"llama", "abc", "modeld-serve@llama.service", 8000, std::vector<unsigned>{0, 1, 2, 3}, "x"};
  deploy::ServiceInfo kimi{"kimi-k2-5", "def", "modeld-serve@kimi-k2-5.service", 8001, std::vector<unsigned>{4, 5}, "x"};
  llama.watchdog = w;
  w.model = "kimi-k2-5";
  kimi.watchdog = w;
  e.in_service = {llama, kimi};
  MetricsCollector c(e);
  c.on_event(phase("d1", "planning"));
  c.on_event(ended("d1", "succeeded"));
  const auto t = c.text();
  check_exposition(t);
  CHECK(sample(t, R"(modeld_readiness_probe_seconds{model="kimi-k2-5"})") == Approx(0.02));
  auto [status, out] = promtool_check(t);
  INFO(out);
  CHECK(status == 0);
}

// ---------------------------------------------------------------------------------------------

namespace {

constexpr auto deadline = std::chrono::seconds(10);

// A TCP connection to 127.0.0.1:`port` from the loopback address `source` that has sent `sent`.
int connect_from(std::uint16_t port, const char* source, const std::string& sent) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::send(fd, sent.data(), sent.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(sent.size()));
  return fd;
}

// One HTTP exchange over loopback TCP from `source`: sends `request`, reads until the server
// closes (or resets: what arrived before counts).
std::string exchange(std::uint16_t port, const std::string& request, const char* source = "127.0.0.1") {
  int fd = connect_from(port, source, request);
  std::string in;
  auto until = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    REQUIRE(left.count() > 0);
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, static_cast<int>(left.count())) > 0);
    char buf[8192];
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return in;
}

struct ListenerFixture {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::unique_ptr<MetricsListener> listener;
  std::thread thread;

  explicit ListenerFixture(const std::string& address, MetricsLimits limits = {},
                           std::string body = "modeld_up 1\n") {
    listener = std::make_unique<MetricsListener>(io.get_executor(), [body] { return body; }, limits);
    auto r = listener->listen(address);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    listener->start();
    thread = std::thread([this] { io.run(); });
  }
  // The listener's connection count, read on its thread.
  std::size_t connections() {
    std::promise<std::size_t> n;
    asio::post(io, [&] { n.set_value(listener->connections()); });
    return n.get_future().get();
  }
  ~ListenerFixture() {
    asio::post(io, [this] { listener->stop(); });
    work.reset();
    thread.join();
  }
};

}  // namespace

TEST_CASE("the TCP listener answers GET /metrics with the exposition and nothing else") {
  ListenerFixture f("127.0.0.1:0");
  const auto port = f.listener->port();
  REQUIRE(port != 0);
  auto ok = exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(ok, Catch::Contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  CHECK_THAT(ok, Catch::EndsWith("\r\n\r\nmodeld_up 1\n"));

  auto other = exchange(port, "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(other.rfind("HTTP/1.1 404 Not Found\r\n", 0) == 0);
  auto post = exchange(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  CHECK(post.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK_THAT(post, Catch::Contains("Allow: GET, HEAD\r\n"));
  auto head = exchange(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(head, Catch::EndsWith("\r\n\r\n"));
}

TEST_CASE("the TCP listener keeps a connection for the next scrape") {
  ListenerFixture f("127.0.0.1:0");
  auto two = exchange(f.listener->port(),
                      "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::size_t answers = 0;
  for (auto at = two.find("HTTP/1.1 200 OK"); at != std::string::npos; at = two.find("HTTP/1.1 200 OK", at + 1))
    ++answers;
  CHECK(answers == 2);
}

TEST_CASE("a metrics address already in use is an io_error naming metrics.listen") {
  ListenerFixture f("127.0.0.1:0");
  asio::io_context io;
  MetricsListener second(io.get_executor(), [] { return std::string(); });
  auto r = second.listen(fmt::format("127.0.0.1:{}", f.listener->port()));
  REQUIRE(!r);
  CHECK(r.error().code == Errc::io_error);
  CHECK_THAT(r.error().message, Catch::Contains("metrics.listen \"127.0.0.1:"));
  CHECK_THAT(r.error().message, Catch::Contains("in use"));
}

TEST_CASE("the TCP listener binds bracketed IPv6 and host names") {
  asio::io_context io;
  MetricsListener byname(io.get_executor(), [] { return std::string(); });
  auto r = byname.listen("localhost:0");
  INFO((r ? std::string() : r.error().message));
  CHECK(r.has_value());
  MetricsListener v6(io.get_executor(), [] { return std::string(); });
  auto r6 = v6.listen("[::1]:0");
  // Hosts without IPv6 on loopback cannot bind it; then the message names the address.
  if (!r6) CHECK_THAT(r6.error().message, Catch::Contains("metrics.listen \"[::1]:0\""));
}

namespace {

constexpr const char* stalled_request = "GET /metrics HTTP/1.1\r\n";  // a request line, then nothing

// Whether the server closed `fd` (EOF or reset) within `deadline`, reading and dropping what came.
bool closed_by_server(int fd) {
  auto until = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
}

// Whether `fd` is still open on the server's side now: nothing to read, no hang-up.
bool still_open(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

struct Fds {
  std::vector<int> fds;
  ~Fds() {
    for (int fd : fds) ::close(fd);
  }
};

constexpr const char* scrape = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

}  // namespace

TEST_CASE("connections that send a request line and stop cannot keep a scrape from their own address out") {
  // The attack of issue 12: 16 connections that each send a request line and stop held every
  // slot; the scrape was closed unanswered.
  ListenerFixture f("127.0.0.1:0");
  Fds stalled;
  for (int i = 0; i < 16; ++i) stalled.fds.push_back(connect_from(f.listener->port(), "127.0.0.1", stalled_request));
  auto ok = exchange(f.listener->port(), scrape);
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(ok, Catch::EndsWith("modeld_up 1\n"));
  // Four per address: the 12 that waited longest were closed to make room, the newest kept.
  for (std::size_t i = 0; i < 12; ++i) CHECK(closed_by_server(stalled.fds[i]));
  CHECK(f.connections() <= 4);
}

TEST_CASE("one address holds at most per_address_connections and makes room from its own, not from others") {
  ListenerFixture f("127.0.0.1:0", MetricsLimits{16, 4});
  Fds bystanders, stalled;
  for (int i = 0; i < 2; ++i) bystanders.fds.push_back(connect_from(f.listener->port(), "127.0.0.3", stalled_request));
  for (int i = 0; i < 10; ++i) stalled.fds.push_back(connect_from(f.listener->port(), "127.0.0.2", stalled_request));
  auto ok = exchange(f.listener->port(), scrape, "127.0.0.4");
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  for (std::size_t i = 0; i < 6; ++i) CHECK(closed_by_server(stalled.fds[i]));
  // The scrape was accepted after them all, so every decision about them has been taken.
  for (std::size_t i = 6; i < 10; ++i) CHECK(still_open(stalled.fds[i]));
  for (int fd : bystanders.fds) CHECK(still_open(fd));
  CHECK(f.connections() == 6);
}

TEST_CASE("at max_connections the address holding the most gives up the connection longest without progress") {
  ListenerFixture f("127.0.0.1:0", MetricsLimits{4, 3});
  Fds heavy, light;
  for (int i = 0; i < 3; ++i) heavy.fds.push_back(connect_from(f.listener->port(), "127.0.0.2", stalled_request));
  light.fds.push_back(connect_from(f.listener->port(), "127.0.0.3", stalled_request));
  auto ok = exchange(f.listener->port(), scrape, "127.0.0.4");
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(closed_by_server(heavy.fds[0]));
  CHECK(still_open(heavy.fds[1]));
  CHECK(still_open(heavy.fds[2]));
  CHECK(still_open(light.fds[0]));
}

TEST_CASE("a connection whose answer is not read gives its place to a new one from its address") {
  // An answer larger than the socket buffers blocks its write while its client does not read:
  // such a connection makes no progress and is closed for room like one that sends nothing.
  ListenerFixture f("127.0.0.1:0", MetricsLimits{16, 1}, std::string(64u << 20, '#'));
  Fds unread;
  unread.fds.push_back(connect_from(f.listener->port(), "127.0.0.2", scrape));
  // Its answer has begun once some of it arrives.
  pollfd p{unread.fds[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  auto served = exchange(f.listener->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                         "127.0.0.2");
  CHECK(served.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(closed_by_server(unread.fds[0]));
}

// ---- the switch's outage ----

namespace {

// An ended deployment of `model` whose switch lasted `downtime_s` (none when negative).
deploy::Deployment switched(const std::string& id, const std::string& model, double downtime_s) {
  auto d = make_deployment(id, model, deploy::State::succeeded);
  if (downtime_s >= 0) d.switch_report = deploy::SwitchReport{downtime_s, 1, 1, downtime_s - 3, 1};
  return d;
}

}  // namespace

TEST_CASE("switch downtimes start from the history: the newest per model, and every one in the histogram") {
  FakeControl e;
  // Newest first, as the history is.
  e.deployments = {switched("d4", "kimi-k2-5", 700), switched("d3", "llama", 12), switched("d2", "llama", -1),
                   switched("d1", "llama", 40)};
  MetricsCollector c(e);
  const auto t = c.text();
  check_exposition(t);
  CHECK(sample(t, R"(modeld_switch_downtime_seconds{model="llama"})") == 12);
  CHECK(sample(t, R"(modeld_switch_downtime_seconds{model="kimi-k2-5"})") == 700);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="10"})") == 0);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="30"})") == 1);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="60"})") == 2);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="600"})") == 2);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="1200"})") == 3);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="+Inf"})") == 3);
  CHECK(sample(t, "modeld_switch_downtimes_seconds_count") == 3);
  CHECK(sample(t, "modeld_switch_downtimes_seconds_sum") == 752);
  // GET /metrics without a collector reads the same from the history.
  CHECK(sample(metrics_text(e), R"(modeld_switch_downtime_seconds{model="llama"})") == 12);
}

TEST_CASE("a deployment that ends with a switch updates the model's gauge and the histogram, one without does not") {
  FakeControl e;
  MetricsCollector c(e);
  CHECK(c.text().find("modeld_switch_downtime_seconds{") == std::string::npos);
  CHECK(sample(c.text(), "modeld_switch_downtimes_seconds_count") == 0);
  e.deployments.insert(e.deployments.begin(), switched("d1", "llama", 4.5));
  c.on_event(ended("d1", "succeeded"));
  e.deployments.insert(e.deployments.begin(), switched("d2", "llama", -1));
  c.on_event(ended("d2", "failed"));
  const auto t = c.text();
  CHECK(sample(t, R"(modeld_switch_downtime_seconds{model="llama"})") == 4.5);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="5"})") == 1);
  CHECK(sample(t, R"(modeld_switch_downtimes_seconds_bucket{le="1"})") == 0);
  CHECK(sample(t, "modeld_switch_downtimes_seconds_count") == 1);
}
