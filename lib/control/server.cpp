// The socket side of the control API: listening on the Unix socket, one coroutine per
// connection (peer credentials, HTTP/1.1 with limits and deadlines, keep-alive) and the
// Server-Sent Events stream. What each route answers is in routes.cpp.

#include "control/server.hpp"

#include "control/accept.hpp"
#include "control/session.hpp"
#include "util/throttle.hpp"

#include "sys/log.hpp"
#include "util/files.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/basic_stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <unordered_map>

namespace modeld::control {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using local = asio::local::stream_protocol;
using Stream = beast::basic_stream<local, asio::any_io_executor>;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// After an error answer that ends the connection (413, 431, 400) the client may still be
// sending; closing with unread data would reset the connection and could destroy the answer
// before the client reads it, so the rest is read and dropped for a short, bounded while.
constexpr auto linger_time = std::chrono::seconds(1);
constexpr std::size_t linger_bytes = 1u << 20;

// The events waiting for one SSE client, and the timer its writer sleeps on.
struct EventQueue {
  explicit EventQueue(const asio::any_io_executor& ex) : wake(ex) {}
  std::deque<std::string> messages;
  bool overflow = false;  // lagged by more than max_event_lag: the client is dropped
  bool closed = false;    // the client went away or the server stops
  asio::steady_timer wake;
  std::array<char, 512> discard{};  // what the client sends on an event stream is ignored
};

// One accepted connection. Shared by its session coroutine, the server's table (weakly) and
// a pending SSE read, so that whoever finishes last frees it.
struct Conn {
  explicit Conn(local::socket s) : stream(std::move(s)) {}
  Stream stream;
  Peer peer;
  std::shared_ptr<EventQueue> events;

  void close() {
    stream.close();
    if (events) {
      events->closed = true;
      events->wake.cancel();
    }
  }
};

// Keeps a read pending on an event stream so that a client that disconnects is noticed at
// once rather than at the next keep-alive write.
void watch_for_close(std::shared_ptr<Conn> conn) {
  auto& q = *conn->events;
  conn->stream.socket().async_read_some(
      asio::buffer(q.discard), [conn](const boost::system::error_code& ec, std::size_t) {
        if (conn->events->closed) return;
        if (ec) {
          conn->events->closed = true;
          conn->events->wake.cancel();
          return;
        }
        watch_for_close(conn);
      });
}

Result<Peer> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return make_error(Errc::io_error,
                      fmt::format("control socket: SO_PEERCRED: {}", std::strerror(errno)));
  return Peer{cred.uid, cred.gid, cred.pid};
}

// Whether something accepts connections on the socket at `path` now.
bool socket_answers(const std::filesystem::path& path, int& err) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  err = rc == 0 ? 0 : errno;
  ::close(fd);
  // EAGAIN: the listener's backlog is full, so it is alive.
  return rc == 0 || err == EAGAIN;
}

}  // namespace

struct Server::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::any_io_executor ex, deploy::Control& e, Options o)
      : executor(std::move(ex)), control(e), options(std::move(o)), acceptor(executor), hub_reads(options.limits.hub_reads) {
    access.group = options.group;
    access.is_member = options.is_member;
  }

  asio::any_io_executor executor;
  deploy::Control& control;
  Options options;
  Access access;
  local::acceptor acceptor;
  HubReads hub_reads;  // plans in progress per uid
  bool stopped = false;
  std::uint64_t next_id = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<Conn>> conns;
  util::LogThrottle refusals{std::chrono::seconds(10)};  // one journal line per 10 s at most

  asio::awaitable<void> accept_loop();
  void stop();  // Server::stop(), also reached from the daemon's cancellation tree
  void accepted(local::socket socket);  // for detail::accept_each: checks the peer and starts a session
  // Why a new connection of `peer` is over the limits (Limits), or nullopt when it may stay.
  std::optional<std::string> over_limit(const Peer& peer) const;
  void note_refusal(const Peer& peer, const std::string& why);
  // Answers 503 naming `why`, then closes; not counted among the connections.
  asio::awaitable<void> refuse(std::shared_ptr<Conn> conn, std::string why);
  asio::awaitable<void> session(std::shared_ptr<Conn> conn, std::uint64_t id);
  // Reads one request into `parser`, answering 413, 431 or 400 for one over the limits or
  // malformed; false when the connection is to end.
  asio::awaitable<bool> read_request(Conn& conn, beast::flat_buffer& buffer,
                                     http::request_parser<http::string_body>& parser);
  // Answers `msg` (or streams events); false when the connection is to end.
  asio::awaitable<bool> answer(std::shared_ptr<Conn> conn, http::request<http::string_body>& msg);
  asio::awaitable<void> stream_events(std::shared_ptr<Conn> conn);
  asio::awaitable<void> answer_and_close(Conn& conn, unsigned status, const Error& error);

  // Runs `task` detached, logging an exception (a bug) instead of losing it.
  void spawn(asio::awaitable<void> task, std::string_view what) {
    detail::spawn_logged(executor, std::move(task), fmt::format("control: {}", what));
  }
};

Server::Server(asio::any_io_executor executor, deploy::Control& control, Options options)
    : impl_(std::make_shared<Impl>(std::move(executor), control, std::move(options))) {}

Server::~Server() { stop(); }

std::size_t Server::connections() const { return impl_->conns.size(); }

Result<void> Server::listen() {
  const auto& path = impl_->options.socket_path;
  if (path.native().size() >= sizeof(sockaddr_un::sun_path))
    return make_error(Errc::io_error, fmt::format("control socket {}: path longer than {} bytes",
                                                  path.native(), sizeof(sockaddr_un::sun_path) - 1));
  if (auto parent = path.parent_path(); !parent.empty()) {
    std::error_code ec;
    if (std::filesystem::create_directories(parent, ec))
      std::filesystem::permissions(parent, std::filesystem::perms(0755), ec);
    if (ec) return util::errno_error(ec.value(), parent, "create folder");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return make_error(Errc::io_error,
                        fmt::format("control socket {}: exists and is not a socket", path.native()));
    int err = 0;
    if (socket_answers(path, err))
      return make_error(Errc::io_error,
                        fmt::format("control socket {}: another process answers on it",
                                    path.native()));
    if (err != ECONNREFUSED) return util::errno_error(err, path, "probe existing socket");
    if (::unlink(path.c_str()) != 0) return util::errno_error(errno, path, "remove stale socket");
  } else if (errno != ENOENT) {
    return util::errno_error(errno, path, "stat");
  }

  auto& acc = impl_->acceptor;
  boost::system::error_code ec;
  acc.open(local(), ec);
  if (!ec) acc.bind(local::endpoint(path.native()), ec);
  if (ec) {
    acc.close(ec);
    return util::errno_error(ec.value(), path, "bind");
  }
  // The socket is open to every local user; each route decides from SO_PEERCRED.
  if (::chmod(path.c_str(), 0666) != 0) {
    int err = errno;
    acc.close(ec);
    return util::errno_error(err, path, "chmod 0666");
  }
  acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    acc.close(ec);
    return util::errno_error(ec.value(), path, "listen");
  }
  return {};
}

Result<void> Server::adopt(int fd) {
  int type = 0, domain = 0, listening = 0;
  socklen_t len = sizeof(int);
  bool ok = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
  len = sizeof(int);
  ok = ok && ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
  len = sizeof(int);
  ok = ok && ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening;
  if (!ok)
    return make_error(Errc::io_error,
                      fmt::format("control socket: fd {} is not a listening AF_UNIX stream socket", fd));
  boost::system::error_code ec;
  impl_->acceptor.assign(local(), fd, ec);
  if (ec)
    return make_error(Errc::io_error, fmt::format("control socket: adopt fd {}: {}", fd, ec.message()));
  return {};
}

void Server::start(asio::cancellation_slot stop_on) {
  detail::stop_on(stop_on, impl_);
  impl_->spawn(impl_->accept_loop(), "accepting control connections");
}

void Server::stop() { impl_->stop(); }

void Server::Impl::stop() { detail::stop_listening(*this, conns); }

asio::awaitable<void> Server::Impl::accept_loop() {
  auto self = shared_from_this();
  co_await detail::accept_each(*this, fmt::format("control socket {}", options.socket_path.native()));
}

void Server::Impl::accepted(local::socket socket) {
  auto conn = std::make_shared<Conn>(std::move(socket));
  auto peer = peer_credentials(conn->stream.socket().native_handle());
  if (!peer) {
    sys::log(sys::Level::warning, {}, peer.error().message);
    conn->close();
    return;
  }
  conn->peer = *peer;
  if (auto why = over_limit(conn->peer)) {
    note_refusal(conn->peer, *why);
    spawn(refuse(std::move(conn), *why), "control refusal");
    return;
  }
  // Counted from here, not from when the session first runs, so that a burst of accepts cannot
  // pass the limit.
  const auto id = next_id++;
  conns.emplace(id, conn);
  spawn(session(std::move(conn), id), "control connection");
}

std::optional<std::string> Server::Impl::over_limit(const Peer& peer) const {
  const auto& l = options.limits;
  if (conns.size() < l.max_connections) {
    std::size_t mine = 0;
    for (const auto& [id, weak] : conns)
      if (auto c = weak.lock(); c && c->peer.uid == peer.uid) ++mine;
    if (mine < l.per_user_connections || access.allows(peer)) return std::nullopt;
    return fmt::format("uid {} has {} connections open, the most one user may hold", peer.uid, mine);
  }
  // Full for everyone else: root and control.group members still get the reserve.
  if (conns.size() < l.max_connections + l.reserved_connections && access.allows(peer)) return std::nullopt;
  return fmt::format("{} connections are open, the most modeld serves at once", conns.size());
}

void Server::Impl::note_refusal(const Peer& peer, const std::string& why) {
  if (auto refused = refusals.count())
    sys::logf(sys::Level::warning, "control: refused a connection of uid {} (pid {}): {} ({} refused in the last 10 s)",
              peer.uid, peer.pid, why, *refused);
}

asio::awaitable<void> Server::Impl::refuse(std::shared_ptr<Conn> conn, std::string why) {
  co_await answer_and_close(*conn, 503, make_error(Errc::too_many_requests, "too many connections: " + why));
  conn->close();
}

asio::awaitable<void> Server::Impl::answer_and_close(Conn& conn, unsigned status, const Error& error) {
  auto r = error_response(status, error);
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::content_type, r.content_type);
  res.keep_alive(false);
  res.body() = std::move(r.body);
  res.prepare_payload();
  conn.stream.expires_after(options.limits.write_timeout);
  auto [wec, wn] = co_await http::async_write(conn.stream, res, use_tuple);
  if (wec) co_return;
  boost::system::error_code ec;
  conn.stream.socket().shutdown(local::socket::shutdown_send, ec);
  conn.stream.expires_after(linger_time);
  std::array<char, 4096> sink{};
  std::size_t total = 0;
  while (total < linger_bytes) {
    auto [rec, n] = co_await conn.stream.async_read_some(asio::buffer(sink), use_tuple);
    if (rec) break;
    total += n;
  }
}

asio::awaitable<void> Server::Impl::session(std::shared_ptr<Conn> conn, std::uint64_t id) {
  auto self = shared_from_this();
  const auto& limits = options.limits;
  // Room for one whole request and the start of a pipelined next one; the parser's limits
  // are what bound a single request.
  co_await detail::serve_requests(
      2 * (limits.header_bytes + limits.body_bytes), [this] { return stopped; },
      [this, conn](beast::flat_buffer& buffer, http::request_parser<http::string_body>& parser) {
        return read_request(*conn, buffer, parser);
      },
      [this, conn](http::request<http::string_body>& msg) { return answer(conn, msg); },
      [this, conn, id] {
        conns.erase(id);
        conn->close();
      });
}

asio::awaitable<bool> Server::Impl::read_request(Conn& conn, beast::flat_buffer& buffer,
                                                 http::request_parser<http::string_body>& parser) {
  const auto& limits = options.limits;
  parser.header_limit(static_cast<std::uint32_t>(limits.header_bytes));
  parser.body_limit(limits.body_bytes);
  // One deadline for the whole request, headers and body (and for an idle keep-alive wait).
  conn.stream.expires_after(limits.read_timeout);
  auto [ec, n] = co_await http::async_read_header(conn.stream, buffer, parser, use_tuple);
  if (!ec && !parser.is_done()) {
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
      auto [cec, cn] = co_await asio::async_write(conn.stream, asio::buffer(cont), use_tuple);
      ec = cec;
    }
    if (!ec) std::tie(ec, n) = co_await http::async_read(conn.stream, buffer, parser, use_tuple);
  }
  if (ec == http::error::body_limit) {
    co_await answer_and_close(conn, 413, make_error(Errc::bad_request,
        fmt::format("request body exceeds {} bytes", limits.body_bytes)));
    co_return false;
  }
  if (ec == http::error::header_limit) {
    co_await answer_and_close(conn, 431, make_error(Errc::bad_request,
        fmt::format("request headers exceed {} bytes", limits.header_bytes)));
    co_return false;
  }
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == asio::error::operation_aborted || ec == asio::error::eof ||
      ec == asio::error::connection_reset || ec == http::error::partial_message)
    co_return false;
  if (ec && ec.category() == http::make_error_code(http::error::bad_method).category()) {
    co_await answer_and_close(conn, 400, make_error(Errc::bad_request,
        fmt::format("malformed HTTP request: {}", ec.message())));
    co_return false;
  }
  co_return !ec;
}

asio::awaitable<bool> Server::Impl::answer(std::shared_ptr<Conn> conn, http::request<http::string_body>& msg) {
  Request req{std::string(msg.method_string()), std::string(msg.target()), std::move(msg.body())};
  const bool keep_alive = msg.keep_alive();
  const unsigned version = msg.version();
  Response r;
  const std::string_view path = std::string_view(req.target).substr(0, req.target.find('?'));
  if (options.metrics && path == "/metrics" && req.method == "GET") {
    // The same route as handle()'s, with the counters that only the event stream gives.
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = options.metrics->text();
  } else {
    Request seen{req.method, req.target, {}};
    r = co_await handle_async(std::move(req), conn->peer, control, access, &hub_reads);
    if (options.metrics) options.metrics->observe(seen, r);
  }
  if (r.event_stream) {
    co_await stream_events(conn);
    co_return false;
  }
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::content_type, r.content_type);
  for (auto& [name, value] : r.headers) res.set(name, value);
  res.keep_alive(keep_alive && !stopped);
  res.body() = std::move(r.body);
  res.prepare_payload();
  conn->stream.expires_after(options.limits.write_timeout);
  auto [wec, wn] = co_await http::async_write(conn->stream, res, use_tuple);
  co_return !wec && res.keep_alive();
}

asio::awaitable<void> Server::Impl::stream_events(std::shared_ptr<Conn> conn) {
  const auto& limits = options.limits;
  conn->events = std::make_shared<EventQueue>(executor);
  auto queue = conn->events;
  const std::size_t max_lag = limits.max_event_lag;
  // Subscribe before the answer's head goes out: a client that has read the head has every
  // later event coming.
  const auto token = control.subscribe([queue, max_lag](const deploy::Event& e) {
    if (queue->closed || queue->overflow || e.kind == deploy::EventKind::watcher) return;
    if (queue->messages.size() >= max_lag) {
      queue->overflow = true;
      queue->messages.clear();
    } else {
      queue->messages.push_back(sse_message(e));
    }
    queue->wake.cancel();
  });
  struct Unsubscribe {
    deploy::Control& control;
    std::uint64_t token;
    ~Unsubscribe() { control.unsubscribe(token); }
  } unsubscribe{control, token};

  static constexpr std::string_view head =
      "HTTP/1.1 200 OK\r\n"
      "Content-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\n"
      "Connection: close\r\n"
      "\r\n";
  conn->stream.expires_after(limits.write_timeout);
  if (auto [ec, n] = co_await asio::async_write(conn->stream, asio::buffer(head), use_tuple); ec)
    co_return;
  watch_for_close(conn);

  std::string batch;
  while (!queue->closed && !stopped) {
    if (queue->overflow) {
      sys::logf(sys::Level::warning,
                "control: dropping event stream of uid {} (pid {}): more than {} events behind",
                conn->peer.uid, conn->peer.pid, max_lag);
      co_return;
    }
    batch.clear();
    if (!queue->messages.empty()) {
      for (auto& m : queue->messages) batch += m;
      queue->messages.clear();
    } else {
      queue->wake.expires_after(limits.keepalive_interval);
      auto [ec] = co_await queue->wake.async_wait(use_tuple);
      if (ec) continue;  // woken: events, overflow or close
      // Quiet for a while: a comment keeps proxies and idle timeouts from closing the stream.
      batch = ": keepalive\n\n";
    }
    conn->stream.expires_after(limits.write_timeout);
    auto [ec, n] = co_await asio::async_write(conn->stream, asio::buffer(batch), use_tuple);
    if (ec) co_return;
  }
}

}  // namespace modeld::control
