#include "http/client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace modeld::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using asio::awaitable;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kBlockSize = 1u << 20;       // body blocks handed to a sink
constexpr std::uint32_t kHeaderLimit = 64u << 10;  // the Hub's 302s carry many headers

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = lower(c);
  return out;
}

std::uint16_t default_port(std::string_view scheme) { return scheme == "https" ? 443 : 80; }

// Text shown in an error about a URL that did not parse: everything before the query, since
// a signed CDN URL carries its signature there.
std::string without_query(std::string_view text) {
  return std::string(text.substr(0, text.find_first_of("?#")));
}

std::string host_for_url(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// RFC 3986 section 5.2.4, on a path without its query.
std::string remove_dot_segments(std::string_view in) {
  std::vector<std::string_view> out;
  bool trailing_slash = false;
  std::size_t pos = 0;
  while (pos <= in.size()) {
    auto slash = in.find('/', pos);
    auto seg = in.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    bool last = slash == std::string_view::npos;
    trailing_slash = false;
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
      trailing_slash = true;
    } else if (seg == ".") {
      trailing_slash = true;
    } else if (!(seg.empty() && pos == 0)) {
      out.push_back(seg);
    }
    if (last) break;
    pos = slash + 1;
  }
  std::string path;
  for (auto seg : out) {
    path += '/';
    path += seg;
  }
  if (trailing_slash || path.empty()) path += '/';
  return path;
}

bool is_redirect(unsigned status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

bool is_ip_address(const std::string& host) {
  error_code ec;
  (void)asio::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Url

Result<Url> Url::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::bad_request, fmt::format("bad URL '{}': {}", without_query(text), why));
  };
  for (unsigned char c : text)
    if (c <= 0x20 || c == 0x7f) return bad("it contains a space or control character");
  auto colon = text.find("://");
  if (colon == std::string_view::npos) return bad("it is not absolute (scheme://host/...)");
  Url url;
  url.scheme = to_lower(text.substr(0, colon));
  if (url.scheme != "http" && url.scheme != "https") return bad("the scheme is not http or https");
  auto rest = text.substr(colon + 3);
  auto auth_end = rest.find_first_of("/?#");
  auto authority = rest.substr(0, auth_end);
  auto target = auth_end == std::string_view::npos ? std::string_view{} : rest.substr(auth_end);
  target = target.substr(0, target.find('#'));
  if (authority.find('@') != std::string_view::npos) return bad("user information in URLs is not supported");
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    auto close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '[' in the host");
    url.host = std::string(authority.substr(1, close - 1));
    auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after the host");
      port_text = after.substr(1);
    }
  } else {
    auto pc = authority.rfind(':');
    url.host = std::string(authority.substr(0, pc));
    if (pc != std::string_view::npos) port_text = authority.substr(pc + 1);
  }
  url.host = to_lower(url.host);
  if (url.host.empty()) return bad("the host is empty");
  url.port = default_port(url.scheme);
  if (!port_text.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || p != port_text.data() + port_text.size() || port == 0 || port > 65535)
      return bad("the port is not a number from 1 to 65535");
    url.port = static_cast<std::uint16_t>(port);
  }
  if (target.empty()) url.target = "/";
  else if (target.front() == '?') url.target = "/" + std::string(target);
  else url.target = std::string(target);
  return url;
}

std::string Url::origin() const { return fmt::format("{}://{}:{}", scheme, host_for_url(host), port); }

std::string Url::str() const {
  if (port == default_port(scheme)) return fmt::format("{}://{}{}", scheme, host_for_url(host), target);
  return fmt::format("{}://{}:{}{}", scheme, host_for_url(host), port, target);
}

std::string Url::redacted() const { return origin() + without_query(target); }

Result<Url> Url::resolve(std::string_view location) const {
  if (location.find("://") != std::string_view::npos &&
      location.find("://") < location.find_first_of("/?#"))
    return parse(location);
  if (location.substr(0, 2) == "//") return parse(scheme + ":" + std::string(location));
  for (unsigned char c : location)
    if (c <= 0x20 || c == 0x7f)
      return make_error(Errc::bad_request, fmt::format("bad redirect location '{}' from {}",
                                                       without_query(location), redacted()));
  Url out = *this;
  location = location.substr(0, location.find('#'));
  std::string_view base_path = std::string_view(target).substr(0, target.find('?'));
  if (location.empty()) {
    out.target = target;
  } else if (location.front() == '?') {
    out.target = std::string(base_path) + std::string(location);
  } else {
    auto q = location.find('?');
    auto path = location.substr(0, q);
    auto query = q == std::string_view::npos ? std::string_view{} : location.substr(q);
    std::string merged;
    if (path.front() == '/') merged = std::string(path);
    else merged = std::string(base_path.substr(0, base_path.rfind('/') + 1)) + std::string(path);
    out.target = remove_dot_segments(merged) + std::string(query);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Headers

std::optional<std::string> Headers::get(std::string_view name) const {
  for (const auto& [k, v] : items)
    if (iequals(k, name)) return v;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Connections

namespace {

// One connection to one origin, plain or TLS. New connections are made per request for now; a
// pool keyed by Url::origin() can keep these between requests later (keep_alive() answers says
// whether one may be reused).
struct Connection {
  std::optional<beast::tcp_stream> tcp;
  std::optional<ssl::stream<beast::tcp_stream>> tls;

  beast::tcp_stream& lowest() { return tls ? tls->next_layer() : *tcp; }
};

// What one socket operation's error means for the caller. Beast reports an expired deadline as
// beast::error::timeout; operation_aborted without an expired deadline is the caller's
// cancellation.
Error socket_error(const error_code& ec, std::string_view doing, const Url& url) {
  if (ec == beast::error::timeout)
    return make_error(Errc::timeout, fmt::format("{} {}: timed out", doing, url.redacted()));
  if (ec == asio::error::operation_aborted)
    return make_error(Errc::cancelled, fmt::format("{} {}: cancelled", doing, url.redacted()));
  return make_error(Errc::network_error, fmt::format("{} {}: {}", doing, url.redacted(), ec.message()));
}

struct HopContext {
  const Url& url;
  std::chrono::milliseconds read_timeout;
  BodySink& sink;
  std::vector<Headers>& redirects;
  unsigned redirects_left;
};

// The outcome of one request/response exchange: a redirect to follow, or the final head (whose
// body has then been delivered to the sink).
struct Hop {
  std::optional<ResponseHead> final_head;
  unsigned redirect_status = 0;
  std::string location;
};

ResponseHead make_head(const bhttp::response_parser<bhttp::buffer_body>& p, const Url& url) {
  ResponseHead head;
  const auto& msg = p.get();
  head.status = msg.result_int();
  for (const auto& f : msg) head.headers.add(std::string(f.name_string()), std::string(f.value()));
  if (p.content_length()) head.content_length = *p.content_length();
  head.url = url;
  return head;
}

template <class Stream>
awaitable<Result<Hop>> exchange(Stream& stream, beast::tcp_stream& lowest,
                                bhttp::request<bhttp::string_body>& req, HopContext ctx) {
  lowest.expires_after(ctx.read_timeout);
  auto [wec, wn] = co_await bhttp::async_write(stream, req, kTuple);
  (void)wn;
  if (wec) co_return socket_error(wec, "sending the request to", ctx.url);

  beast::flat_buffer buffer;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser_slot;
  for (;;) {
    parser_slot.emplace();
    parser_slot->header_limit(kHeaderLimit);
    parser_slot->body_limit(boost::none);  // limits belong to the sink (request() enforces max_body)
    if (req.method() == bhttp::verb::head) parser_slot->skip(true);
    lowest.expires_after(ctx.read_timeout);
    auto [ec, n] = co_await bhttp::async_read_header(stream, buffer, *parser_slot, kTuple);
    (void)n;
    if (ec) co_return socket_error(ec, "reading the answer of", ctx.url);
    // Interim 1xx answers (100 Continue) come before the real one.
    if (parser_slot->get().result_int() >= 200) break;
  }
  auto& parser = *parser_slot;

  unsigned status = parser.get().result_int();
  auto location = parser.get().find(bhttp::field::location);
  if (is_redirect(status) && location != parser.get().end()) {
    if (ctx.redirects_left == 0)
      co_return make_error(Errc::hub_bad_response,
                           fmt::format("too many redirects ({}) ending at {}", ctx.redirects.size(),
                                       ctx.url.redacted()));
    ctx.redirects.push_back(make_head(parser, ctx.url).headers);
    Hop hop;
    hop.redirect_status = status;
    hop.location = std::string(location->value());
    co_return hop;  // the redirect's body is dropped with the connection
  }

  ResponseHead head = make_head(parser, ctx.url);
  head.redirects = ctx.redirects;
  if (ctx.sink.on_head)
    if (auto r = ctx.sink.on_head(head); !r) co_return r.error();

  std::vector<char> block(kBlockSize);
  std::size_t filled = 0;
  std::uint64_t delivered = 0;
  auto deliver = [&]() -> awaitable<Result<void>> {
    if (filled == 0) co_return Result<void>{};
    auto data = std::span<const char>(block.data(), filled);
    delivered += filled;
    filled = 0;
    if (ctx.sink.on_data) co_return co_await ctx.sink.on_data(data);
    co_return Result<void>{};
  };
  while (!parser.is_done()) {
    parser.get().body().data = block.data() + filled;
    parser.get().body().size = block.size() - filled;
    lowest.expires_after(ctx.read_timeout);
    auto [ec, n] = co_await bhttp::async_read_some(stream, buffer, parser, kTuple);
    (void)n;
    if (ec == bhttp::error::need_buffer) ec = {};
    filled = block.size() - parser.get().body().size;
    if (ec) {
      // Hand over what arrived so the caller can resume from there, then report the cut.
      if (auto r = co_await deliver(); !r) co_return r.error();
      if (ec == bhttp::error::partial_message || ec == bhttp::error::end_of_stream ||
          ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
          ec == asio::error::connection_reset)
        co_return make_error(Errc::network_error,
                             fmt::format("reading the body of {}: cut short after {} bytes{} ({})",
                                         ctx.url.redacted(), delivered,
                                         head.content_length ? fmt::format(" of {}", *head.content_length) : "",
                                         ec.message()));
      co_return socket_error(ec, "reading the body of", ctx.url);
    }
    // Hand a block over when it is full, when the body is complete, or when nothing more is
    // waiting on the socket (an event stream must not be held back until 1 MiB has arrived).
    error_code aec;
    bool idle = buffer.size() == 0 && lowest.socket().available(aec) == 0;
    if (filled == block.size() || parser.is_done() || (filled > 0 && idle))
      if (auto r = co_await deliver(); !r) co_return r.error();
  }
  if (auto r = co_await deliver(); !r) co_return r.error();
  Hop hop;
  hop.final_head = std::move(head);
  co_return hop;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Client

struct Client::Impl {
  asio::any_io_executor executor;
  ClientOptions options;
  ssl::context tls_context{ssl::context::tls_client};
  std::string auth_origin;  // normalized: "scheme://host:port"

  Impl(asio::any_io_executor ex, ClientOptions opts) : executor(std::move(ex)), options(std::move(opts)) {
    tls_context.set_default_verify_paths();
    if (!options.ca_file.empty()) {
      error_code ec;
      tls_context.load_verify_file(options.ca_file.string(), ec);
      if (ec)
        throw std::runtime_error(
            fmt::format("cannot load the CA file {}: {}", options.ca_file.string(), ec.message()));
    }
    tls_context.set_verify_mode(ssl::verify_peer);
    if (!options.auth_origin.empty()) {
      auto u = Url::parse(options.auth_origin);
      auth_origin = u ? u->origin() : options.auth_origin;
    }
  }

  static std::chrono::milliseconds effective(std::chrono::milliseconds configured, std::chrono::milliseconds per_request) {
    return per_request.count() > 0 ? std::min(configured, per_request) : configured;
  }

  // Resolves the host with a deadline. asio's resolver does not take per-operation cancellation,
  // so the caller's cancellation slot is pointed at resolver.cancel() while it runs.
  awaitable<Result<tcp::resolver::results_type>> resolve(const Url& url, std::chrono::milliseconds deadline) {
    auto resolver = std::make_shared<tcp::resolver>(executor);
    auto timed_out = std::make_shared<bool>(false);
    asio::steady_timer timer(executor);
    timer.expires_after(deadline);
    timer.async_wait([resolver, timed_out](error_code ec) {
      if (!ec) {
        *timed_out = true;
        resolver->cancel();
      }
    });
    auto cs = co_await asio::this_coro::cancellation_state;
    auto slot = cs.slot();
    if (slot.is_connected()) slot.assign([resolver](asio::cancellation_type) { resolver->cancel(); });
    auto [ec, results] = co_await resolver->async_resolve(url.host, std::to_string(url.port), kTuple);
    if (slot.is_connected()) slot.clear();
    timer.cancel();
    if (ec == asio::error::operation_aborted && *timed_out)
      co_return make_error(Errc::timeout, fmt::format("resolving {}: timed out", url.redacted()));
    if (ec) co_return socket_error(ec, "resolving", url);
    co_return results;
  }

  // Opens a connection to the URL's origin. This is the seam for HTTPS_PROXY: a proxy connection
  // would connect to the proxy here and send "CONNECT host:port" before the TLS handshake.
  awaitable<Result<std::unique_ptr<Connection>>> open(const Url& url, std::chrono::milliseconds timeout) {
    auto deadline = effective(options.connect_timeout, timeout);
    auto endpoints = co_await resolve(url, deadline);
    if (!endpoints) co_return endpoints.error();
    auto conn = std::make_unique<Connection>();
    if (url.scheme == "https") conn->tls.emplace(executor, tls_context);
    else conn->tcp.emplace(executor);
    auto& lowest = conn->lowest();
    lowest.expires_after(deadline);
    auto [ec, ep] = co_await lowest.async_connect(*endpoints, kTuple);
    (void)ep;
    if (ec) co_return socket_error(ec, "connecting to", url);
    if (!conn->tls) co_return conn;

    SSL* handle = conn->tls->native_handle();
    if (!is_ip_address(url.host) && !SSL_set_tlsext_host_name(handle, url.host.c_str()))
      co_return make_error(Errc::network_error, fmt::format("TLS with {}: cannot set the server name", url.redacted()));
    conn->tls->set_verify_callback(ssl::host_name_verification(url.host));
    lowest.expires_after(deadline);
    auto [hec] = co_await conn->tls->async_handshake(ssl::stream_base::client, kTuple);
    if (hec) {
      long verify = SSL_get_verify_result(handle);
      if (hec != beast::error::timeout && hec != asio::error::operation_aborted && verify != X509_V_OK)
        co_return make_error(Errc::network_error,
                             fmt::format("TLS handshake with {}: certificate not trusted: {}", url.redacted(),
                                         X509_verify_cert_error_string(verify)));
      co_return socket_error(hec, "TLS handshake with", url);
    }
    co_return conn;
  }

  bhttp::request<bhttp::string_body> build(const Request& r, const Url& url, const std::string& first_origin) {
    bhttp::request<bhttp::string_body> req;
    auto verb = bhttp::string_to_verb(r.method);
    if (verb == bhttp::verb::unknown) req.method_string(r.method);
    else req.method(verb);
    req.target(url.target);
    req.version(11);
    req.set(bhttp::field::host,
            url.port == default_port(url.scheme) ? host_for_url(url.host)
                                                 : fmt::format("{}:{}", host_for_url(url.host), url.port));
    req.set(bhttp::field::user_agent, options.user_agent);
    req.set(bhttp::field::accept_encoding, "identity");
    bool same_origin = url.origin() == first_origin;
    bool has_auth = false;
    for (const auto& [k, v] : r.headers.items) {
      if (iequals(k, "host")) continue;
      if (iequals(k, "authorization")) {
        if (!same_origin) continue;  // a caller's credentials never follow a redirect elsewhere
        has_auth = true;
      }
      req.set(k, v);
    }
    if (!has_auth && !options.bearer_token.empty() && !auth_origin.empty() && url.origin() == auth_origin)
      req.set(bhttp::field::authorization, "Bearer " + options.bearer_token);
    if (!r.body.empty()) {
      req.body() = r.body;
      if (!r.content_type.empty()) req.set(bhttp::field::content_type, r.content_type);
    }
    req.keep_alive(false);  // one connection per request until a pool keeps them
    req.prepare_payload();
    return req;
  }

  awaitable<Result<ResponseHead>> execute(Request request, BodySink& sink) {
    const std::string what = request.method + " " + request.url.redacted();
    try {
      co_return co_await execute_unguarded(std::move(request), sink);
    } catch (const boost::system::system_error& e) {
      // After the caller's cancellation fires, awaiting anything in the coroutine throws
      // operation_aborted (asio's throw_if_cancelled); that is a cancellation, not a bug.
      if (e.code() == asio::error::operation_aborted)
        co_return make_error(Errc::cancelled, what + ": cancelled");
      throw;
    }
  }

  awaitable<Result<ResponseHead>> execute_unguarded(Request request, BodySink& sink) {
    const std::string first_origin = request.url.origin();
    Url url = request.url;
    std::vector<Headers> redirects;
    auto read_timeout = effective(options.read_timeout, request.timeout);
    for (;;) {
      auto conn = co_await open(url, request.timeout);
      if (!conn) co_return conn.error();
      auto req = build(request, url, first_origin);
      unsigned left = redirects.size() >= options.max_redirects
                          ? 0u
                          : options.max_redirects - static_cast<unsigned>(redirects.size());
      HopContext ctx{url, read_timeout, sink, redirects, left};
      // (No co_await inside ?: here: GCC 12 destroys the temporaries of such an expression twice.)
      Result<Hop> hop = make_error(Errc::internal, "no exchange");
      if ((*conn)->tls) hop = co_await exchange(*(*conn)->tls, (*conn)->lowest(), req, ctx);
      else hop = co_await exchange(*(*conn)->tcp, (*conn)->lowest(), req, ctx);
      if (!hop) co_return hop.error();
      if (hop->final_head) co_return std::move(*hop->final_head);
      auto next = url.resolve(hop->location);
      if (!next) co_return next.error();
      if (hop->redirect_status == 303 ||
          ((hop->redirect_status == 301 || hop->redirect_status == 302) && request.method == "POST")) {
        if (request.method != "HEAD") request.method = "GET";
        request.body.clear();
        request.content_type.clear();
      }
      url = std::move(*next);
    }
  }
};

Client::Client(asio::any_io_executor executor, ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(executor), std::move(options))) {}

Client::~Client() = default;

const ClientOptions& Client::options() const { return impl_->options; }

awaitable<Result<Response>> Client::request(Request request, std::size_t max_body) {
  Response response;
  const std::string where = request.url.redacted();
  BodySink sink;
  sink.on_head = [&](const ResponseHead& head) -> Result<void> {
    if (head.content_length && *head.content_length > max_body)
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: the body of {} bytes is over the limit of {} bytes", head.url.redacted(),
                                    *head.content_length, max_body));
    return {};
  };
  sink.on_data = [&](std::span<const char> data) -> awaitable<Result<void>> {
    if (response.body.size() + data.size() > max_body)
      co_return make_error(Errc::hub_bad_response,
                           fmt::format("{}: the body is over the limit of {} bytes", where, max_body));
    response.body.append(data.data(), data.size());
    co_return Result<void>{};
  };
  auto head = co_await impl_->execute(std::move(request), sink);
  if (!head) co_return head.error();
  response.head = std::move(*head);
  co_return response;
}

awaitable<Result<ResponseHead>> Client::stream(Request request, BodySink sink) {
  co_return co_await impl_->execute(std::move(request), sink);
}

}  // namespace modeld::http
