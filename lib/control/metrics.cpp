// The metrics counters fed by the Deployer's events, and the TCP listener of [metrics] listen.

#include "control/metrics.hpp"

#include "control/accept.hpp"
#include "control/metrics_room.hpp"

#include "control/routes.hpp"
#include "control/session.hpp"
#include "sys/log.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/rate_policy.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/socket.h>

#include <array>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
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

void SwitchDowntimes::observe(const std::string& model, double seconds) {
  for (std::size_t i = 0; i < bounds.size(); ++i)
    if (seconds <= bounds[i]) ++buckets[i];
  ++count;
  sum += seconds;
  last[model] = seconds;
}

MetricCounters counts_from_history(const deploy::Control& control) {
  MetricCounters counters;
  const auto history = control.history(std::numeric_limits<std::size_t>::max());
  for (const auto& d : history)
    if (d.ended()) ++counters.deployments[std::string(deploy::to_string(d.state))];
  // Oldest first, so that each model's last switch is its newest.
  for (auto d = history.rbegin(); d != history.rend(); ++d)
    if (d->ended() && d->switch_report) counters.switches.observe(d->model, d->switch_report->downtime_s);
  return counters;
}

MetricsCollector::MetricsCollector(deploy::Control& control) : control_(control), counters_(counts_from_history(control)) {
  token_ = control_.subscribe([this](const deploy::Event& e) { on_event(e); });
}

MetricsCollector::~MetricsCollector() { control_.unsubscribe(token_); }

namespace {

// Error codes that say the bytes of a checkpoint are wrong (not the network, the disk or a unit).
bool verification_error(std::string_view code) {
  return code == "checksum_mismatch" || code == "size_mismatch" || code == "safetensors_invalid" ||
         code == "checkpoint_incomplete";
}

}  // namespace

void MetricsCollector::on_event(const deploy::Event& e) {
  using deploy::EventKind;
  if (e.kind == EventKind::watcher) return;
  const auto now = Clock::now();
  auto end_phase = [&](Tracked& t) {
    if (!t.phase.empty())
      counters_.phases[t.phase].observe(std::chrono::duration<double>(now - t.since).count());
  };

  if (e.kind == EventKind::progress) {
    // bytes_done counts what is on disk: every increase is written by the download (the bytes of
    // a resumed partial count when the download finds them). A decrease (a partial started over,
    // the final count of what reached the disk) moves the mark down without counting.
    const auto done = e.progress.bytes_done;
    auto& t = running_[e.id];
    if (done > t.bytes_done) counters_.download_bytes += done - t.bytes_done;
    t.bytes_done = done;
    return;
  }
  if (e.kind == EventKind::phase) {
    auto& t = running_[e.id];
    end_phase(t);
    t.phase = std::string(deploy::to_string(e.phase));
    t.since = now;
    return;
  }
  // state: a terminal state ends the current phase and counts the deployment.
  if (e.state == deploy::State::running) return;
  if (auto it = running_.find(e.id); it != running_.end()) {
    end_phase(it->second);
    running_.erase(it);
  }
  ++counters_.deployments[std::string(deploy::to_string(e.state))];
  if (auto d = control_.get(e.id); d && d->switch_report) counters_.switches.observe(d->model, d->switch_report->downtime_s);
  if (e.error && verification_error(to_string(e.error->code))) ++counters_.verification_failures["deployment"];
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

std::string MetricsCollector::text() const { return metrics_text(control_, counters_); }

// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::uint32_t header_limit = 8 * 1024;
// A request (line and headers) must arrive within request_deadline; an answer must be taken by
// the peer within answer_deadline: a /metrics answer is small, and a peer that leaves it unread
// is no scraper.
constexpr auto request_deadline = std::chrono::seconds(10);
constexpr auto answer_deadline = std::chrono::seconds(5);
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// beast::basic_stream's rate policy, unlimited, that tells the room of each byte read or written:
// that is a connection's progress, by which the one to close for room is chosen.
class ProgressPolicy {
 public:
  ProgressPolicy(detail::MetricsRoom& room, std::uint64_t id) : room_(&room), id_(id) {}

 private:
  friend class beast::rate_policy_access;
  static constexpr std::size_t all = std::numeric_limits<std::size_t>::max();
  std::size_t available_read_bytes() const noexcept { return all; }
  std::size_t available_write_bytes() const noexcept { return all; }
  void transfer_read_bytes(std::size_t n) {
    if (n > 0) room_->spoke(id_);
    transferred(n);
  }
  void transfer_write_bytes(std::size_t n) { transferred(n); }
  void on_timer() noexcept {}
  void transferred(std::size_t n) {
    if (n > 0) room_->progressed(id_, Clock::now());
  }
  detail::MetricsRoom* room_;  // the listener's, which outlives its sessions and their streams
  std::uint64_t id_;
};

using Stream = beast::basic_stream<tcp, asio::any_io_executor, ProgressPolicy>;

// What the peer sent that modeld has not read yet: nothing, part of a request, or a whole request
// head (a scrape accepted a moment ago whose session has not read it yet). recv(2) with MSG_PEEK |
// MSG_DONTWAIT: consumes nothing, does not block.
enum class Waiting { nothing, part, request };
Waiting unread_bytes(Stream& stream) {
  std::array<char, header_limit> buf;
  const auto n = ::recv(stream.socket().native_handle(), buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n <= 0) return Waiting::nothing;
  const std::string_view seen(buf.data(), static_cast<std::size_t>(n));
  return seen.find("\r\n\r\n") == std::string_view::npos ? Waiting::part : Waiting::request;
}

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

}  // namespace

struct MetricsListener::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::any_io_executor ex, std::function<std::string()> t, MetricsLimits l)
      : executor(std::move(ex)), text(std::move(t)), room(l), acceptor(executor) {}

  asio::any_io_executor executor;
  std::function<std::string()> text;
  detail::MetricsRoom room;
  tcp::acceptor acceptor;
  std::string address;  // as configured, for messages
  bool stopped = false;
  std::uint64_t next_id = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<Stream>> streams;  // by id, as in `room`
  detail::ClosedNotes notes;

  asio::awaitable<void> accept_loop();
  void stop();  // MetricsListener::stop(), also reached from the daemon's cancellation tree
  void accepted(tcp::socket socket);  // for detail::accept_each: makes room, starts a session
  // Counts as answering every connection whose whole request waits unread in its socket (and as
  // having spoken one with any byte waiting), so that room is never made by closing a scrape
  // its session has not had the time to read.
  void mark_waiting_requests();
  // Closes connection `id` for room for one from `peer` that does not fit (`why`), and says so.
  void close_for_room(std::uint64_t id, const asio::ip::address& peer, const std::string& why);
  void forget(std::uint64_t id);  // stops counting `id`
  asio::awaitable<void> session(std::shared_ptr<Stream> stream, std::uint64_t id);
  // Reads one request into `parser`; false when the connection is to end.
  asio::awaitable<bool> read_request(Stream& stream, beast::flat_buffer& buffer,
                                     bhttp::request_parser<bhttp::string_body>& parser);
  // Answers `req`; false when the connection is to end.
  asio::awaitable<bool> answer(Stream& stream, const bhttp::request<bhttp::string_body>& req);
};

MetricsListener::MetricsListener(asio::any_io_executor executor, std::function<std::string()> text,
                                 MetricsLimits limits)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(text), limits)) {}

MetricsListener::~MetricsListener() { stop(); }

std::size_t MetricsListener::connections() const { return impl_->room.size(); }

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

void MetricsListener::start(asio::cancellation_slot stop_on) {
  detail::stop_on(stop_on, impl_);
  detail::spawn_logged(impl_->executor, impl_->accept_loop(), "metrics listener");
}

void MetricsListener::stop() { impl_->stop(); }

void MetricsListener::Impl::stop() { detail::stop_listening(*this, streams); }

asio::awaitable<void> MetricsListener::Impl::accept_loop() {
  auto self = shared_from_this();
  co_await detail::accept_each(*this, fmt::format("metrics on {}", address));
}

void MetricsListener::Impl::accepted(tcp::socket socket) {
  const auto peer = peer_address(socket);
  const auto now = Clock::now();
  mark_waiting_requests();
  if (auto full = room.full(peer, now)) {
    if (!full->victim) {  // only with limits of 0, which the configuration refuses
      boost::system::error_code ec;
      socket.close(ec);
      return;
    }
    close_for_room(*full->victim, peer, full->why);
  }
  // Counted from here, so that a burst of accepts cannot pass the limits.
  const auto id = next_id++;
  auto stream = std::make_shared<Stream>(ProgressPolicy(room, id), std::move(socket));
  room.add(id, peer, now);
  streams.emplace(id, stream);
  detail::spawn_logged(executor, session(std::move(stream), id), "metrics connection");
}

void MetricsListener::Impl::mark_waiting_requests() {
  for (const auto& [id, weak] : streams) {
    const auto* c = room.find(id);
    auto stream = weak.lock();
    if (!c || c->answering || !stream) continue;
    const auto unread = unread_bytes(*stream);
    if (unread != Waiting::nothing) room.spoke(id);
    if (unread == Waiting::request) room.set_answering(id, true);
  }
}

void MetricsListener::Impl::close_for_room(std::uint64_t id, const asio::ip::address& peer, const std::string& why) {
  const auto* c = room.find(id);
  const auto from = c->peer.to_string();
  if (auto summary = notes.closed(from)) {
    const double waited = std::chrono::duration<double>(Clock::now() - c->progress).count();
    sys::logf(sys::Level::warning, "metrics on {}: closed a connection from {} that had waited {:.1f} s {}, to let "
              "one from {} in: {} ({})", address, from, waited,
              c->answering ? "for its answer to be read" : "for a request", peer.to_string(), why, *summary);
  }
  auto stream = streams[id].lock();
  forget(id);  // counted out now; its session ends when the close wakes it
  if (stream) stream->close();
}

void MetricsListener::Impl::forget(std::uint64_t id) {
  room.remove(id);
  streams.erase(id);
}

asio::awaitable<void> MetricsListener::Impl::session(std::shared_ptr<Stream> stream, std::uint64_t id) {
  auto self = shared_from_this();
  // Waiting for a request until one is read, answering from then until the answer is written.
  co_await detail::serve_requests(
      2 * header_limit, [this] { return stopped; },
      [this, stream, id](beast::flat_buffer& buffer, bhttp::request_parser<bhttp::string_body>& parser) {
        room.set_answering(id, false);
        return read_request(*stream, buffer, parser);
      },
      [this, stream, id](const bhttp::request<bhttp::string_body>& req) {
        room.set_answering(id, true);
        return answer(*stream, req);
      },
      [this, stream, id] {
        forget(id);
        stream->close();
      });
}

asio::awaitable<bool> MetricsListener::Impl::read_request(Stream& stream, beast::flat_buffer& buffer,
                                                          bhttp::request_parser<bhttp::string_body>& parser) {
  parser.header_limit(header_limit);
  parser.body_limit(4096);
  stream.expires_after(request_deadline);
  auto [ec, n] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
  co_return !ec;  // closed, timed out or malformed: a scraper does none of these on purpose
}

asio::awaitable<bool> MetricsListener::Impl::answer(Stream& stream, const bhttp::request<bhttp::string_body>& req) {
  auto res = metrics_response(req, text);
  res.keep_alive(req.keep_alive() && !stopped);
  res.prepare_payload();
  stream.expires_after(answer_deadline);
  boost::system::error_code ec;
  if (req.method() == bhttp::verb::head) {
    bhttp::response_serializer<bhttp::string_body> sr{res};
    std::tie(ec, std::ignore) = co_await bhttp::async_write_header(stream, sr, use_tuple);
  } else {
    std::tie(ec, std::ignore) = co_await bhttp::async_write(stream, res, use_tuple);
  }
  co_return !ec && res.keep_alive();
}

}  // namespace modeld::control
