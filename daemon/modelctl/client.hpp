#pragma once
// modelctl's side of the control API: blocking HTTP/1.1 requests over modeld's Unix socket,
// with a deadline on every read and write, and an incremental reader for GET /v1/events whose
// events read as lib/wire's.

#include "util/error.hpp"
#include "wire/event.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace modelctl {

/// modelctl's exit codes (interface.md, the command table): success; the thing asked ended badly
/// or does not hold; refused or bad usage; the daemon could not be reached.
constexpr int exit_ok = 0;
constexpr int exit_failed = 1;
constexpr int exit_refused = 2;
constexpr int exit_unreachable = 3;

/// A complete answer: HTTP status and body (JSON for every route but /metrics).
struct Reply {
  unsigned status = 0;
  std::string body;
};

/// One Server-Sent Event: its kind ("phase", "progress", "state") and data (JSON text).
struct Event {
  std::string kind;
  std::string data;
};

/// `e` read as the wire event of its kind: nullopt for an event modelctl passes over (data that
/// is not a JSON object, or a kind this modelctl does not know: a newer daemon's); bad_request
/// "event: ..." when its data does not read as its kind's.
modeld::Result<std::optional<modeld::wire::Event>> read_event(const Event& e);

/// The daemon at one socket path. Every failure to talk to it (no socket, refused, permission
/// denied, connection lost, no answer within the deadline) is Errc::network_error whose
/// message is the reason alone ("No such file or directory"), for the exit-3 line.
class Daemon {
 public:
  /// Talks to the daemon at `socket_path`; each read or write may wait at most `timeout`.
  explicit Daemon(std::string socket_path,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));

  /// The socket path, for messages.
  const std::string& socket_path() const { return path_; }

  /// Sends one request on a new connection and reads the whole answer.
  modeld::Result<Reply> call(const std::string& method, const std::string& target,
                             const std::string& body = {});

 private:
  std::string path_;
  std::chrono::milliseconds timeout_;
  friend class EventStream;
};

/// Prints the contract's one line for an unreachable daemon to stderr ("modelctl: cannot reach
/// modeld at SOCKET: REASON") and returns exit_unreachable.
int report_unreachable(const Daemon& daemon, const modeld::Error& error);

/// Prints the one line for an answer or event modelctl cannot read (a daemon of another version)
/// to stderr ("modelctl: modeld answered with a body modelctl cannot read: REASON") and returns
/// exit_failed.
int report_unreadable(const modeld::Error& error);

/// An open GET /v1/events stream. The daemon subscribes before it answers, so every event
/// after open() returns is delivered.
class EventStream {
 public:
  explicit EventStream(Daemon& daemon);
  ~EventStream();

  /// Connects and reads the answer's head; network_error when unreachable, or when the
  /// daemon answers something other than 200 (message names the status).
  modeld::Result<void> open();

  /// Reads the stream and calls `on_event` for each event until it returns false (then
  /// returns success) or the stream ends or fails (network_error: "connection closed", a
  /// timeout, ...). Comments (keep-alives) are skipped.
  modeld::Result<void> follow(const std::function<bool(const Event&)>& on_event);

 private:
  struct Impl;
  Daemon& daemon_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace modelctl
