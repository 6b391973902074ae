// The control API's routes: one table (method, path pattern, access level, query check,
// handler) that both entry points dispatch through; the bodies and answers are lib/wire's.

#include "control/routes.hpp"
#include "control/hub_reads.hpp"
#include "control/metrics.hpp"
#include "util/json.hpp"

#include "deploy/deployment.hpp"
#include "sys/log.hpp"
#include "repo/ids.hpp"
#include "util/text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <initializer_list>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace modeld::control {
namespace {

using nlohmann::json;

// The history GET /v1/deployments returns without ?limit=, and the most it returns with one.
constexpr std::size_t default_history_limit = 100;
constexpr std::size_t max_history_limit = 10000;

Response json_response(unsigned status, const json& body) {
  Response r;
  r.status = status;
  r.body = util::dump_json(body);
  return r;
}

Response error_for(const Error& e) { return error_response(http_status(e.code), e); }

// GET /v1/status "watchdog": the active model's record, null when nothing watches it. It is the
// watchdog of the active model's entry in `services` when there is one; else the record of the
// model watched now (the first of control.watchdogs()) when that is the active model.
std::optional<wire::WatchdogStatus> watchdog_of(const deploy::Control& control, const std::optional<wire::Active>& active,
                                                const std::vector<wire::ServiceInfo>& services) {
  if (!active) return std::nullopt;
  for (const auto& s : services)
    if (s.model == active->model) return s.watchdog;
  auto all = control.watchdogs();
  if (all.empty() || all.front().model != active->model) return std::nullopt;
  return all.front();
}

// Decodes one path segment (util::percent_decode); nullopt on a malformed escape or a decoded
// '/' or NUL, which no deployment id or model name contains.
std::optional<std::string> decode_segment(std::string_view s) {
  auto out = util::percent_decode(s);
  if (!out || out->find_first_of(std::string_view("/\0", 2)) != std::string::npos) return std::nullopt;
  return out;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  std::size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    auto j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    parts.push_back(path.substr(i, j - i));
    i = j;
  }
  return parts;
}

Response method_not_allowed(const Request& req, std::string_view path, std::string_view allow) {
  auto r = error_response(405, make_error(Errc::bad_request,
                                          fmt::format("method {} is not allowed on {} (allowed: {})",
                                                      req.method, path, allow)));
  r.headers.emplace_back("Allow", std::string(allow));
  return r;
}

Response forbidden(const Request& req, std::string_view path, const Peer& peer, const Access& access) {
  sys::Fields fields;
  fields.extra.emplace_back("MODELD_UID", std::to_string(peer.uid));
  sys::logf(sys::Level::warning, fields,
            "control: refused {} {} to uid {} (pid {}): not root and not a member of group {}",
            req.method, path, peer.uid, peer.pid, access.group);
  return error_response(403, make_error(Errc::forbidden,
                                        fmt::format("{} {} is allowed only to root and members of "
                                                    "group {}",
                                                    req.method, path, access.group)));
}

// 429 too_many_requests with Retry-After: 1, and a journal warning naming the uid: one line per
// 10 s at most (HubReads::refusals), so a client in a loop cannot flood the journal.
Response too_many(const Request& req, std::string_view path, const Peer& peer, HubReads& reads, const Error& error) {
  if (auto n = reads.refusals.count()) {
    sys::Fields fields;
    fields.extra.emplace_back("MODELD_UID", std::to_string(peer.uid));
    sys::logf(sys::Level::warning, fields, "control: refused {} {} to uid {} (pid {}): {} ({} refused in the last 10 s)",
              req.method, path, peer.uid, peer.pid, error.message, *n);
  }
  auto r = error_response(429, error);
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

Response get_status(deploy::Control& control) {
  wire::Status status;
  status.version = MODELD_VERSION;
  status.uptime_s = control.uptime_s();
  status.active = control.active();
  status.services = control.services();
  status.watchdog = watchdog_of(control, status.active, status.services);
  if (auto cur = control.current()) status.deployment = std::move(*cur);
  return json_response(200, wire::to_json(status));
}

Response list_deployments(std::string_view query, deploy::Control& control) {
  auto limit = wire::limit_param(query, default_history_limit, max_history_limit);
  if (!limit) return error_for(limit.error());
  json list = json::array();
  for (const auto& d : control.history(*limit)) {
    if (list.size() >= *limit) break;
    list.push_back(wire::to_json(d));
  }
  return json_response(200, json{{"deployments", std::move(list)}});
}

// POST /v1/models/{name}/pull: a record of kind pull, of the configured revision or of the
// body's "commit".
Response start_pull(const std::string& model, const std::string& body, deploy::Control& control) {
  auto commit = wire::parse_pull_body(body);
  if (!commit) return error_for(commit.error());
  deploy::DeployRequest r;
  r.model = model;
  r.kind = deploy::Kind::pull;
  r.commit = *commit;
  auto d = control.start(r);
  if (!d) return error_for(d.error());
  return json_response(202, wire::to_json(*d));
}

// POST /v1/models/{name}/stop: a record of kind stop; its body is empty or {} (a field there
// would be one a stop does not have: bad_request naming it).
Response start_stop(const std::string& model, const std::string& body, deploy::Control& control) {
  if (auto ok = wire::parse_stop_body(body); !ok) return error_for(ok.error());
  auto d = control.stop(model);
  if (!d) return error_for(d.error());
  return json_response(202, wire::to_json(*d));
}

Response start_deployment(const Request& req, deploy::Control& control) {
  auto body = wire::parse_deploy_body(req.body);
  if (!body) return error_for(body.error());
  auto d = control.start(*body);
  if (!d) return error_for(d.error());
  return json_response(202, wire::to_json(*d));
}

}  // namespace

bool Access::allows(const Peer& peer) const {
  if (peer.uid == 0) return true;
  return is_member ? is_member(peer, group) : peer_in_group(peer, group);
}

unsigned http_status(Errc code) noexcept {
  switch (code) {
    case Errc::bad_request:
    case Errc::config_invalid:
    case Errc::plan_invalid:
      return 400;
    case Errc::forbidden:
      return 403;
    case Errc::too_many_requests:
      return 429;
    case Errc::unknown_model:
    case Errc::not_found:
      return 404;
    case Errc::deployment_running:
    case Errc::deployment_ended:
    case Errc::model_active:
      return 409;
    case Errc::timeout:
      return 504;
    default:
      return 500;
  }
}

Response error_response(unsigned status, const Error& error) {
  return json_response(status, json{{"error", wire::to_json(error)}});
}

std::string sse_message(const deploy::Event& event) {
  if (event.kind == deploy::EventKind::watcher) return {};
  return sse_frame(deploy::to_string(event.kind), util::dump_json(wire::to_json(event)));
}

std::string sse_frame(std::string_view kind, std::string_view data) {
  std::string out = fmt::format("event: {}\n", kind);
  // A line break inside the payload would end the data field early; each line gets its own
  // "data:" and the client joins them with '\n' again.
  for (;;) {
    auto nl = data.find('\n');
    out += "data: ";
    out += data.substr(0, nl);
    out += '\n';
    if (nl == std::string_view::npos) break;
    data.remove_prefix(nl + 1);
  }
  out += '\n';
  return out;
}

namespace {

// What a route's handler gets: the request, its path and query, the segment the pattern's "{}"
// matched (decoded), who asks and what answers.
struct Call {
  const Request& req;
  std::string_view path;
  std::string_view query;
  std::string arg;
  const Peer& peer;
  deploy::Control& control;
  const Access& access;
  HubReads* hub_reads;
};

// Who may call a route: anyone who can reach the socket, or root and control.group only.
enum class Level { read, mutate };

using SyncHandler = Response (*)(const Call&);
using QueryCheck = Result<void> (*)(std::string_view query, std::string_view path);
using AsyncHandler = boost::asio::awaitable<Response> (*)(const Call&);

// One row of the route table: a method on a path pattern (segments, "{}" matching one decoded
// segment), its access level, the check of the query parameters it knows (after the access;
// null: the handler reads the query itself) and its handler, answered at once or awaited.
struct Route {
  std::string_view method;
  std::vector<std::string_view> pattern;
  Level level;
  QueryCheck query;
  SyncHandler sync = nullptr;
  AsyncHandler async = nullptr;
};

Response unknown_model(const std::string& name) {
  return error_for(make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", name)));
}

Response metrics_route(const Call& c) {
  Response r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_text(c.control);
  return r;
}

Response status_route(const Call& c) { return get_status(c.control); }

Response events_route(const Call&) {
  Response r;
  r.content_type = "text/event-stream";
  r.event_stream = true;
  return r;
}

Response list_route(const Call& c) { return list_deployments(c.query, c.control); }

Response start_route(const Call& c) { return start_deployment(c.req, c.control); }

Response deployment_route(const Call& c) {
  auto d = c.control.get(c.arg);
  if (!d) return error_for(d.error());
  return json_response(200, wire::to_json(*d));
}

Response cancel_route(const Call& c) {
  auto d = c.control.cancel(c.arg);
  if (!d) return error_for(d.error());
  return json_response(200, wire::to_json(*d));
}

// pull and stop answer at once, yet only handle_async() serves them, as every /v1/models route.
boost::asio::awaitable<Response> pull_route(const Call& c) { co_return start_pull(c.arg, c.req.body, c.control); }

boost::asio::awaitable<Response> stop_route(const Call& c) { co_return start_stop(c.arg, c.req.body, c.control); }

boost::asio::awaitable<Response> models_route(const Call& c) {
  const auto models = co_await c.control.models();
  co_return json_response(200, wire::models_json(models));
}

boost::asio::awaitable<Response> plan_route(const Call& c) {
  auto allow_downtime = wire::bool_param(c.query, "allow_downtime");
  if (!allow_downtime) co_return error_for(allow_downtime.error());
  auto commit = wire::commit_param(c.query);
  if (!commit) co_return error_for(commit.error());
  if (!repo::valid_model_name(c.arg)) co_return unknown_model(c.arg);
  // A plan lists the Hub (and holds the listing while it runs): a few at once per user.
  std::optional<HubReads::Slot> slot;
  if (c.hub_reads) {
    auto entered = c.hub_reads->enter(c.peer, [&] { return c.access.allows(c.peer); });
    if (!entered) co_return too_many(c.req, c.path, c.peer, *c.hub_reads, entered.error());
    slot.emplace(std::move(*entered));
  }
  auto plan = co_await c.control.plan(c.arg, *allow_downtime, *commit);
  if (!plan) co_return error_for(plan.error());
  co_return json_response(200, wire::to_json(*plan));
}

boost::asio::awaitable<Response> verify_route(const Call& c) {
  if (!repo::valid_model_name(c.arg)) co_return unknown_model(c.arg);
  auto report = co_await c.control.verify(c.arg);
  if (!report) co_return error_for(report.error());
  co_return json_response(200, wire::to_json(*report));
}

// DELETE /v1/models/{name}: ?commit=C removes that one revision; without it, the whole model.
boost::asio::awaitable<Response> remove_route(const Call& c) {
  if (!repo::valid_model_name(c.arg)) co_return unknown_model(c.arg);
  const auto commit = wire::commit_param(c.query);
  if (!commit) co_return error_for(commit.error());
  const std::optional<std::string> one = *commit;
  Result<deploy::Removal> removed = make_error(Errc::internal, "not removed");
  if (one)
    removed = co_await c.control.remove_revision(c.arg, *one);
  else
    removed = co_await c.control.remove(c.arg);
  if (!removed) co_return error_for(removed.error());
  co_return json_response(200, wire::to_json(*removed));
}

// The query checks of the table: a route that changes something (or plans) refuses parameters
// it does not know (wire::known_query).
Result<void> no_query(std::string_view query, std::string_view path) { return wire::known_query(query, path, {}); }

Result<void> plan_query(std::string_view query, std::string_view path) {
  return wire::known_query(query, path, {"allow_downtime", "commit"});
}

Result<void> commit_query(std::string_view query, std::string_view path) {
  return wire::known_query(query, path, {"commit"});
}

// The control API (interface.md "Control API"), in the order a 405's Allow header lists methods.
const std::vector<Route>& route_table() {
  static const std::vector<Route> table{
      {"GET", {"metrics"}, Level::read, nullptr, metrics_route},
      {"GET", {"v1", "status"}, Level::read, nullptr, status_route},
      {"GET", {"v1", "events"}, Level::read, nullptr, events_route},
      {"GET", {"v1", "deployments"}, Level::read, nullptr, list_route},
      {"POST", {"v1", "deployments"}, Level::mutate, no_query, start_route},
      {"GET", {"v1", "deployments", "{}"}, Level::read, nullptr, deployment_route},
      {"POST", {"v1", "deployments", "{}", "cancel"}, Level::mutate, no_query, cancel_route},
      {"GET", {"v1", "models"}, Level::read, nullptr, nullptr, models_route},
      {"GET", {"v1", "models", "{}", "plan"}, Level::read, plan_query, nullptr, plan_route},
      {"POST", {"v1", "models", "{}", "verify"}, Level::mutate, no_query, nullptr, verify_route},
      {"POST", {"v1", "models", "{}", "pull"}, Level::mutate, no_query, nullptr, pull_route},
      {"POST", {"v1", "models", "{}", "stop"}, Level::mutate, no_query, nullptr, stop_route},
      {"DELETE", {"v1", "models", "{}"}, Level::mutate, commit_query, nullptr, remove_route},
  };
  return table;
}

// Whether `parts` fits `pattern`; `arg` gets the decoded "{}" segment (a segment that does not
// decode fits nothing).
bool matches(const std::vector<std::string_view>& pattern, const std::vector<std::string_view>& parts,
             std::string& arg) {
  if (pattern.size() != parts.size()) return false;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (pattern[i] != "{}") {
      if (pattern[i] != parts[i]) return false;
      continue;
    }
    auto decoded = decode_segment(parts[i]);
    if (!decoded) return false;
    arg = std::move(*decoded);
  }
  return true;
}

// The outcome of looking a request up: the row to run (with its argument), or the answer that
// stands for it (404 no route, 405 with Allow, 403, a refused query).
struct Lookup {
  const Route* route = nullptr;
  std::string arg;
  std::optional<Response> answer;
};

// Looks up `req` among the rows `with_async` allows (the sync handle() answers only rows with an
// immediate handler): path first, then method, access and query, in the order the API checks them.
Lookup look_up(const Request& req, std::string_view path, std::string_view query, const Peer& peer,
               const Access& access, bool with_async) {
  const auto parts = split_path(path);
  Lookup out;
  std::vector<std::string_view> allowed;
  for (const auto& r : route_table()) {
    std::string arg;
    if ((!with_async && !r.sync) || !matches(r.pattern, parts, arg)) continue;
    allowed.push_back(r.method);
    if (r.method == req.method && !out.route) {
      out.route = &r;
      out.arg = std::move(arg);
    }
  }
  if (allowed.empty()) {
    out.answer = error_for(make_error(Errc::not_found, fmt::format("no route {}", path)));
  } else if (!out.route) {
    out.answer = method_not_allowed(req, path, fmt::format("{}", fmt::join(allowed, ", ")));
  } else if (out.route->level == Level::mutate && !access.allows(peer)) {
    out.answer = forbidden(req, path, peer, access);
  } else if (out.route->query) {
    if (auto ok = out.route->query(query, path); !ok) out.answer = error_for(ok.error());
  }
  return out;
}

// The path and the query of a request target ("/v1/deployments?limit=5").
std::pair<std::string_view, std::string_view> split_target(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view query = path.size() < target.size() ? target.substr(path.size() + 1) : std::string_view{};
  return {path, query};
}

}  // namespace

Response handle(const Request& req, const Peer& peer, deploy::Control& control, const Access& access) {
  const auto [path, query] = split_target(req.target);
  auto found = look_up(req, path, query, peer, access, false);
  if (found.answer) return std::move(*found.answer);
  return found.route->sync(Call{req, path, query, std::move(found.arg), peer, control, access, nullptr});
}

boost::asio::awaitable<Response> handle_async(Request req, Peer peer, deploy::Control& control, const Access& access,
                                              HubReads* hub_reads) {
  // Copies, not a structured binding: GCC 12 keeps a binding out of the coroutine frame.
  const auto target = split_target(req.target);
  const std::string_view path = target.first, query = target.second;
  auto found = look_up(req, path, query, peer, access, true);
  if (found.answer) co_return std::move(*found.answer);
  const Call call{req, path, query, std::move(found.arg), peer, control, access, hub_reads};
  if (found.route->sync) co_return found.route->sync(call);
  co_return co_await found.route->async(call);
}

}  // namespace modeld::control
