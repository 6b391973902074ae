// The control server through a real Unix socket in a temporary folder: socket setup, limits,
// keep-alive, authorization from SO_PEERCRED and the event stream. The server runs on an
// io_context thread; the tests are plain blocking clients with deadlines.

#include "control/server.hpp"
#include "unit/control/fake_control.hpp"
#include "util/cancel_tree.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

using namespace modeld;
using namespace modeld::control;
using control::test::FakeControl;
namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr auto deadline = 10s;

fs::path make_temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "modeld-control-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  // Other users must reach the socket inside (the 403 test connects as nobody).
  REQUIRE(::chmod(tmpl.c_str(), 0755) == 0);
  return tmpl;
}

// Waits for `cond` (read from the test thread) to hold, up to the deadline.
template <class Cond>
bool eventually(Cond cond) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

int connect_to(const fs::path& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A blocking client with a deadline on every read.
struct Client {
  int fd = -1;
  std::string in;  // received, not yet consumed
  bool eof = false;

  explicit Client(const fs::path& path) : fd(connect_to(path)) { REQUIRE(fd >= 0); }
  ~Client() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  void send(std::string_view data) {
    while (!data.empty()) {
      auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      REQUIRE(n > 0);
      data.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // Reads until `done(in)` holds; false on end of stream, error or deadline.
  template <class Done>
  bool read_until(Done done) {
    auto until = std::chrono::steady_clock::now() + deadline;
    while (!done(in)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[8192];
      auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        eof = true;
        return done(in);
      }
      in.append(buf, static_cast<std::size_t>(n));
    }
    return true;
  }

  bool read_to_end() {
    read_until([](const std::string&) { return false; });
    return eof;
  }
};

struct HttpAnswer {
  unsigned status = 0;
  std::string head;
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body); }
};

// Parses one response with a Content-Length body from the front of `text`.
std::optional<HttpAnswer> parse_answer(std::string& text) {
  auto end = text.find("\r\n\r\n");
  if (end == std::string::npos) return std::nullopt;
  HttpAnswer a;
  a.head = text.substr(0, end + 2);
  a.status = static_cast<unsigned>(std::stoul(a.head.substr(9, 3)));
  auto cl = a.head.find("Content-Length: ");
  std::size_t len = cl == std::string::npos ? 0 : std::stoul(a.head.substr(cl + 16));
  if (text.size() < end + 4 + len) return std::nullopt;
  a.body = text.substr(end + 4, len);
  text.erase(0, end + 4 + len);
  return a;
}

HttpAnswer read_answer(Client& c) {
  std::optional<HttpAnswer> a;
  REQUIRE(c.read_until([&](std::string& in) { return (a = parse_answer(in)).has_value(); }));
  return *a;
}

std::string get(std::string_view target) {
  return fmt::format("GET {} HTTP/1.1\r\nHost: localhost\r\n\r\n", target);
}

std::string post(std::string_view target, std::string_view body) {
  return fmt::format("POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "Content-Length: {}\r\n\r\n{}",
                     target, body.size(), body);
}

// A server on a temporary socket, run by its own io_context thread.
struct Fixture {
  fs::path dir = make_temp_dir();
  fs::path socket = dir / "run" / "modeld" / "modeld.sock";
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  FakeControl control;
  std::atomic<uid_t> asked_uid{static_cast<uid_t>(-1)};
  Options options;
  std::unique_ptr<Server> server;
  std::thread thread;

  Fixture() {
    options.socket_path = socket;
    options.group = "modeld-test";
    options.is_member = [this](const Peer& p, const std::string&) {
      asked_uid = p.uid;
      return false;
    };
  }

  void start(asio::cancellation_slot stop_on = {}) {
    server = std::make_unique<Server>(io.get_executor(), control, options);
    auto listening = server->listen();
    INFO((listening ? std::string() : listening.error().message));
    REQUIRE(listening.has_value());
    server->start(stop_on);
    thread = std::thread([this] { io.run(); });
  }

  // Runs `f` on the io thread and returns its result.
  template <class F>
  auto on_io(F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io, [&task] { task(); });
    REQUIRE(result.wait_for(deadline) == std::future_status::ready);
    return result.get();
  }

  std::size_t connections() {
    return on_io([this] { return server->connections(); });
  }

  ~Fixture() {
    if (thread.joinable()) {
      on_io([this] { server->stop(); });
      work.reset();
      thread.join();
    }
    server.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

TEST_CASE("the control socket is mode 0666 inside a new 0755 folder") {
  Fixture f;
  ::umask(022);
  f.start();
  struct stat st {};
  REQUIRE(::stat(f.socket.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 07777) == 0666);
  REQUIRE(::stat(f.socket.parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0755);
}

TEST_CASE("requests are answered over the socket, several on one kept-alive connection") {
  Fixture f;
  f.start();
  Client c(f.socket);
  c.send(get("/v1/status"));
  auto a = read_answer(c);
  CHECK(a.status == 200);
  CHECK_THAT(a.head, Catch::Contains("Content-Type: application/json"));
  CHECK(a.json()["daemon"]["version"] == MODELD_VERSION);
  c.send(get("/v1/nothing"));
  a = read_answer(c);
  CHECK(a.status == 404);
  CHECK(a.json()["error"]["code"] == "not_found");
  CHECK(f.connections() == 1);
}

TEST_CASE("an oversized body is refused 413 before the control sees it") {
  Fixture f;
  f.start();
  Client c(f.socket);
  std::string body = R"({"model": ")" + std::string(70 * 1024, 'a') + R"("})";
  c.send(post("/v1/deployments", body));
  auto a = read_answer(c);
  CHECK(a.status == 413);
  CHECK(a.json()["error"]["code"] == "bad_request");
  CHECK_THAT(a.json()["error"]["message"].get<std::string>(), Catch::Contains("65536"));
  CHECK(c.read_to_end());  // the connection ends after the refusal
  CHECK(f.on_io([&] { return f.control.starts; }) == 0);
}

TEST_CASE("headers over 8 KiB are refused 431") {
  Fixture f;
  f.start();
  Client c(f.socket);
  c.send("GET /v1/status HTTP/1.1\r\nX-Big: " + std::string(9000, 'x') + "\r\n\r\n");
  auto a = read_answer(c);
  CHECK(a.status == 431);
  CHECK(a.json()["error"]["code"] == "bad_request");
}

TEST_CASE("a malformed request line is answered 400") {
  Fixture f;
  f.start();
  Client c(f.socket);
  c.send("GET\x01 / HTTP/1.1\r\n\r\n");
  auto a = read_answer(c);
  CHECK(a.status == 400);
  CHECK(a.json()["error"]["code"] == "bad_request");
}

TEST_CASE("a body sent after 100-continue is read and answered") {
  Fixture f;
  f.start();
  Client c(f.socket);
  std::string body = R"({"model": "llama"})";
  c.send(fmt::format("POST /v1/deployments HTTP/1.1\r\nExpect: 100-continue\r\n"
                     "Content-Length: {}\r\n\r\n", body.size()));
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  CHECK(c.in.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
  c.in.clear();
  c.send(body);
  auto a = read_answer(c);
  // The test runs as root or as a non-member: either answer shows the body was read.
  if (::geteuid() == 0)
    CHECK(a.status == 202);
  else
    CHECK(a.status == 403);
}

TEST_CASE("a peer that is neither root nor a member is refused 403, judged by its SO_PEERCRED uid") {
  Fixture f;
  f.start();
  const bool root = ::geteuid() == 0;
  const uid_t expected_uid = root ? 65534 : ::geteuid();
  const std::string request = post("/v1/deployments", R"({"model": "llama"})");
  const std::string path = f.socket.string();
  int out[2];
  REQUIRE(::pipe(out) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Only system calls from here: the parent has other threads.
    ::close(out[0]);
    if (root && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0))
      ::_exit(10);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(11);
    if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) ::_exit(12);
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);  // one read: the answer is small
    if (n <= 0) ::_exit(13);
    if (::write(out[1], buf, static_cast<std::size_t>(n)) != n) ::_exit(14);
    ::_exit(0);
  }
  ::close(out[1]);
  std::string got;
  pollfd p{out[0], POLLIN, 0};
  char buf[4096];
  while (::poll(&p, 1, static_cast<int>(deadline / 1ms)) > 0) {
    auto n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  auto a = parse_answer(got);
  REQUIRE(a);
  CHECK(a->status == 403);
  CHECK(a->json()["error"]["code"] == "forbidden");
  CHECK_THAT(a->json()["error"]["message"].get<std::string>(), Catch::Contains("modeld-test"));
  CHECK(f.asked_uid == expected_uid);
  CHECK(f.on_io([&] { return f.control.starts; }) == 0);
}

TEST_CASE("the event stream delivers an event the control emits, and unsubscribes on disconnect") {
  Fixture f;
  f.start();
  Client c(f.socket);
  c.send(get("/v1/events"));
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  CHECK(c.in.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(c.in, Catch::Contains("Content-Type: text/event-stream\r\n"));
  CHECK(f.control.listener_count == 1);
  c.in.erase(0, c.in.find("\r\n\r\n") + 4);

  f.on_io([&] {
    deploy::Event e;
    e.kind = deploy::EventKind::phase;
    e.id = "d1";
    e.model = "llama";
    e.phase = deploy::Phase::downloading;
    f.control.emit(e);
    return 0;
  });
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\n\n") != std::string::npos; }));
  CHECK(c.in == "event: phase\ndata: {\"id\":\"d1\",\"model\":\"llama\",\"phase\":\"downloading\"}\n\n");

  c.close();
  CHECK(eventually([&] { return f.control.listener_count == 0; }));
  CHECK(eventually([&] { return f.connections() == 0; }));
}

TEST_CASE("the event stream leaves the model watcher's events out") {
  Fixture f;
  f.start();
  Client c(f.socket);
  c.send(get("/v1/events"));
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  c.in.erase(0, c.in.find("\r\n\r\n") + 4);
  f.on_io([&] {
    deploy::Event w;
    w.kind = deploy::EventKind::watcher;
    w.model = "llama";
    w.watcher = deploy::WatchdogStatus{};
    f.control.emit(w);
    deploy::Event e;
    e.kind = deploy::EventKind::state;
    e.id = "d1";
    e.model = "llama";
    e.state = deploy::State::succeeded;
    f.control.emit(e);
    return 0;
  });
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\n\n") != std::string::npos; }));
  CHECK(c.in ==
        "event: state\ndata: {\"error\":null,\"id\":\"d1\",\"model\":\"llama\",\"phase\":\"planning\","
        "\"state\":\"succeeded\"}\n\n");
}

TEST_CASE("a quiet event stream gets keep-alive comments") {
  Fixture f;
  f.options.limits.keepalive_interval = 20ms;
  f.start();
  Client c(f.socket);
  c.send(get("/v1/events"));
  CHECK(c.read_until([](const std::string& in) { return in.find("\r\n\r\n: keepalive\n\n") != std::string::npos; }));
}

TEST_CASE("an event client that lags more than the limit is dropped") {
  Fixture f;
  f.options.limits.max_event_lag = 3;
  f.start();
  Client c(f.socket);
  c.send(get("/v1/events"));
  REQUIRE(c.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  // All in one turn of the io thread: the writer cannot run in between, so the queue overflows.
  f.on_io([&] {
    for (int i = 0; i < 5; ++i) {
      deploy::Event e;
      e.kind = deploy::EventKind::progress;
      e.id = fmt::format("d{}", i);
      f.control.emit(e);
    }
    return 0;
  });
  CHECK(c.read_to_end());
  CHECK(c.in.find("event:") == std::string::npos);
  CHECK(eventually([&] { return f.control.listener_count == 0; }));
}

TEST_CASE("connections beyond the limit are answered 503 and closed at once") {
  Fixture f;
  f.options.limits.max_connections = 2;
  f.options.limits.reserved_connections = 0;
  f.start();
  Client a(f.socket), b(f.socket);
  for (Client* c : {&a, &b}) {
    c->send(get("/v1/status"));
    CHECK(read_answer(*c).status == 200);
  }
  Client third(f.socket);
  CHECK(third.read_to_end());
  auto refused = parse_answer(third.in);
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(refused->json()["error"]["code"] == "too_many_requests");
  CHECK_THAT(refused->json()["error"]["message"].get<std::string>(), Catch::Contains("too many connections"));
  a.send(get("/v1/status"));
  CHECK(read_answer(a).status == 200);
}

TEST_CASE("one user cannot take every connection: root keeps a reserve") {
  Fixture f;
  f.options.limits.max_connections = 2;
  f.options.limits.reserved_connections = 1;
  f.options.is_member = [](const Peer&, const std::string&) { return true; };  // privileged, root or not
  f.start();
  // A privileged client fills the general pool, then uses the reserve, then is refused.
  Client a(f.socket), b(f.socket), reserve(f.socket);
  for (Client* c : {&a, &b, &reserve}) {
    c->send(get("/v1/status"));
    CHECK(read_answer(*c).status == 200);
  }
  Client fourth(f.socket);
  CHECK(fourth.read_to_end());
  auto refused = parse_answer(fourth.in);
  REQUIRE(refused);
  CHECK(refused->status == 503);
}

TEST_CASE("stop closes idle connections and event streams") {
  Fixture f;
  f.start();
  Client idle(f.socket), events(f.socket);
  events.send(get("/v1/events"));
  REQUIRE(events.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  f.on_io([&] {
    f.server->stop();
    return 0;
  });
  CHECK(idle.read_to_end());
  CHECK(events.read_to_end());
  CHECK(eventually([&] { return f.control.listener_count == 0; }));
}

TEST_CASE("an emit of the cancellation tree the server was started on stops it as stop() does") {
  util::CancelTree tree;
  Fixture f;
  f.start(tree.child());
  Client idle(f.socket), events(f.socket);
  events.send(get("/v1/events"));
  REQUIRE(events.read_until([](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; }));
  f.on_io([&] {
    tree.emit();
    return 0;
  });
  CHECK(idle.read_to_end());
  CHECK(events.read_to_end());
  CHECK(eventually([&] { return f.control.listener_count == 0; }));
  CHECK(connect_to(f.socket) < 0);  // nothing accepts any more
}

TEST_CASE("a stale socket file is replaced, but one that answers is left alone") {
  Fixture f;
  fs::create_directories(f.socket.parent_path());
  {
    // Bound and never listening: connecting to it is refused, as after a crash.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, f.socket.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(fd);
  }
  f.start();
  Client c(f.socket);
  c.send(get("/v1/status"));
  CHECK(read_answer(c).status == 200);

  asio::io_context other_io;
  FakeControl other_engine;
  Server other(other_io.get_executor(), other_engine, f.options);
  auto r = other.listen();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  CHECK_THAT(r.error().message, Catch::Contains("another process answers"));
  CHECK_THAT(r.error().message, Catch::Contains(f.socket.string()));
}

TEST_CASE("a file that is not a socket is not removed") {
  Fixture f;
  fs::create_directories(f.socket.parent_path());
  { std::ofstream(f.socket) << "precious"; }
  Server s(f.io.get_executor(), f.control, f.options);
  auto r = s.listen();
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("not a socket"));
  CHECK(fs::is_regular_file(f.socket));
}

TEST_CASE("an adopted listening socket is served") {
  Fixture f;
  fs::create_directories(f.socket.parent_path());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, f.socket.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  f.server = std::make_unique<Server>(f.io.get_executor(), f.control, f.options);
  REQUIRE(f.server->adopt(fd).has_value());
  f.server->start();
  f.thread = std::thread([&] { f.io.run(); });
  Client c(f.socket);
  c.send(get("/v1/models"));
  CHECK(read_answer(c).status == 200);
}

TEST_CASE("adopting something that is not a listening socket is an error") {
  Fixture f;
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  Server s(f.io.get_executor(), f.control, f.options);
  auto r = s.adopt(fd);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  ::close(fd);
}
