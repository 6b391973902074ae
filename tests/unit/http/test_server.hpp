#pragma once
// A small in-process HTTP/1.1 server for unit tests: listens on 127.0.0.1 (port 0), reads one
// request per connection, records it and hands it to a handler coroutine that writes raw bytes,
// so a test can cut a body short, stall, send chunked bodies or redirect to another server.
// Optionally speaks TLS with a certificate made at test time (make_test_certificate()).
// Runs on the test's io_context, on the same thread as the client under test.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include <fmt/format.h>

#include "http/client.hpp"
#include "unit/http/catch_result.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace modeld::test {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using asio::awaitable;

/// Extra response headers, name and value. (Build a list in a variable before co_await: GCC 12
/// miscompiles braced lists of string literals inside a co_await expression.)
using HeaderList = std::vector<std::pair<std::string, std::string>>;

/// The value of header `name` of a received request, or "<none>".
inline std::string header(const bhttp::request<bhttp::string_body>& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string("<none>") : std::string(it->value());
}

/// A GET request of `url` (which must parse).
inline http::Request get(const std::string& url) {
  http::Request r;
  r.url = http::Url::parse(url).value();
  return r;
}

/// One request received by a TestServer and the means to answer it.
class Exchange {
 public:
  bhttp::request<bhttp::string_body> request;

  /// Writes raw bytes (status line, headers, body: whatever the test wants on the wire).
  awaitable<void> write(std::string raw) {
    if (tls_) co_await asio::async_write(*tls_, asio::buffer(raw), asio::as_tuple(asio::use_awaitable));
    else co_await asio::async_write(*tcp_, asio::buffer(raw), asio::as_tuple(asio::use_awaitable));
  }

  /// Writes a complete response with Content-Length.
  awaitable<void> respond(unsigned status, std::string body,
                          HeaderList headers = {}) {
    std::string raw = fmt::format("HTTP/1.1 {} Test\r\nContent-Length: {}\r\n", status, body.size());
    for (const auto& [k, v] : headers) raw += fmt::format("{}: {}\r\n", k, v);
    raw += "Connection: close\r\n\r\n";
    raw += body;
    co_await write(std::move(raw));
  }

  /// Never answers: waits until the io_context is stopped or destroyed.
  awaitable<void> stall() {
    asio::steady_timer t(co_await asio::this_coro::executor);
    t.expires_after(std::chrono::hours(1));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  }

 private:
  friend class TestServer;
  asio::ip::tcp::socket* tcp_ = nullptr;
  asio::ssl::stream<asio::ip::tcp::socket>* tls_ = nullptr;
};

/// The server; requests() records every request in arrival order.
class TestServer {
 public:
  using Handler = std::function<awaitable<void>(Exchange&)>;

  /// Starts listening on 127.0.0.1 with a free port; `tls` (a server context) makes it HTTPS.
  TestServer(asio::io_context& ioc, Handler handler, asio::ssl::context* tls = nullptr)
      : state_(std::make_shared<State>(ioc)) {
    state_->handler = std::move(handler);
    state_->tls = tls;
    asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    state_->acceptor.open(ep.protocol());
    state_->acceptor.set_option(asio::socket_base::reuse_address(true));
    state_->acceptor.bind(ep);
    state_->acceptor.listen();
    asio::co_spawn(ioc, accept_loop(state_), asio::detached);
  }

  ~TestServer() {
    boost::system::error_code ec;
    state_->acceptor.close(ec);
  }

  std::uint16_t port() const { return state_->acceptor.local_endpoint().port(); }

  /// "http://127.0.0.1:PORT" + target (https with TLS).
  std::string url(std::string_view target = "/") const {
    return fmt::format("{}://127.0.0.1:{}{}", state_->tls ? "https" : "http", port(), target);
  }

  const std::vector<bhttp::request<bhttp::string_body>>& requests() const { return state_->requests; }

 private:
  struct State {
    explicit State(asio::io_context& ioc) : acceptor(ioc) {}
    asio::ip::tcp::acceptor acceptor;
    Handler handler;
    asio::ssl::context* tls = nullptr;
    std::vector<bhttp::request<bhttp::string_body>> requests;
  };

  static awaitable<void> accept_loop(std::shared_ptr<State> state) {
    for (;;) {
      auto [ec, socket] = co_await state->acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      asio::co_spawn(state->acceptor.get_executor(), serve(state, std::move(socket)), asio::detached);
    }
  }

  template <class Stream>
  static awaitable<bool> read_request(Stream& stream, Exchange& ex) {
    boost::beast::flat_buffer buffer;
    auto [ec, n] = co_await bhttp::async_read(stream, buffer, ex.request, asio::as_tuple(asio::use_awaitable));
    (void)n;
    co_return !ec;
  }

  static awaitable<void> serve(std::shared_ptr<State> state, asio::ip::tcp::socket socket) {
    Exchange ex;
    std::optional<asio::ssl::stream<asio::ip::tcp::socket>> tls;
    if (state->tls) {
      tls.emplace(std::move(socket), *state->tls);
      auto [ec] = co_await tls->async_handshake(asio::ssl::stream_base::server, asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;  // the client refused our certificate
      ex.tls_ = &*tls;
      if (!co_await read_request(*tls, ex)) co_return;
    } else {
      ex.tcp_ = &socket;
      if (!co_await read_request(socket, ex)) co_return;
    }
    state->requests.push_back(ex.request);
    co_await state->handler(ex);
    boost::system::error_code ec;
    if (tls) {
      tls->next_layer().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
      tls->next_layer().close(ec);
    } else {
      socket.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
      socket.close(ec);
    }
  }

  std::shared_ptr<State> state_;
};

/// Runs `task` on `ioc` until it finishes (at most `limit`), returning its value; fails the test
/// when it does not finish in time and rethrows what it threw.
template <class T>
T run(asio::io_context& ioc, awaitable<T> task, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::optional<T> out;
  std::exception_ptr error;
  ioc.restart();
  asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr e, T value) {
    error = e;
    if (!e) out.emplace(std::move(value));
    ioc.stop();
  });
  ioc.run_for(limit);
  if (error) std::rethrow_exception(error);
  if (!out) FAIL("the task did not finish within the time limit");
  return std::move(*out);
}

/// Runs `task` like run(), with a cancellation signal bound to it; `cancel_when` is polled after
/// every handler and, once true, emits `type` on the signal.
template <class T>
T run_cancelling(asio::io_context& ioc, awaitable<T> task, std::function<bool()> cancel_when,
                 asio::cancellation_type type = asio::cancellation_type::terminal,
                 std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::optional<T> out;
  std::exception_ptr error;
  asio::cancellation_signal signal;
  ioc.restart();
  asio::co_spawn(ioc, std::move(task),
                 asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, T value) {
                   error = e;
                   if (!e) out.emplace(std::move(value));
                   ioc.stop();
                 }));
  auto end = std::chrono::steady_clock::now() + limit;
  bool emitted = false;
  while (!ioc.stopped() && std::chrono::steady_clock::now() < end) {
    ioc.run_one_for(std::chrono::milliseconds(50));
    if (!emitted && !out && !error && cancel_when()) {
      emitted = true;
      signal.emit(type);
    }
  }
  if (error) std::rethrow_exception(error);
  if (!out) FAIL("the task did not finish within the time limit");
  return std::move(*out);
}

/// A self-signed certificate for "localhost" (DNS name only, so 127.0.0.1 does not match it),
/// made with the openssl command in a fresh temporary folder.
struct TestCertificate {
  std::filesystem::path dir, cert, key;
};

inline TestCertificate make_test_certificate() {
  char tmpl[] = "/tmp/modeld-test-cert-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  TestCertificate c{tmpl, std::filesystem::path(tmpl) / "cert.pem", std::filesystem::path(tmpl) / "key.pem"};
  auto cmd = fmt::format(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost -keyout {} -out {} >/dev/null 2>&1",
      c.key.string(), c.cert.string());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("openssl req failed: " + cmd);
  return c;
}

/// A TLS server context presenting `cert`.
inline std::unique_ptr<asio::ssl::context> make_server_tls(const TestCertificate& cert) {
  auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  ctx->use_certificate_chain_file(cert.cert.string());
  ctx->use_private_key_file(cert.key.string(), asio::ssl::context::pem);
  return ctx;
}

}  // namespace modeld::test
