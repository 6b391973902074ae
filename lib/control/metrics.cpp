// The metrics counters fed by the engine's events, and the TCP listener of [metrics] listen.

#include "control/metrics.hpp"

#include "control/accept.hpp"

#include "control/routes.hpp"
#include "sys/log.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

namespace modeld::control {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

void PhaseDurations::observe(double seconds) {
  ++count;
  sum += seconds;
  last = seconds;
}

MetricsCollector::MetricsCollector(deploy::Engine& engine) : engine_(engine) {
  for (const auto& d : engine_.history(std::numeric_limits<std::size_t>::max()))
    if (d.ended()) ++counters_.deployments[std::string(deploy::to_string(d.state))];
  token_ = engine_.subscribe([this](const deploy::Event& e) { on_event(e); });
}

MetricsCollector::~MetricsCollector() { engine_.unsubscribe(token_); }

namespace {

// Error codes that say the bytes of a checkpoint are wrong (not the network, the disk or a unit).
bool verification_error(std::string_view code) {
  return code == "checksum_mismatch" || code == "size_mismatch" || code == "safetensors_invalid" ||
         code == "checkpoint_incomplete";
}

}  // namespace

void MetricsCollector::on_event(const deploy::Event& e) {
  if (e.kind != "phase" && e.kind != "state" && e.kind != "progress") return;
  auto j = nlohmann::json::parse(e.data_json, nullptr, false);
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) return;
  const std::string id = j["id"].get<std::string>();
  const auto now = Clock::now();
  auto end_phase = [&](Tracked& t) {
    if (!t.phase.empty())
      counters_.phases[t.phase].observe(std::chrono::duration<double>(now - t.since).count());
  };

  if (e.kind == "progress") {
    // bytes_done counts what is on disk: every increase is written by the download (the bytes of
    // a resumed partial count when the download finds them). A decrease (a partial started over,
    // the final count of what reached the disk) moves the mark down without counting.
    const auto p = j.find("progress");
    if (p == j.end() || !p->is_object() || !p->contains("bytes_done") || !(*p)["bytes_done"].is_number_unsigned())
      return;
    const auto done = (*p)["bytes_done"].get<std::uint64_t>();
    auto& t = running_[id];
    if (done > t.bytes_done) counters_.download_bytes += done - t.bytes_done;
    t.bytes_done = done;
    return;
  }
  if (e.kind == "phase") {
    if (!j.contains("phase") || !j["phase"].is_string()) return;
    auto& t = running_[id];
    end_phase(t);
    t.phase = j["phase"].get<std::string>();
    t.since = now;
    return;
  }
  // state: a terminal state ends the current phase and counts the deployment.
  if (!j.contains("state") || !j["state"].is_string()) return;
  const std::string state = j["state"].get<std::string>();
  if (state == "running") return;
  if (auto it = running_.find(id); it != running_.end()) {
    end_phase(it->second);
    running_.erase(it);
  }
  ++counters_.deployments[state];
  if (const auto err = j.find("error"); err != j.end() && err->is_object() && err->contains("code") &&
                                        (*err)["code"].is_string() &&
                                        verification_error((*err)["code"].get<std::string>()))
    ++counters_.verification_failures["deployment"];
}

void MetricsCollector::observe(const Request& request, const Response& response) {
  if (request.method != "POST" || response.status != 200) return;
  std::string_view path = request.target;
  path = path.substr(0, path.find('?'));
  if (!path.starts_with("/v1/models/") || !path.ends_with("/verify")) return;
  auto j = nlohmann::json::parse(response.body, nullptr, false);
  if (j.is_object() && j.contains("ok") && j["ok"].is_boolean() && !j["ok"].get<bool>())
    ++counters_.verification_failures["verify"];
}

void MetricsCollector::reloaded(bool ok) {
  ++counters_.reloads[ok ? "success" : "failure"];
  counters_.last_reload_ok = ok;
}

std::string MetricsCollector::text() const { return metrics_text(engine_, counters_); }

// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::uint32_t header_limit = 8 * 1024;
constexpr auto io_deadline = std::chrono::seconds(10);
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// The client's identity for the limits: its IP address, an IPv4-mapped IPv6 one as IPv4.
asio::ip::address peer_address(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto a = socket.remote_endpoint(ec).address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
  return a;
}

// The answer to one request: the exposition for GET and HEAD /metrics, else 404 or 405.
bhttp::response<bhttp::string_body> metrics_response(const bhttp::request<bhttp::string_body>& req,
                                                     const std::function<std::string()>& text) {
  std::string_view target = req.target();
  const std::string_view path = target.substr(0, target.find('?'));
  bhttp::response<bhttp::string_body> res{bhttp::status::ok, req.version()};
  res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
  if (path != "/metrics") {
    res.result(bhttp::status::not_found);
    res.body() = "not found: this listener serves only GET /metrics\n";
  } else if (req.method() != bhttp::verb::get && req.method() != bhttp::verb::head) {
    res.result(bhttp::status::method_not_allowed);
    res.set(bhttp::field::allow, "GET, HEAD");
    res.body() = "method not allowed: GET /metrics only\n";
  } else {
    res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    res.body() = text();
  }
  return res;
}

// Tells a refused client why in a 503 if its socket takes it at once (never waits), then closes;
// what it has sent already is read first, so that the close does not reset the connection.
void refuse_at_once(tcp::socket& socket, std::string_view why) {
  const std::string body = fmt::format("too many connections: {}\n", why);
  const std::string answer = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
      "Content-Length: {}\r\n\r\n{}",
      body.size(), body);
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  std::array<char, 8192> sent{};
  if (!ec) socket.read_some(asio::buffer(sent), ec);
  ec.clear();
  socket.write_some(asio::buffer(answer), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

}  // namespace

struct MetricsListener::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::any_io_executor ex, std::function<std::string()> t, MetricsLimits l)
      : executor(std::move(ex)), text(std::move(t)), limits(l), acceptor(executor) {}

  // One open connection, as the limits see it.
  struct Conn {
    std::weak_ptr<beast::tcp_stream> stream;
    asio::ip::address peer;
    std::optional<Clock::time_point> waiting_since;  // set while it waits for (the rest of) a request
  };

  asio::any_io_executor executor;
  std::function<std::string()> text;
  MetricsLimits limits;
  tcp::acceptor acceptor;
  std::string address;  // as configured, for messages
  bool stopped = false;
  std::uint64_t next_id = 0;
  std::unordered_map<std::uint64_t, Conn> conns;
  detail::RefusalNotes refusals;

  asio::awaitable<void> accept_loop();
  void accepted(tcp::socket socket);  // for detail::accept_each: makes room or refuses, starts a session
  // Makes room for one more connection from `peer` when a limit is reached, by closing a waiting
  // connection; returns why `peer` must be refused when none can be closed.
  std::optional<std::string> make_room(const asio::ip::address& peer);
  // The waiting connection to close for room: the longest waiting of `peer` when given, else of
  // the address holding the most connections; conns.end() when none waits.
  decltype(conns)::iterator victim(const asio::ip::address* peer);
  void note(const std::string& what);  // a warning line, at most one per 10 s
  void set_waiting(std::uint64_t id, bool waiting);
  asio::awaitable<void> session(std::shared_ptr<beast::tcp_stream> stream, std::uint64_t id);
};

MetricsListener::MetricsListener(asio::any_io_executor executor, std::function<std::string()> text,
                                 MetricsLimits limits)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(text), limits)) {}

MetricsListener::~MetricsListener() { stop(); }

std::size_t MetricsListener::connections() const { return impl_->conns.size(); }

Result<void> MetricsListener::listen(const std::string& host_port) {
  auto& impl = *impl_;
  impl.address = host_port;
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return make_error(Errc::config_invalid, fmt::format("metrics.listen \"{}\" is not HOST:PORT", host_port));
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  tcp::resolver resolver(impl.executor);
  // Numeric addresses resolve without a lookup; a host name is looked up once, at start-up.
  auto results = resolver.resolve(host, port, tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    return make_error(Errc::io_error, fmt::format("metrics.listen \"{}\": cannot resolve {}: {}", host_port, host,
                                                  ec ? ec.message() : "no address"));
  const tcp::endpoint ep = results.begin()->endpoint();
  auto& acc = impl.acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    boost::system::error_code ignored;
    acc.close(ignored);
    return make_error(Errc::io_error, fmt::format("metrics.listen \"{}\": cannot listen on {}: {}", host_port,
                                                  fmt::format("{}:{}", ep.address().to_string(), ep.port()),
                                                  ec.message()));
  }
  return {};
}

std::uint16_t MetricsListener::port() const {
  boost::system::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void MetricsListener::start() {
  detail::spawn_logged(impl_->executor, impl_->accept_loop(), "metrics listener");
}

void MetricsListener::stop() {
  auto& impl = *impl_;
  if (impl.stopped) return;
  impl.stopped = true;
  boost::system::error_code ec;
  impl.acceptor.close(ec);
  std::vector<std::shared_ptr<beast::tcp_stream>> open;
  for (auto& [id, conn] : impl.conns)
    if (auto s = conn.stream.lock()) open.push_back(std::move(s));
  for (auto& s : open) s->close();
}

asio::awaitable<void> MetricsListener::Impl::accept_loop() {
  auto self = shared_from_this();
  co_await detail::accept_each(*this, fmt::format("metrics on {}", address));
}

void MetricsListener::Impl::accepted(tcp::socket socket) {
  const auto peer = peer_address(socket);
  if (auto why = make_room(peer)) {
    note(fmt::format("refused a connection from {}: {}", peer.to_string(), *why));
    refuse_at_once(socket, *why);
    return;
  }
  // Counted from here, so that a burst of accepts cannot pass the limits.
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  const auto id = next_id++;
  conns.emplace(id, Conn{stream, peer, Clock::now()});
  detail::spawn_logged(executor, session(std::move(stream), id), "metrics connection");
}

std::optional<std::string> MetricsListener::Impl::make_room(const asio::ip::address& peer) {
  std::size_t mine = 0;
  for (const auto& [id, c] : conns) mine += c.peer == peer ? 1 : 0;
  const bool address_full = mine >= limits.per_address_connections;
  if (!address_full && conns.size() < limits.max_connections) return std::nullopt;
  const std::string why =
      address_full ? fmt::format("{} has {} connections open, the most one address may hold "
                                 "(metrics.per_address_connections)", peer.to_string(), mine)
                   : fmt::format("{} connections are open, the most the listener serves at once "
                                 "(metrics.max_connections)", conns.size());
  const auto it = victim(address_full ? &peer : nullptr);
  if (it == conns.end()) return why;
  const double waited = std::chrono::duration<double>(Clock::now() - *it->second.waiting_since).count();
  note(fmt::format("closed a connection from {} that had waited {:.1f} s for a request, to let one from {} in: {}",
                   it->second.peer.to_string(), waited, peer.to_string(), why));
  auto stream = it->second.stream.lock();
  conns.erase(it);  // counted out now; its session ends when the close wakes it
  if (stream) stream->close();
  return std::nullopt;
}

auto MetricsListener::Impl::victim(const asio::ip::address* peer) -> decltype(conns)::iterator {
  std::map<asio::ip::address, std::size_t> held;
  for (const auto& [id, c] : conns) ++held[c.peer];
  auto best = conns.end();
  for (auto it = conns.begin(); it != conns.end(); ++it) {
    const auto& c = it->second;
    if (!c.waiting_since || (peer && c.peer != *peer)) continue;
    if (best == conns.end()) {
      best = it;
      continue;
    }
    const auto& b = best->second;
    const auto mine = held[c.peer], theirs = held[b.peer];
    if (mine > theirs || (mine == theirs && *c.waiting_since < *b.waiting_since)) best = it;
  }
  return best;
}

void MetricsListener::Impl::note(const std::string& what) {
  if (auto n = refusals.count())
    sys::logf(sys::Level::warning, "metrics on {}: {} ({} connection(s) closed or refused in the last 10 s)",
              address, what, *n);
}

void MetricsListener::Impl::set_waiting(std::uint64_t id, bool waiting) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  auto& since = it->second.waiting_since;
  if (!waiting) since.reset();
  else if (!since) since = Clock::now();  // since the accept, for its first request
}

asio::awaitable<void> MetricsListener::Impl::session(std::shared_ptr<beast::tcp_stream> stream, std::uint64_t id) {
  auto self = shared_from_this();
  struct Leave {
    Impl& impl;
    std::uint64_t id;
    beast::tcp_stream& stream;
    ~Leave() {
      impl.conns.erase(id);
      stream.close();
    }
  } leave{*this, id, *stream};
  beast::flat_buffer buffer(2 * header_limit);
  while (!stopped) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(header_limit);
    parser.body_limit(4096);
    set_waiting(id, true);
    stream->expires_after(io_deadline);
    auto [ec, n] = co_await bhttp::async_read(*stream, buffer, parser, use_tuple);
    if (ec) co_return;  // closed, timed out or malformed: a scraper does none of these on purpose
    set_waiting(id, false);
    const auto& req = parser.get();
    auto res = metrics_response(req, text);
    res.keep_alive(req.keep_alive() && !stopped);
    res.prepare_payload();
    stream->expires_after(io_deadline);
    if (req.method() == bhttp::verb::head) {
      bhttp::response_serializer<bhttp::string_body> sr{res};
      auto [wec, wn] = co_await bhttp::async_write_header(*stream, sr, use_tuple);
      if (wec) co_return;
    } else {
      auto [wec, wn] = co_await bhttp::async_write(*stream, res, use_tuple);
      if (wec) co_return;
    }
    if (!res.keep_alive()) co_return;
  }
}

}  // namespace modeld::control
