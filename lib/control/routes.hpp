#pragma once
// The control API's routes (interface.md "Control API") as a pure function from a parsed
// request to a response, so that every answer is testable without sockets. The socket side
// (lib/control/server.cpp) parses HTTP, reads the peer's credentials and streams SSE.

#include "deploy/control.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::control {

/// The credentials of the process at the other end of a connection (SO_PEERCRED).
struct Peer {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  pid_t pid = 0;
};

/// Decides whether `peer` belongs to the group called `group` (primary or supplementary).
using IsMember = std::function<bool(const Peer& peer, const std::string& group)>;

/// The real membership check: the peer's primary gid, the supplementary groups of its user in
/// the group database (getpwuid + getgrouplist), or the supplementary groups of its process
/// (/proc/PID/status "Groups:"). Returns false when the group does not exist.
bool peer_in_group(const Peer& peer, const std::string& group);

/// Who may call mutating routes: root always, else members of `group` as `is_member` says
/// (peer_in_group when empty).
struct Access {
  std::string group = "modeld";
  IsMember is_member;

  /// Whether `peer` may call mutating routes.
  bool allows(const Peer& peer) const;
};

/// A parsed request: method and target as sent ("/v1/deployments?limit=5"), and the body.
struct Request {
  std::string method;
  std::string target;
  std::string body;
};

/// A complete response, or the instruction to turn the connection into an event stream.
struct Response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< extra headers, e.g. Allow
  bool event_stream = false;  ///< GET /v1/events: the server subscribes and streams events
};

/// Answers one request for `peer`: looks it up in the route table, checks `access` on mutating
/// routes (403 forbidden and a journal warning naming the uid), validates bodies and maps
/// Deployer errors to statuses. Never throws for bad input; unknown routes are 404 not_found,
/// known routes with another method 405.
Response handle(const Request& request, const Peer& peer, deploy::Control& control,
                const Access& access);

class HubReads;

/// Answers one request like handle(), and also the routes whose work takes time and runs
/// through the Deployer's coroutines: GET /v1/models (the store walk, off the event loop),
/// GET /v1/models/{name}/plan[?allow_downtime=true] (read),
/// POST /v1/models/{name}/verify, /pull, /stop and DELETE /v1/models/{name} (mutating: root and
/// control.group only). The server calls this; handle() alone answers those routes 404. With `hub_reads`, a
/// plan beyond the peer's share of it is answered 429 too_many_requests (Retry-After: 1).
boost::asio::awaitable<Response> handle_async(Request request, Peer peer, deploy::Control& control,
                                              const Access& access, HubReads* hub_reads = nullptr);

/// The HTTP status that stands for `code` in the API (unknown_model 404, deployment_running
/// 409, forbidden 403, bad_request 400, too_many_requests 429, ..., 500 for failures that are
/// not the caller's).
unsigned http_status(Errc code) noexcept;

/// An error response: `status` with body {"error": {"code", "message"}}.
Response error_response(unsigned status, const Error& error);

/// Formats one SSE message: sse_frame of the event's name and wire::to_json's text; empty
/// for a watcher event, which the stream does not carry.
std::string sse_message(const deploy::Event& event);

/// Frames one SSE message: "event: KIND\ndata: DATA\n\n" (a multi-line payload becomes several
/// data: lines, as the SSE format requires).
std::string sse_frame(std::string_view kind, std::string_view data);

}  // namespace modeld::control
