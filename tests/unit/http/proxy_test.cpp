// Proxies: NO_PROXY matching, proxy URLs, Retry-After, and the client through a real tinyproxy
// (CONNECT tunnels, absolute-form requests, Basic authentication) and through a TestServer that
// plays a proxy where a test must see exactly what the proxy received.

#include "http/client.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

using namespace modeld;
using namespace modeld::http;
using modeld::test::Exchange;
using modeld::test::TestServer;
using modeld::test::get;
using modeld::test::header;
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using namespace std::chrono_literals;

namespace {

constexpr const char* kTinyproxy = "/usr/bin/tinyproxy";



bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// A port on which nothing listens: bound, then closed.
std::uint16_t closed_port() {
  asio::io_context ioc;
  asio::ip::tcp::acceptor a(ioc, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  auto port = a.local_endpoint().port();
  a.close();
  return port;
}

bool accepts_connections(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tinyproxy as a child process with a generated configuration in a temporary folder: listening
// on a free loopback port, CONNECT allowed to every port (no ConnectPort line), logging each
// request line to `log()`. Running as root it keeps the current user (it only warns that no
// User is set), so no User/Group lines are needed either way.
class Tinyproxy {
 public:
  static bool available() { return ::access(kTinyproxy, X_OK) == 0; }

  /// `extra`: configuration lines appended (e.g. "BasicAuth user pass").
  explicit Tinyproxy(const std::string& extra = {}) {
    char tmpl[] = "/tmp/modeld-tinyproxy-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    port_ = closed_port();
    auto conf = dir_ / "tinyproxy.conf";
    std::ofstream(conf) << fmt::format(
        "Port {}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 30\nMaxClients 32\nLogLevel Connect\n{}\n", port_,
        extra);
    auto log_path = dir_ / "tinyproxy.log";
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      // Only async-signal-safe calls until exec; the test's sockets must not stay open in the
      // proxy (a closed TestServer port would keep accepting there).
      int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int in = ::open("/dev/null", O_RDONLY);
      if (out < 0 || in < 0) ::_exit(126);
      ::dup2(in, 0);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::close_range(3, ~0u, 0);
      ::execl(kTinyproxy, kTinyproxy, "-d", "-c", conf.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait (with a deadline) until the port accepts connections or the proxy has exited.
    auto end = std::chrono::steady_clock::now() + 10s;
    while (!accepts_connections(port_)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("tinyproxy exited at start: " + log());
      }
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("tinyproxy did not listen: " + log());
      std::this_thread::sleep_for(10ms);  // polling interval of a condition with a deadline
    }
  }

  ~Tinyproxy() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  Tinyproxy(const Tinyproxy&) = delete;
  Tinyproxy& operator=(const Tinyproxy&) = delete;

  std::uint16_t port() const { return port_; }

  /// "http://[userinfo@]127.0.0.1:PORT".
  std::string url(std::string_view userinfo = {}) const {
    return fmt::format("http://{}{}127.0.0.1:{}", userinfo, userinfo.empty() ? "" : "@", port_);
  }

  /// What tinyproxy logged so far (its request lines, e.g. "CONNECT localhost:1234 HTTP/1.1").
  std::string log() const { return read_file(dir_ / "tinyproxy.log"); }

 private:
  std::filesystem::path dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// scripts/install-deps.sh installs tinyproxy: without it these tests fail (a test that returns
// early would pass with no assertion run).
#define REQUIRE_TINYPROXY()                                                                         \
  do {                                                                                              \
    if (!Tinyproxy::available())                                                                    \
      FAIL(kTinyproxy << " is not installed: these tests need it (scripts/install-deps.sh)");       \
  } while (false)

// An HTTPS origin for "localhost" with a certificate made for this test.
struct TlsOrigin {
  test::TestCertificate cert = test::make_test_certificate();
  std::unique_ptr<asio::ssl::context> tls = test::make_server_tls(cert);
  TestServer server;

  TlsOrigin(asio::io_context& ioc, TestServer::Handler handler) : server(ioc, std::move(handler), tls.get()) {}
  ~TlsOrigin() {
    std::error_code ec;
    std::filesystem::remove_all(cert.dir, ec);
  }
  std::string url(std::string_view host, std::string_view target) const {
    return fmt::format("https://{}:{}{}", host, server.port(), target);
  }
};

asio::awaitable<void> answer_secure(Exchange& ex) { co_await ex.respond(200, "secure"); }
asio::awaitable<void> answer_plain(Exchange& ex) { co_await ex.respond(200, "plain"); }

ClientOptions with_proxy(std::string http_proxy, std::string https_proxy, std::string no_proxy = {}) {
  ClientOptions o;
  o.proxy.http_proxy = std::move(http_proxy);
  o.proxy.https_proxy = std::move(https_proxy);
  o.proxy.no_proxy = std::move(no_proxy);
  o.connect_timeout = 5s;
  o.read_timeout = 5s;
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Settings

TEST_CASE("NO_PROXY entries match hosts, domain suffixes, addresses, CIDR blocks and ports") {
  struct Row {
    const char* no_proxy;
    const char* url;
    bool direct;
  };
  const Row rows[] = {
      {"", "https://huggingface.co/", false},
      {"*", "https://huggingface.co/", true},
      {"huggingface.co", "https://huggingface.co/", true},
      {"huggingface.co", "https://cdn-lfs.huggingface.co/", true},
      {".huggingface.co", "https://cdn-lfs.huggingface.co/", true},
      {".huggingface.co", "https://huggingface.co/", true},
      {"HuggingFace.CO.", "https://huggingface.co/", true},
      {"huggingface.co", "https://nothuggingface.co/", false},
      {"face.co", "https://huggingface.co/", false},
      {"huggingface.co", "https://huggingface.co.evil.example/", false},
      {"example.com, huggingface.co", "https://huggingface.co/", true},
      {"example.com,,  huggingface.co ", "https://huggingface.co/", true},
      {"example.com huggingface.co", "https://huggingface.co/", true},
      {"huggingface.co:443", "https://huggingface.co/", true},
      {"huggingface.co:8443", "https://huggingface.co/", false},
      {"127.0.0.1", "http://127.0.0.1:8080/", true},
      {"127.0.0.1", "http://127.0.0.2:8080/", false},
      {"127.0.0.1:8080", "http://127.0.0.1:8080/", true},
      {"127.0.0.1:8081", "http://127.0.0.1:8080/", false},
      {"10.0.0.0/8", "http://10.20.30.40/", true},
      {"10.0.0.0/8", "http://11.0.0.1/", false},
      {"192.168.1.0/24", "http://192.168.1.77/", true},
      {"192.168.1.0/24", "http://192.168.2.77/", false},
      {"10.0.0.0/8", "http://ten.example/", false},
      {"0.0.0.0/0", "http://203.0.113.9/", true},
      {"::1", "http://[::1]:8080/", true},
      {"::1/128", "http://[::1]:8080/", true},
      {"[::1]", "http://[::1]:8080/", true},
      {"[::1]:8080", "http://[::1]:8080/", true},
      {"[::1]:9090", "http://[::1]:8080/", false},
      {"fd00::/8", "http://[fd12:3456::1]/", true},
      {"fd00::/8", "http://[fe80::1]/", false},
      {"127.0.0.0/8", "http://[::1]/", false},
      {"localhost", "http://127.0.0.1/", false},  // names are not resolved
      {"10.0.0.0/99", "http://10.0.0.1/", false},  // a bad block matches nothing
  };
  for (const auto& row : rows) {
    INFO("NO_PROXY=" << row.no_proxy << " URL " << row.url);
    CHECK(bypasses_proxy(row.no_proxy, Url::parse(row.url).value()) == row.direct);
  }
}

TEST_CASE("a proxy URL is parsed with percent-decoded credentials that are shown nowhere") {
  auto p = ProxyEndpoint::parse("http://us%65r:p%40ss%3Aword@Proxy.Corp:3128/", "https_proxy");
  REQUIRE(p);
  CHECK(p->host == "proxy.corp");
  CHECK(p->port == 3128);
  CHECK(p->username == "user");
  CHECK(p->password == "p@ss:word");
  CHECK(p->redacted() == "http://proxy.corp:3128");
  CHECK(p->authorization() == "Basic dXNlcjpwQHNzOndvcmQ=");  // base64("user:p@ss:word")

  auto bare = ProxyEndpoint::parse("proxy.corp:8080", "http_proxy");
  REQUIRE(bare);
  CHECK(bare->redacted() == "http://proxy.corp:8080");
  CHECK(bare->authorization().empty());

  auto no_port = ProxyEndpoint::parse("http://proxy.corp", "http_proxy");
  REQUIRE(no_port);
  CHECK(no_port->port == 1080);  // curl's default

  auto v6 = ProxyEndpoint::parse("http://[::1]:3128", "http_proxy");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  CHECK(v6->redacted() == "http://[::1]:3128");

  for (const char* bad : {"https://user:secret@proxy.corp:3128", "socks5://user:secret@proxy.corp:1080",
                          "http://user:secret@proxy.corp:99999", "http://user:secret@:3128",
                          "http://user:sec%zzret@proxy.corp:3128"}) {
    auto r = ProxyEndpoint::parse(bad, "https_proxy");
    INFO(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::config_invalid);
    CHECK(contains(r.error().message, "https_proxy"));
    CHECK_FALSE(contains(r.error().message, "secret"));
    CHECK_FALSE(contains(r.error().message, "sec%zz"));
  }
  auto tls = ProxyEndpoint::parse("https://proxy.corp:3128", "https_proxy");
  REQUIRE_FALSE(tls);
  CHECK(contains(tls.error().message, "https://"));
}

TEST_CASE("the proxy is chosen by the URL's scheme and NO_PROXY") {
  ProxyConfig c;
  c.http_proxy = "http://plain.proxy:3128";
  c.https_proxy = "http://tunnel.proxy:3129";
  c.no_proxy = "internal.example";
  auto https = select_proxy(c, Url::parse("https://huggingface.co/x").value());
  REQUIRE(https);
  REQUIRE(*https);
  CHECK((*https)->redacted() == "http://tunnel.proxy:3129");
  auto http = select_proxy(c, Url::parse("http://huggingface.co/x").value());
  REQUIRE(http);
  REQUIRE(*http);
  CHECK((*http)->redacted() == "http://plain.proxy:3128");
  auto direct = select_proxy(c, Url::parse("https://hub.internal.example/x").value());
  REQUIRE(direct);
  CHECK_FALSE(*direct);
  auto none = select_proxy(ProxyConfig{}, Url::parse("https://huggingface.co/x").value());
  REQUIRE(none);
  CHECK_FALSE(*none);
}

TEST_CASE("proxy settings are read from the environment as curl reads them") {
  struct Saved {
    std::string name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* n : {"http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"}) {
    const char* v = std::getenv(n);
    saved.push_back({n, v ? std::optional<std::string>(v) : std::nullopt});
    ::unsetenv(n);
  }
  ::setenv("HTTP_PROXY", "http://cgi-injected:1", 1);
  ::setenv("HTTPS_PROXY", "http://upper:2", 1);
  ::setenv("NO_PROXY", "upper.example", 1);
  auto upper = ProxyConfig::from_environment();
  CHECK(upper.http_proxy.empty());  // HTTP_PROXY is never used (CGI "Proxy:" header)
  CHECK(upper.https_proxy == "http://upper:2");
  CHECK(upper.no_proxy == "upper.example");

  ::setenv("http_proxy", "http://lower:3", 1);
  ::setenv("https_proxy", "http://lower:4", 1);
  ::setenv("no_proxy", "lower.example", 1);
  auto lower = ProxyConfig::from_environment();
  CHECK(lower.http_proxy == "http://lower:3");
  CHECK(lower.https_proxy == "http://lower:4");
  CHECK(lower.no_proxy == "lower.example");

  for (const auto& s : saved) {
    if (s.value) ::setenv(s.name.c_str(), s.value->c_str(), 1);
    else ::unsetenv(s.name.c_str());
  }
}

TEST_CASE("Retry-After is read as seconds or as an HTTP-date in each of its three forms") {
  // 1994-11-06 08:49:07 UTC: 30 s before the RFC's example date.
  const auto now = std::chrono::system_clock::from_time_t(784111747);
  struct Row {
    const char* value;
    std::optional<long> seconds;
  };
  const Row rows[] = {
      {"120", 120},
      {"0", 0},
      {" 7 ", 7},
      {"Sun, 06 Nov 1994 08:49:37 GMT", 30},
      {"Sunday, 06-Nov-94 08:49:37 GMT", 30},
      {"Sun Nov  6 08:49:37 1994", 30},
      {"Sun, 06 Nov 1994 09:49:37 GMT", 3630},
      {"Mon, 07 Nov 1994 08:49:07 GMT", 86400},
      {"Sun, 06 Nov 1994 08:48:37 GMT", 0},   // in the past
      {"Thu, 01 Jan 1970 00:00:00 GMT", 0},   // long past
      {"Sat, 29 Feb 1992 00:00:00 GMT", 0},   // a leap day
      {"", std::nullopt},
      {"soon", std::nullopt},
      {"-5", std::nullopt},
      {"1.5", std::nullopt},
      {"99999999999999999999999", std::nullopt},
      {"Sun, 06 Nov 1994 08:49:37", std::nullopt},      // no zone
      {"Sun, 06 Nov 1994 08:49:37 PST", std::nullopt},  // not GMT
      {"Sun, 31 Nov 1994 08:49:37 GMT", std::nullopt},  // no such day
      {"Sun, 06 Foo 1994 08:49:37 GMT", std::nullopt},
      {"Sun, 06 Nov 1994 25:49:37 GMT", std::nullopt},
      {"Sun Nov 6 08:49:37 1994", std::nullopt},  // asctime pads the day with a space
      {"Sun, 06 Nov 1994 08:49:37 GMT junk", std::nullopt},
  };
  for (const auto& row : rows) {
    INFO("Retry-After: '" << row.value << "'");
    auto r = parse_retry_after(row.value, now);
    REQUIRE(r.has_value() == row.seconds.has_value());
    if (row.seconds) CHECK(r->count() == *row.seconds);
  }
  // A now with a fraction of a second rounds the wait up, never down.
  auto r = parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now + 250ms);
  REQUIRE(r);
  CHECK(r->count() == 30);
  // RFC 850's two-digit year is the latest one not more than 50 years ahead.
  const auto in_2030 = std::chrono::system_clock::from_time_t(1893456000);  // 2030-01-01
  auto y79 = parse_retry_after("Monday, 01-Jan-80 00:00:00 GMT", in_2030);  // 2080 is within 50 years
  REQUIRE(y79);
  CHECK(y79->count() == 50 * 365 * 86400 + 12 * 86400);  // 2030..2080 holds 12 leap days
  auto y81 = parse_retry_after("Wednesday, 01-Jan-81 00:00:00 GMT", in_2030);  // 2081: too far, so 1981
  REQUIRE(y81);
  CHECK(y81->count() == 0);
}

// ---------------------------------------------------------------------------------------------
// Through proxies

TEST_CASE("https through tinyproxy's CONNECT tunnel reaches the origin, trusted through ca_file") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy;
  asio::io_context ioc;
  TlsOrigin origin(ioc, answer_secure);
  auto opts = with_proxy("", proxy.url());
  opts.ca_file = origin.cert.cert;
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(origin.url("localhost", "/api/models/x?y=1"))));
  REQUIRE(r);
  CHECK(r->head.status == 200);
  CHECK(r->body == "secure");
  REQUIRE(origin.server.requests().size() == 1);
  const auto& req = origin.server.requests()[0];
  CHECK(req.target() == "/api/models/x?y=1");
  CHECK(header(req, "Host") == fmt::format("localhost:{}", origin.server.port()));
  CHECK(header(req, "Proxy-Authorization") == "<none>");
  CHECK(contains(proxy.log(), fmt::format("CONNECT localhost:{} HTTP/1.1", origin.server.port())));
}

TEST_CASE("through a proxy the certificate is checked against the origin's name, not the proxy's") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy;
  asio::io_context ioc;
  TlsOrigin origin(ioc, answer_secure);
  // The proxy is named "localhost", the name in the certificate; the origin is 127.0.0.1, which
  // the certificate does not name. Checking the proxy's name would wrongly succeed.
  auto opts = with_proxy("", fmt::format("http://localhost:{}", proxy.port()));
  opts.ca_file = origin.cert.cert;
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(origin.url("127.0.0.1", "/x"))));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
  CHECK(contains(r.error().message, fmt::format("https://127.0.0.1:{}/x", origin.server.port())));
  CHECK(contains(r.error().message, "mismatch"));
  CHECK(origin.server.requests().empty());
  CHECK(contains(proxy.log(), fmt::format("CONNECT 127.0.0.1:{} HTTP/1.1", origin.server.port())));
}

TEST_CASE("the bearer token reaches its origin through the tunnel, unseen by the proxy") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy;
  asio::io_context ioc;
  TlsOrigin origin(ioc, answer_secure);
  auto opts = with_proxy("", proxy.url());
  opts.ca_file = origin.cert.cert;
  opts.auth_origin = origin.url("localhost", "");
  opts.bearer_token = "hf_tunnel_token";
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(origin.url("localhost", "/api/whoami-v2"))));
  REQUIRE(r);
  REQUIRE(origin.server.requests().size() == 1);
  CHECK(header(origin.server.requests()[0], "Authorization") == "Bearer hf_tunnel_token");
  CHECK_FALSE(contains(proxy.log(), "hf_tunnel_token"));
}

TEST_CASE("the proxy sees only CONNECT with its own credentials, never the token") {
  // A TestServer playing the proxy records the CONNECT request exactly and refuses it.
  asio::io_context ioc;
  TestServer fake_proxy(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write(
        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"corp\"\r\n"
        "Content-Length: 6\r\nConnection: close\r\n\r\ndenied");
  });
  auto opts = with_proxy("", fmt::format("http://alice:s3cret%21@127.0.0.1:{}", fake_proxy.port()));
  opts.auth_origin = "https://huggingface.co";
  opts.bearer_token = "hf_never_to_the_proxy";
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get("https://huggingface.co/api/models/x")));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
  CHECK(r.error().message == fmt::format("proxy http://127.0.0.1:{} refused CONNECT to huggingface.co:443: "
                                         "407 Proxy Authentication Required",
                                         fake_proxy.port()));
  REQUIRE(fake_proxy.requests().size() == 1);
  const auto& connect = fake_proxy.requests()[0];
  CHECK(connect.method() == bhttp::verb::connect);
  CHECK(connect.target() == "huggingface.co:443");
  CHECK(header(connect, "Host") == "huggingface.co:443");
  CHECK(header(connect, "Proxy-Authorization") == "Basic YWxpY2U6czNjcmV0IQ==");  // alice:s3cret!
  CHECK(header(connect, "Authorization") == "<none>");
}

TEST_CASE("tinyproxy's Basic authentication: 407 without or with wrong credentials, through with the right ones") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy("BasicAuth alice s3cret");
  asio::io_context ioc;
  TlsOrigin origin(ioc, answer_secure);
  TestServer plain(ioc, answer_plain);
  auto client_for = [&](std::string userinfo) {
    auto opts = with_proxy(proxy.url(userinfo), proxy.url(userinfo));
    opts.ca_file = origin.cert.cert;
    return std::make_unique<Client>(ioc.get_executor(), opts);
  };

  // tinyproxy 1.11 answers 407 without credentials and 401 to wrong ones.
  struct Attempt {
    const char* userinfo;
    unsigned status;
  };
  for (auto [userinfo, status] : {Attempt{"", 407}, Attempt{"alice:wrongpass", 401}}) {
    INFO("credentials '" << userinfo << "'");
    auto client = client_for(userinfo);
    auto r = test::run(ioc, client->request(get(origin.url("localhost", "/x"))));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::network_error);
    CHECK(contains(r.error().message, fmt::format("proxy {} refused CONNECT to localhost:{}: {}", proxy.url(),
                                                  origin.server.port(), status)));
    CHECK_FALSE(contains(r.error().message, "wrongpass"));
    CHECK_FALSE(contains(r.error().message, "alice"));
    // Plain http through the proxy gets the proxy's 407 as a response.
    auto p = test::run(ioc, client->request(get(plain.url("/y"))));
    REQUIRE(p);
    CHECK(p->head.status == status);
  }
  CHECK(origin.server.requests().empty());
  CHECK(plain.requests().empty());

  auto client = client_for("alice:s3cret");
  auto r = test::run(ioc, client->request(get(origin.url("localhost", "/x"))));
  REQUIRE(r);
  CHECK(r->body == "secure");
  auto p = test::run(ioc, client->request(get(plain.url("/y"))));
  REQUIRE(p);
  CHECK(p->body == "plain");
  REQUIRE(origin.server.requests().size() == 1);
  CHECK(header(origin.server.requests()[0], "Proxy-Authorization") == "<none>");
  REQUIRE(plain.requests().size() == 1);
  CHECK(header(plain.requests()[0], "Proxy-Authorization") == "<none>");
}

TEST_CASE("plain http through tinyproxy is forwarded to the origin") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy;
  asio::io_context ioc;
  TestServer origin(ioc, answer_plain);
  Client client(ioc.get_executor(), with_proxy(proxy.url(), ""));
  auto r = test::run(ioc, client.request(get(origin.url("/v1/models?a=b"))));
  REQUIRE(r);
  CHECK(r->body == "plain");
  REQUIRE(origin.requests().size() == 1);
  CHECK(origin.requests()[0].target() == "/v1/models?a=b");
  CHECK(contains(header(origin.requests()[0], "Via"), "tinyproxy"));
}

TEST_CASE("plain http to a proxy is sent in absolute form with the proxy's credentials") {
  asio::io_context ioc;
  TestServer fake_proxy(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, "via proxy"); });
  Client client(ioc.get_executor(), with_proxy(fmt::format("bob:pw@127.0.0.1:{}", fake_proxy.port()), ""));
  auto r = test::run(ioc, client.request(get("http://models.internal:8000/v1/models?a=b")));
  REQUIRE(r);
  CHECK(r->body == "via proxy");
  REQUIRE(fake_proxy.requests().size() == 1);
  const auto& req = fake_proxy.requests()[0];
  CHECK(req.target() == "http://models.internal:8000/v1/models?a=b");
  CHECK(header(req, "Host") == "models.internal:8000");
  CHECK(header(req, "Proxy-Authorization") == "Basic Ym9iOnB3");  // bob:pw
}

TEST_CASE("NO_PROXY by address, CIDR block or name bypasses a proxy that is not there") {
  asio::io_context ioc;
  TestServer plain(ioc, answer_plain);
  TlsOrigin origin(ioc, answer_secure);
  const std::string dead = fmt::format("http://127.0.0.1:{}", closed_port());

  auto attempt = [&](const std::string& no_proxy, const std::string& url) {
    auto opts = with_proxy(dead, dead, no_proxy);
    opts.ca_file = origin.cert.cert;
    Client client(ioc.get_executor(), opts);
    return test::run(ioc, client.request(get(url)));
  };
  // Without a matching entry the dead proxy is used and fails: the bypass below is real.
  auto via = attempt("example.com", plain.url("/a"));
  REQUIRE_FALSE(via);
  CHECK(contains(via.error().message, dead));

  for (const char* no_proxy : {"127.0.0.1", "127.0.0.0/8", "example.com, 10.0.0.0/8,127.0.0.0/8", "*"}) {
    INFO("NO_PROXY=" << no_proxy);
    auto r = attempt(no_proxy, plain.url("/a"));
    REQUIRE(r);
    CHECK(r->body == "plain");
  }
  auto tls = attempt("example.com,localhost", origin.url("localhost", "/b"));
  REQUIRE(tls);
  CHECK(tls->body == "secure");
}

TEST_CASE("a proxy that is not listening is named in the error, without its credentials") {
  asio::io_context ioc;
  auto port = closed_port();
  const std::string proxy = fmt::format("http://user:secret@127.0.0.1:{}", port);
  Client client(ioc.get_executor(), with_proxy(proxy, proxy));
  for (const char* url : {"https://huggingface.co/api/models/x", "http://models.internal:8000/v1/models"}) {
    INFO(url);
    auto r = test::run(ioc, client.request(get(url)));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::network_error);
    CHECK(contains(r.error().message, fmt::format("proxy http://127.0.0.1:{}", port)));
    CHECK(contains(r.error().message, Url::parse(url).value().redacted()));
    CHECK_FALSE(contains(r.error().message, "secret"));
    CHECK_FALSE(contains(r.error().message, "user:"));
  }
}

TEST_CASE("an https:// proxy is refused with a clear error") {
  asio::io_context ioc;
  Client client(ioc.get_executor(), with_proxy("", "https://user:secret@proxy.corp:3128"));
  auto r = test::run(ioc, client.request(get("https://huggingface.co/x")));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::config_invalid);
  CHECK(contains(r.error().message, "https_proxy 'https://proxy.corp:3128'"));
  CHECK_FALSE(contains(r.error().message, "secret"));
}

TEST_CASE("a redirect decides again whether to use the proxy") {
  REQUIRE_TINYPROXY();
  Tinyproxy proxy;
  asio::io_context ioc;
  TestServer second(ioc, answer_plain);
  TestServer first(ioc, [&](Exchange& ex) -> asio::awaitable<void> {
    test::HeaderList h{{"Location", second.url("/next")}};
    co_await ex.respond(302, "", std::move(h));
  });
  // "localhost" goes through the proxy; the redirect target 127.0.0.1 is in NO_PROXY.
  Client client(ioc.get_executor(), with_proxy(proxy.url(), "", "127.0.0.1"));
  auto r = test::run(ioc, client.request(get(fmt::format("http://localhost:{}/start", first.port()))));
  REQUIRE(r);
  CHECK(r->body == "plain");
  REQUIRE(first.requests().size() == 1);
  CHECK(contains(header(first.requests()[0], "Via"), "tinyproxy"));
  REQUIRE(second.requests().size() == 1);
  CHECK(header(second.requests()[0], "Via") == "<none>");
}
