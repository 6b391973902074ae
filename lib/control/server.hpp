#pragma once
// The control-plane HTTP/1.1 server on the daemon's Unix socket (interface.md "Control API"):
// one coroutine per connection on the io_context thread, SO_PEERCRED on every connection,
// hard limits on headers, bodies, connections and time, keep-alive, and Server-Sent Events
// for GET /v1/events. Routes live in lib/control/routes.hpp.

#include "control/hub_reads.hpp"
#include "control/metrics.hpp"
#include "control/routes.hpp"
#include "deploy/control.hpp"
#include "util/error.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

namespace modeld::control {

/// Resource limits of the server; every one bounds something a local user can make it hold.
struct Limits {
  std::size_t header_bytes = 8 * 1024;   ///< request line and headers; more is 431
  std::size_t body_bytes = 64 * 1024;    ///< request body; more is 413
  std::size_t max_connections = 64;      ///< connections at once; more are answered 503 and closed
  /// Connections at once of one uid that is neither root nor in control.group, so that one local
  /// user (64 open event streams, say) cannot lock out the others.
  std::size_t per_user_connections = 16;
  /// Connections beyond max_connections kept for root and control.group members, so that an
  /// operator can always reach modeld (modelctl cancel) while unprivileged clients fill the rest.
  std::size_t reserved_connections = 16;
  std::chrono::milliseconds read_timeout = std::chrono::seconds(30);   ///< to read one request
  std::chrono::milliseconds write_timeout = std::chrono::seconds(30);  ///< to write one response
  std::chrono::milliseconds keepalive_interval = std::chrono::seconds(15);  ///< SSE comment period
  std::size_t max_event_lag = 1000;      ///< SSE events queued for one client before it is dropped
  /// Plans (they list the Hub) in progress at once: per unprivileged user, in all, and the
  /// reserve of root and control.group; more are answered 429 too_many_requests.
  HubReadLimits hub_reads;
};

/// How the server is set up.
struct Options {
  std::filesystem::path socket_path = "/run/modeld/modeld.sock";
  std::string group = "modeld";  ///< control.group: may call mutating routes besides root
  Limits limits;
  IsMember is_member;  ///< membership check; peer_in_group when empty (tests inject their own)
  /// Answers GET /metrics with its counters (the daemon's); null: metrics_text(control) from the
  /// history alone. Must outlive the server; it observes every answered request.
  MetricsCollector* metrics = nullptr;
};

/// The server. Create, listen() or adopt(), start(); stop() before the io_context stops.
/// The deploy::Control must outlive the io_context's last run (connections unsubscribe on their way out).
class Server {
 public:
  /// Makes a server that runs on `executor` (the daemon's one io_context thread).
  Server(boost::asio::any_io_executor executor, deploy::Control& control, Options options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds and listens on options.socket_path: creates the parent folder (0755) when missing,
  /// removes a stale socket only when nothing answers on it, and makes the socket 0666 (access
  /// is decided per route from SO_PEERCRED). Errors: io_error naming the path (also when another
  /// process answers on it, or a non-socket file is in the way).
  Result<void> listen();

  /// Uses `fd`, an already bound and listening AF_UNIX stream socket (socket activation); takes
  /// ownership. Errors: io_error when it is not such a socket.
  Result<void> adopt(int fd);

  /// Starts accepting connections (after listen() or adopt()); an emit on `stop_on` (the daemon's
  /// cancellation tree) stops the server as stop() does. Returns at once.
  void start(boost::asio::cancellation_slot stop_on = {});

  /// Closes the listening socket and every connection, ending event streams; idempotent.
  void stop();

  /// Connections open now (for tests and metrics).
  std::size_t connections() const;



 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace modeld::control
