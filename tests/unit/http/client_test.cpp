#include "http/client.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <string>

using namespace modeld;
using namespace modeld::http;
using modeld::test::Exchange;
using modeld::test::TestServer;
using modeld::test::get;
using modeld::test::header;
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

namespace {



// A port on which nothing listens: bound, then closed.
std::uint16_t closed_port(asio::io_context& ioc) {
  asio::ip::tcp::acceptor a(ioc, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  auto port = a.local_endpoint().port();
  a.close();
  return port;
}

struct Collected {
  Result<ResponseHead> head = make_error(Errc::internal, "not run");
  std::string body;
  std::vector<std::size_t> blocks;
};

asio::awaitable<Collected> stream_all(Client& client, Request req) {
  Collected c;
  BodySink sink;
  sink.on_head = [](const ResponseHead&) -> Result<void> { return {}; };
  sink.on_data = [&](std::span<const char> d) -> asio::awaitable<Result<void>> {
    c.body.append(d.data(), d.size());
    c.blocks.push_back(d.size());
    co_return Result<void>{};
  };
  c.head = co_await client.stream(std::move(req), sink);
  co_return c;
}

}  // namespace

TEST_CASE("a response body is collected with its status and headers") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    test::HeaderList h{{"ETag", "\"abc\""}};
    co_await ex.respond(200, "hello", std::move(h));
  });
  Client client(ioc.get_executor(), {});
  auto r = test::run(ioc, client.request(get(server.url("/file?x=1"))));
  REQUIRE(r);
  CHECK(r->head.status == 200);
  CHECK(r->body == "hello");
  CHECK(r->head.content_length == std::optional<std::uint64_t>(5));
  CHECK(r->head.headers.get("etag") == std::optional<std::string>("\"abc\""));
  CHECK(r->head.redirects.empty());
  REQUIRE(server.requests().size() == 1);
  const auto& req = server.requests()[0];
  CHECK(req.target() == "/file?x=1");
  CHECK(header(req, "Host") == fmt::format("127.0.0.1:{}", server.port()));
  CHECK(header(req, "Accept-Encoding") == "identity");
  CHECK(header(req, "User-Agent").rfind("modeld/", 0) == 0);
  CHECK(header(req, "Authorization") == "<none>");
}

TEST_CASE("a non-2xx answer is returned as a response, not an error") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(404, "no"); });
  Client client(ioc.get_executor(), {});
  auto r = test::run(ioc, client.request(get(server.url("/x"))));
  REQUIRE(r);
  CHECK(r->head.status == 404);
  CHECK(r->body == "no");
}

TEST_CASE("a POST sends its body and content type") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, ex.request.body()); });
  Client client(ioc.get_executor(), {});
  Request req = get(server.url("/v1/completions"));
  req.method = "POST";
  req.body = R"({"a":1})";
  req.content_type = "application/json";
  auto r = test::run(ioc, client.request(req));
  REQUIRE(r);
  CHECK(r->body == R"({"a":1})");
  CHECK(header(server.requests()[0], "Content-Type") == "application/json");
  CHECK(server.requests()[0].method_string() == "POST");
}

TEST_CASE("a streamed body arrives whole and in blocks of at most 1 MiB") {
  asio::io_context ioc;
  std::string big(3 * 1024 * 1024 + 123, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  TestServer server(ioc, [&](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, big); });
  Client client(ioc.get_executor(), {});
  auto c = test::run(ioc, stream_all(client, get(server.url("/big"))));
  REQUIRE(c.head);
  CHECK(c.head->status == 200);
  CHECK(c.body == big);
  for (auto n : c.blocks) CHECK(n <= (1u << 20));
}

TEST_CASE("a chunked body is decoded") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  });
  Client client(ioc.get_executor(), {});
  auto c = test::run(ioc, stream_all(client, get(server.url("/c"))));
  REQUIRE(c.head);
  CHECK_FALSE(c.head->content_length);
  CHECK(c.body == "hello world");
}

TEST_CASE("a body cut short of its Content-Length is network_error after the bytes that arrived") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
  });
  Client client(ioc.get_executor(), {});
  auto c = test::run(ioc, stream_all(client, get(server.url("/cut?sig=SECRET"))));
  REQUIRE_FALSE(c.head);
  CHECK(c.head.error().code == Errc::network_error);
  CHECK(c.body == "0123456789");
  CHECK(c.head.error().message.find("/cut") != std::string::npos);
  CHECK(c.head.error().message.find("SECRET") == std::string::npos);

  auto r = test::run(ioc, client.request(get(server.url("/cut"))));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
}

TEST_CASE("a chunked body without its last chunk is network_error after the bytes that arrived") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  });
  Client client(ioc.get_executor(), {});
  auto c = test::run(ioc, stream_all(client, get(server.url("/c"))));
  REQUIRE_FALSE(c.head);
  CHECK(c.head.error().code == Errc::network_error);
  CHECK(c.body == "hello");
}

TEST_CASE("a stalled server is a timeout after the read timeout") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc");
    co_await ex.stall();
  });
  ClientOptions opts;
  opts.read_timeout = std::chrono::milliseconds(300);
  Client client(ioc.get_executor(), opts);
  auto start = std::chrono::steady_clock::now();
  auto c = test::run(ioc, stream_all(client, get(server.url("/slow"))));
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(c.head);
  CHECK(c.head.error().code == Errc::timeout);
  CHECK(c.body == "abc");
  CHECK(took >= std::chrono::milliseconds(250));
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("a per-request timeout overrides the client's read timeout") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.stall(); });
  Client client(ioc.get_executor(), {});
  Request req = get(server.url("/slow"));
  req.timeout = std::chrono::milliseconds(200);
  auto r = test::run(ioc, client.request(req));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::timeout);
}

TEST_CASE("nothing listening is network_error naming the URL") {
  asio::io_context ioc;
  auto port = closed_port(ioc);
  Client client(ioc.get_executor(), {});
  auto r = test::run(ioc, client.request(get(fmt::format("http://127.0.0.1:{}/health?token=SECRET", port))));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
  CHECK(r.error().message.find(fmt::format("127.0.0.1:{}/health", port)) != std::string::npos);
  CHECK(r.error().message.find("SECRET") == std::string::npos);
}

TEST_CASE("a redirect to another origin drops the token and records the redirect's headers") {
  asio::io_context ioc;
  TestServer cdn(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, "blob"); });
  TestServer hub(ioc, [&](Exchange& ex) -> asio::awaitable<void> {
    test::HeaderList h{{"Location", cdn.url("/blob?sig=SECRET")}, {"X-Linked-Etag", "\"sha\""}};
    co_await ex.respond(302, "", std::move(h));
  });
  ClientOptions opts;
  opts.auth_origin = hub.url("");
  opts.bearer_token = "hf_TOKEN";
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(hub.url("/org/name/resolve/c/f.bin"))));
  REQUIRE(r);
  CHECK(r->body == "blob");
  CHECK(r->head.url.port == cdn.port());
  REQUIRE(r->head.redirects.size() == 1);
  CHECK(r->head.redirects[0].get("X-Linked-Etag") == std::optional<std::string>("\"sha\""));
  REQUIRE(hub.requests().size() == 1);
  REQUIRE(cdn.requests().size() == 1);
  CHECK(header(hub.requests()[0], "Authorization") == "Bearer hf_TOKEN");
  CHECK(header(cdn.requests()[0], "Authorization") == "<none>");
  CHECK(cdn.requests()[0].target() == "/blob?sig=SECRET");
}

TEST_CASE("a same-origin relative redirect keeps the token") {
  asio::io_context ioc;
  TestServer hub(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    if (ex.request.target() == "/old/resolve/c/f") {
      test::HeaderList h{{"Location", "/new/resolve/c/f"}};
      co_await ex.respond(307, "", std::move(h));
    }
    else co_await ex.respond(200, "moved");
  });
  ClientOptions opts;
  opts.auth_origin = hub.url("");
  opts.bearer_token = "hf_TOKEN";
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(hub.url("/old/resolve/c/f"))));
  REQUIRE(r);
  CHECK(r->body == "moved");
  REQUIRE(hub.requests().size() == 2);
  CHECK(hub.requests()[1].target() == "/new/resolve/c/f");
  CHECK(header(hub.requests()[0], "Authorization") == "Bearer hf_TOKEN");
  CHECK(header(hub.requests()[1], "Authorization") == "Bearer hf_TOKEN");
}

TEST_CASE("a caller's Authorization header does not follow a redirect to another origin") {
  asio::io_context ioc;
  TestServer other(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, "ok"); });
  TestServer first(ioc, [&](Exchange& ex) -> asio::awaitable<void> {
    test::HeaderList h{{"Location", other.url("/x")}};
    co_await ex.respond(302, "", std::move(h));
  });
  Client client(ioc.get_executor(), {});
  Request req = get(first.url("/x"));
  req.headers.add("Authorization", "Bearer api-key");
  auto r = test::run(ioc, client.request(req));
  REQUIRE(r);
  CHECK(header(first.requests()[0], "Authorization") == "Bearer api-key");
  CHECK(header(other.requests()[0], "Authorization") == "<none>");
}

TEST_CASE("more redirects than max_redirects is hub_bad_response") {
  asio::io_context ioc;
  TestServer loop(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    test::HeaderList h{{"Location", "/again"}};
    co_await ex.respond(302, "", std::move(h));
  });
  ClientOptions opts;
  opts.max_redirects = 3;
  Client client(ioc.get_executor(), opts);
  auto r = test::run(ioc, client.request(get(loop.url("/start"))));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::hub_bad_response);
  CHECK(r.error().message.find("redirects") != std::string::npos);
  CHECK(loop.requests().size() == 4);
}

TEST_CASE("a 303 answer to a POST is followed with a GET without body") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    if (ex.request.target() == "/post") {
      test::HeaderList h{{"Location", "/result"}};
      co_await ex.respond(303, "", std::move(h));
    }
    else co_await ex.respond(200, std::string(ex.request.method_string()));
  });
  Client client(ioc.get_executor(), {});
  Request req = get(server.url("/post"));
  req.method = "POST";
  req.body = "data";
  auto r = test::run(ioc, client.request(req));
  REQUIRE(r);
  CHECK(r->body == "GET");
  CHECK(server.requests()[1].body().empty());
}

TEST_CASE("a body over max_body is hub_bad_response") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    if (ex.request.target() == "/length") co_await ex.respond(200, std::string(100, 'x'));
    else co_await ex.write("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + std::string(100, 'x'));
  });
  Client client(ioc.get_executor(), {});
  auto a = test::run(ioc, client.request(get(server.url("/length")), 10));
  REQUIRE_FALSE(a);
  CHECK(a.error().code == Errc::hub_bad_response);
  auto b = test::run(ioc, client.request(get(server.url("/close-delimited")), 10));
  REQUIRE_FALSE(b);
  CHECK(b.error().code == Errc::hub_bad_response);
  auto c = test::run(ioc, client.request(get(server.url("/close-delimited")), 100));
  REQUIRE(c);
  CHECK(c->body.size() == 100);
}

TEST_CASE("an error from the sink stops the stream and is returned") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(416, "range"); });
  Client client(ioc.get_executor(), {});
  BodySink sink;
  bool data_called = false;
  sink.on_head = [](const ResponseHead& h) -> Result<void> {
    if (h.status != 200) return make_error(Errc::hub_bad_response, fmt::format("status {}", h.status));
    return {};
  };
  sink.on_data = [&](std::span<const char>) -> asio::awaitable<Result<void>> {
    data_called = true;
    co_return Result<void>{};
  };
  auto r = test::run(ioc, client.stream(get(server.url("/x")), sink));
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "status 416");
  CHECK_FALSE(data_called);
}

TEST_CASE("cancelling the awaiting coroutine aborts a stalled read promptly") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.stall(); });
  Client client(ioc.get_executor(), {});  // 30 s read timeout: only the cancellation can end it soon
  auto start = std::chrono::steady_clock::now();
  auto r = test::run_cancelling(ioc, client.request(get(server.url("/stall"))),
                                [&] { return server.requests().size() == 1; });
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::cancelled);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("cancelling the awaiting coroutine aborts a stream while its sink waits") {
  asio::io_context ioc;
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc");
    co_await ex.stall();
  });
  Client client(ioc.get_executor(), {});
  bool got_data = false;
  BodySink sink;
  sink.on_data = [&](std::span<const char>) -> asio::awaitable<Result<void>> {
    got_data = true;
    co_return Result<void>{};
  };
  auto r = test::run_cancelling(ioc, client.stream(get(server.url("/s")), sink), [&] { return got_data; });
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::cancelled);
}

TEST_CASE("TLS: a server whose CA is unknown is refused") {
  asio::io_context ioc;
  auto cert = test::make_test_certificate();
  auto tls = test::make_server_tls(cert);
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, "secure"); }, tls.get());
  Client client(ioc.get_executor(), {});
  auto r = test::run(ioc, client.request(get(fmt::format("https://localhost:{}/x", server.port()))));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::network_error);
  CHECK(r.error().message.find("certificate") != std::string::npos);
  CHECK(server.requests().empty());
  std::filesystem::remove_all(cert.dir);
}

TEST_CASE("TLS: a server is trusted through ca_file and its name is checked") {
  asio::io_context ioc;
  auto cert = test::make_test_certificate();
  auto tls = test::make_server_tls(cert);
  TestServer server(ioc, [](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, "secure"); }, tls.get());
  ClientOptions opts;
  opts.ca_file = cert.cert;
  Client client(ioc.get_executor(), opts);

  auto ok = test::run(ioc, client.request(get(fmt::format("https://localhost:{}/x", server.port()))));
  REQUIRE(ok);
  CHECK(ok->body == "secure");
  CHECK(header(server.requests().at(0), "Host") == fmt::format("localhost:{}", server.port()));

  // The certificate names "localhost" only: reached as 127.0.0.1 it does not match.
  auto wrong = test::run(ioc, client.request(get(fmt::format("https://127.0.0.1:{}/x", server.port()))));
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code == Errc::network_error);
  CHECK(server.requests().size() == 1);
  std::filesystem::remove_all(cert.dir);
}

TEST_CASE("a ca_file that cannot be loaded makes the constructor throw") {
  asio::io_context ioc;
  ClientOptions opts;
  opts.ca_file = "/nonexistent/ca.pem";
  CHECK_THROWS_AS(Client(ioc.get_executor(), opts), std::runtime_error);
}
