// The control API's routes: dispatch, authorization of mutating routes, body validation and
// the JSON shapes of interface.md "Control API".

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

Response handle(const Request& req, const Peer& peer, deploy::Control& control, const Access& access) {
  std::string_view target = req.target;
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view query =
      path.size() < target.size() ? target.substr(path.size() + 1) : std::string_view{};
  const auto parts = split_path(path);
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";

  auto not_found = [&] {
    return error_for(make_error(Errc::not_found, fmt::format("no route {}", path)));
  };

  if (parts.size() == 1 && parts[0] == "metrics") {
    if (!get) return method_not_allowed(req, path, "GET");
    Response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_text(control);
    return r;
  }
  if (parts.size() < 2 || parts[0] != "v1") return not_found();

  const auto& what = parts[1];
  if (parts.size() == 2 && what == "status") {
    if (!get) return method_not_allowed(req, path, "GET");
    return get_status(control);
  }
  if (parts.size() == 2 && what == "events") {
    if (!get) return method_not_allowed(req, path, "GET");
    Response r;
    r.content_type = "text/event-stream";
    r.event_stream = true;
    return r;
  }
  if (what != "deployments") return not_found();

  if (parts.size() == 2) {
    if (get) return list_deployments(query, control);
    if (!post) return method_not_allowed(req, path, "GET, POST");
    if (!access.allows(peer)) return forbidden(req, path, peer, access);
    if (auto ok = wire::known_query(query, path, {}); !ok) return error_for(ok.error());
    return start_deployment(req, control);
  }
  auto id = decode_segment(parts[2]);
  if (!id) return not_found();
  if (parts.size() == 3) {
    if (!get) return method_not_allowed(req, path, "GET");
    auto d = control.get(*id);
    if (!d) return error_for(d.error());
    return json_response(200, wire::to_json(*d));
  }
  if (parts.size() == 4 && parts[3] == "cancel") {
    if (!post) return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) return forbidden(req, path, peer, access);
    if (auto ok = wire::known_query(query, path, {}); !ok) return error_for(ok.error());
    auto d = control.cancel(*id);
    if (!d) return error_for(d.error());
    return json_response(200, wire::to_json(*d));
  }
  return not_found();
}

namespace {

// The model routes that await the Deployer: /v1/models/{name}/plan, /v1/models/{name}/verify,
// /v1/models/{name}/pull, /v1/models/{name}/stop, /v1/models/{name}. nullopt when the request is not one of them.
std::optional<std::pair<std::string, std::string>> model_route(std::string_view path) {
  const auto parts = split_path(path);
  if (parts.size() < 3 || parts.size() > 4 || parts[0] != "v1" || parts[1] != "models") return std::nullopt;
  auto name = decode_segment(parts[2]);
  if (!name) return std::nullopt;
  std::string action = parts.size() == 4 ? std::string(parts[3]) : std::string();
  if (!action.empty() && action != "plan" && action != "verify" && action != "pull" && action != "stop")
    return std::nullopt;
  return std::pair{std::move(*name), std::move(action)};
}

}  // namespace

boost::asio::awaitable<Response> handle_async(Request req, Peer peer, deploy::Control& control, const Access& access,
                                              HubReads* hub_reads) {
  std::string_view target = req.target;
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view query = path.size() < target.size() ? target.substr(path.size() + 1) : std::string_view{};
  if (const auto parts = split_path(path); parts.size() == 2 && parts[0] == "v1" && parts[1] == "models") {
    if (req.method != "GET") co_return method_not_allowed(req, path, "GET");
    const auto models = co_await control.models();
    co_return json_response(200, wire::models_json(models));
  }
  auto route = model_route(path);
  if (!route) co_return handle(req, peer, control, access);
  // Copies, not a structured binding: GCC 12 keeps a binding out of the coroutine frame.
  const std::string name = route->first;
  const std::string action = route->second;

  auto unknown = [&] {
    return error_for(make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", name)));
  };
  if (action == "plan") {
    if (req.method != "GET") co_return method_not_allowed(req, path, "GET");
    if (auto ok = wire::known_query(query, path, {"allow_downtime", "commit"}); !ok) co_return error_for(ok.error());
    auto allow_downtime = wire::bool_param(query, "allow_downtime");
    if (!allow_downtime) co_return error_for(allow_downtime.error());
    auto commit = wire::commit_param(query);
    if (!commit) co_return error_for(commit.error());
    if (!repo::valid_model_name(name)) co_return unknown();
    // A plan lists the Hub (and holds the listing while it runs): a few at once per user.
    std::optional<HubReads::Slot> slot;
    if (hub_reads) {
      auto entered = hub_reads->enter(peer, [&] { return access.allows(peer); });
      if (!entered) co_return too_many(req, path, peer, *hub_reads, entered.error());
      slot.emplace(std::move(*entered));
    }
    auto plan = co_await control.plan(name, *allow_downtime, *commit);
    if (!plan) co_return error_for(plan.error());
    co_return json_response(200, wire::to_json(*plan));
  }
  if (action == "verify") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = wire::known_query(query, path, {}); !ok) co_return error_for(ok.error());
    if (!repo::valid_model_name(name)) co_return unknown();
    auto report = co_await control.verify(name);
    if (!report) co_return error_for(report.error());
    co_return json_response(200, wire::to_json(*report));
  }
  if (action == "pull") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = wire::known_query(query, path, {}); !ok) co_return error_for(ok.error());
    co_return start_pull(name, req.body, control);
  }
  if (action == "stop") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = wire::known_query(query, path, {}); !ok) co_return error_for(ok.error());
    co_return start_stop(name, req.body, control);
  }
  if (req.method != "DELETE") co_return method_not_allowed(req, path, "DELETE");
  if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
  if (auto ok = wire::known_query(query, path, {"commit"}); !ok) co_return error_for(ok.error());
  if (!repo::valid_model_name(name)) co_return unknown();
  // ?commit=C removes that one revision; without it, the whole model.
  const auto commit = wire::commit_param(query);
  if (!commit) co_return error_for(commit.error());
  const std::optional<std::string> one = *commit;
  Result<deploy::Removal> removed = make_error(Errc::internal, "not removed");
  if (one)
    removed = co_await control.remove_revision(name, *one);
  else
    removed = co_await control.remove(name);
  if (!removed) co_return error_for(removed.error());
  co_return json_response(200, wire::to_json(*removed));
}

}  // namespace modeld::control
