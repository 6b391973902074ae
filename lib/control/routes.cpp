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
// The fields of POST /v1/deployments, named in the error for an unknown one.
constexpr const char* kDeployFields = "model, allow_downtime, restart, commit";

Response json_response(unsigned status, const json& body) {
  Response r;
  r.status = status;
  r.body = util::dump_json(body);
  return r;
}

Response error_for(const Error& e) { return error_response(http_status(e.code), e); }

json active_json(const std::optional<deploy::Active>& a) {
  if (!a) return nullptr;
  return json{{"model", a->model}, {"commit", a->commit}, {"unit", a->unit},
              {"port", a->port},   {"since", a->since}};
}

// GET /v1/status "watchdog": the active model's record, null when nothing watches it. It is the
// watchdog of the active model's entry in `services` when there is one; else the record of the
// model watched now (the first of control.watchdogs()) when that is the active model.
json watchdog_json(const deploy::Control& control, const std::optional<deploy::Active>& active,
                   const std::vector<deploy::ServiceInfo>& services) {
  if (!active) return nullptr;
  for (const auto& s : services)
    if (s.model == active->model) return s.watchdog ? deploy::to_json(*s.watchdog) : json(nullptr);
  auto all = control.watchdogs();
  if (all.empty() || all.front().model != active->model) return nullptr;
  return deploy::to_json(all.front());
}

// GET /v1/status "services": every service in service, in the order put into service.
json services_json(const std::vector<deploy::ServiceInfo>& services) {
  json out = json::array();
  for (const auto& s : services)
    out.push_back({{"model", s.model},
                   {"commit", s.commit},
                   {"unit", s.unit},
                   {"port", s.port},
                   {"gpu_ids", s.gpu_ids ? json(*s.gpu_ids) : json(nullptr)},
                   {"since", s.since},
                   {"watchdog", s.watchdog ? deploy::to_json(*s.watchdog) : json(nullptr)}});
  return out;
}

json revisions_json(const std::vector<deploy::RevisionInfo>& revisions) {
  json out = json::array();
  for (const auto& r : revisions)
    out.push_back({{"commit", r.commit}, {"state", r.state}, {"pulled", r.pulled}, {"in_service", r.in_service}});
  return out;
}

json model_json(const deploy::ModelInfo& m) {
  return json{{"name", m.name},
              {"repo", m.repo},
              {"revision", m.revision},
              {"commit", util::or_null(m.commit)},
              {"state", m.state},
              {"size_bytes", m.size_bytes},
              {"active", m.active},
              {"pinned", m.pinned},
              {"last_active", util::or_null(m.last_active)},
              {"revisions", revisions_json(m.revisions)}};
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

// The key=value pairs of query `q` in order (a pair without '=' has an empty value; empty pairs
// are skipped): one splitter for parse_query and known_query.
std::vector<std::pair<std::string_view, std::string_view>> query_pairs(std::string_view q) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  while (!q.empty()) {
    auto amp = q.find('&');
    auto pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    out.emplace_back(pair.substr(0, eq), eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1));
  }
  return out;
}

std::map<std::string, std::string, std::less<>> parse_query(std::string_view q) {
  std::map<std::string, std::string, std::less<>> out;
  for (const auto& [key, value] : query_pairs(q)) out.emplace(std::string(key), std::string(value));
  return out;
}

// The query of a route that changes something (or plans it): bad_request naming any parameter
// outside `known`, or one given twice, so a misspelt ?comit=C is refused instead of ignored
// (without it DELETE /v1/models/NAME would remove every revision).
Result<void> known_query(std::string_view query, std::string_view path, std::initializer_list<std::string_view> known) {
  std::set<std::string, std::less<>> seen;
  const std::string list = known.size() == 0 ? std::string("none") : fmt::format("{}", fmt::join(known, ", "));
  for (const auto& [key, value] : query_pairs(query)) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      return make_error(Errc::bad_request,
                        fmt::format("unknown query parameter \"{}\" on {} (known: {})", key, path, list));
    if (!seen.emplace(key).second)
      return make_error(Errc::bad_request, fmt::format("query parameter \"{}\" given twice on {}", key, path));
  }
  return {};
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

// Reads a boolean field of a request body into `out`; bad_request naming the field otherwise.
Result<void> read_bool_field(const std::string& key, const json& value, bool& out) {
  if (!value.is_boolean())
    return make_error(Errc::bad_request,
                      fmt::format("field \"{}\" must be true or false, not {}", key, value.type_name()));
  out = value.get<bool>();
  return {};
}

// Reads the "commit" of a deployment request; bad_request unless it is 40 lowercase hex digits.
Result<void> read_commit(const json& value, std::optional<std::string>& out) {
  if (!value.is_string() || !repo::is_commit_id(value.get<std::string>()))
    return make_error(Errc::bad_request, "field \"commit\" must be a commit id of 40 lowercase hex digits");
  out = value.get<std::string>();
  return {};
}

// Reads one field of a deployment request into `r`; bad_request for an unknown field or a wrong type.
Result<void> read_deploy_field(const std::string& key, const json& value, deploy::DeployRequest& r) {
  if (key == "model") {
    if (!value.is_string())
      return make_error(Errc::bad_request,
                        fmt::format("field \"model\" must be a string, not {}", value.type_name()));
    r.model = value.get<std::string>();
    return {};
  }
  if (key == "allow_downtime") return read_bool_field(key, value, r.allow_downtime);
  if (key == "restart") return read_bool_field(key, value, r.restart);
  if (key == "commit") return read_commit(value, r.commit);
  return make_error(Errc::bad_request, fmt::format("unknown field \"{}\" (known: {})", key, kDeployFields));
}

// Validates {"model": NAME, "allow_downtime": bool} strictly: a typo in a field name must not
// silently start a deployment with defaults.
Result<deploy::DeployRequest> parse_deploy_body(const std::string& body) {
  if (body.empty())
    return make_error(Errc::bad_request,
                      R"(request body is empty; expected {"model": NAME, "allow_downtime": false})");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    return make_error(Errc::bad_request,
                      fmt::format("request body is not valid JSON (at byte {})", e.byte));
  }
  if (!j.is_object())
    return make_error(Errc::bad_request, fmt::format("request body must be a JSON object, not {}",
                                                     j.type_name()));
  deploy::DeployRequest r;
  bool has_model = false;
  for (const auto& [key, value] : j.items()) {
    if (auto ok = read_deploy_field(key, value, r); !ok) return ok.error();
    has_model = has_model || key == "model";
  }
  if (!has_model) return make_error(Errc::bad_request, "field \"model\" is missing");
  return r;
}

Response get_status(deploy::Control& control) {
  json body;
  body["daemon"] = json{{"version", MODELD_VERSION}, {"uptime_s", control.uptime_s()}};
  auto active = control.active();
  const auto services = control.services();
  body["active"] = active_json(active);
  body["services"] = services_json(services);
  body["watchdog"] = watchdog_json(control, active, services);
  auto cur = control.current();
  body["deployment"] = cur ? deploy::to_json(*cur) : json(nullptr);
  return json_response(200, body);
}


Response list_deployments(std::string_view query, deploy::Control& control) {
  std::size_t limit = default_history_limit;
  auto params = parse_query(query);
  if (auto it = params.find("limit"); it != params.end()) {
    const auto& v = it->second;
    std::size_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc{} || p != v.data() + v.size() || n == 0)
      return error_for(make_error(Errc::bad_request,
                                  fmt::format("limit must be a positive integer, not \"{}\"", v)));
    limit = std::min(n, max_history_limit);
  }
  json list = json::array();
  for (const auto& d : control.history(limit)) {
    if (list.size() >= limit) break;
    list.push_back(deploy::to_json(d));
  }
  return json_response(200, json{{"deployments", std::move(list)}});
}

// The body of POST /v1/models/{name}/pull: empty, or {"commit": C}; bad_request for anything else.
Result<std::optional<std::string>> parse_pull_body(const std::string& body) {
  if (body.empty()) return std::optional<std::string>();
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(Errc::bad_request, R"(request body must be empty or a JSON object {"commit": C})");
  std::optional<std::string> commit;
  for (const auto& [key, value] : j.items()) {
    if (key != "commit") return make_error(Errc::bad_request, fmt::format("unknown field \"{}\" (known: commit)", key));
    if (auto ok = read_commit(value, commit); !ok) return ok.error();
  }
  return commit;
}

// POST /v1/models/{name}/pull: a record of kind pull, of the configured revision or of the
// body's "commit".
Response start_pull(const std::string& model, const std::string& body, deploy::Control& control) {
  auto commit = parse_pull_body(body);
  if (!commit) return error_for(commit.error());
  deploy::DeployRequest r;
  r.model = model;
  r.kind = deploy::Kind::pull;
  r.commit = *commit;
  auto d = control.start(r);
  if (!d) return error_for(d.error());
  return json_response(202, deploy::to_json(*d));
}

// POST /v1/models/{name}/stop: a record of kind stop; its body is empty or {} (a field there
// would be one a stop does not have: bad_request naming it).
Response start_stop(const std::string& model, const std::string& body, deploy::Control& control) {
  if (!body.empty()) {
    const json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return error_for(make_error(Errc::bad_request, "a stop's request body must be empty or {}"));
    if (!j.empty())
      return error_for(make_error(Errc::bad_request,
                                  fmt::format("unknown field \"{}\" (a stop takes none)", j.begin().key())));
  }
  auto d = control.stop(model);
  if (!d) return error_for(d.error());
  return json_response(202, deploy::to_json(*d));
}

Response start_deployment(const Request& req, deploy::Control& control) {
  auto body = parse_deploy_body(req.body);
  if (!body) return error_for(body.error());
  auto d = control.start(*body);
  if (!d) return error_for(d.error());
  return json_response(202, deploy::to_json(*d));
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
  return sse_frame(deploy::to_string(event.kind), util::dump_json(deploy::event_json(event)));
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
    if (auto ok = known_query(query, path, {}); !ok) return error_for(ok.error());
    return start_deployment(req, control);
  }
  auto id = decode_segment(parts[2]);
  if (!id) return not_found();
  if (parts.size() == 3) {
    if (!get) return method_not_allowed(req, path, "GET");
    auto d = control.get(*id);
    if (!d) return error_for(d.error());
    return json_response(200, deploy::to_json(*d));
  }
  if (parts.size() == 4 && parts[3] == "cancel") {
    if (!post) return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) return forbidden(req, path, peer, access);
    if (auto ok = known_query(query, path, {}); !ok) return error_for(ok.error());
    auto d = control.cancel(*id);
    if (!d) return error_for(d.error());
    return json_response(200, deploy::to_json(*d));
  }
  return not_found();
}

json plan_json(const deploy::PlanReport& p) {
  json preflight = json::array();
  for (const auto& c : p.preflight) preflight.push_back({{"check", c.check}, {"ok", c.ok}, {"message", c.message}});
  json evictions = json::array();
  for (const auto& e : p.evictions)
    evictions.push_back({{"name", e.name},
                         {"bytes", e.bytes},
                         {"last_active", util::or_null(e.last_active)},
                         {"active", e.active}});
  return json{{"model", p.model},
              {"repo", p.repo},
              {"revision", p.revision},
              {"commit", p.commit},
              {"already_serving", p.already_serving},
              {"verified", p.verified},
              {"files_total", p.files_total},
              {"bytes_total", p.bytes_total},
              {"files_to_fetch", p.files_to_fetch},
              {"bytes_to_fetch", p.bytes_to_fetch},
              {"bytes_local", p.bytes_local},
              {"bytes_linkable", p.bytes_linkable},
              {"bytes_partial", p.bytes_partial},
              {"adopt_from", util::or_null(p.adopt_from)},
              {"files_adoptable", p.files_adoptable},
              {"bytes_adoptable", p.bytes_adoptable},
              {"bytes_needed", p.bytes_needed},
              {"bytes_free", p.bytes_free},
              {"disk_reserve", p.disk_reserve},
              {"evictions", std::move(evictions)},
              {"fits", p.fits},
              {"shortfall_bytes", p.shortfall_bytes},
              {"allow_downtime", p.allow_downtime},
              {"active_model", util::or_null(p.active_model)},
              {"stops", p.stops},
              {"rollback_possible", p.rollback_possible},
              {"warming", p.warming},
              {"fits_with_allow_downtime", p.fits_with_allow_downtime},
              {"preflight", std::move(preflight)}};
}

json verify_json(const deploy::VerifyReport& r) {
  json problems = json::array();
  for (const auto& p : r.problems)
    problems.push_back({{"code", p.code},
                        {"file", p.file},
                        {"tensor", p.tensor.empty() ? json(nullptr) : json(p.tensor)},
                        {"message", p.message}});
  return json{{"model", r.model}, {"commit", r.commit}, {"files", r.files},
              {"bytes", r.bytes}, {"ok", r.ok()},       {"problems", std::move(problems)}};
}

json removal_json(const deploy::Removal& r) {
  return json{{"model", r.model}, {"bytes_freed", r.bytes_freed}, {"commits", r.commits}};
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

Result<bool> parse_bool_param(std::string_view query, std::string_view key) {
  auto params = parse_query(query);
  auto it = params.find(key);
  if (it == params.end()) return false;
  const auto& v = it->second;
  if (v.empty() || v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return make_error(Errc::bad_request, fmt::format("{} must be true or false, not \"{}\"", key, v));
}

// ?commit=C of a plan: exactly that commit, as deploy --commit plans it; bad_request unless it is
// 40 lowercase hex digits.
Result<std::optional<std::string>> commit_param(std::string_view query) {
  const auto params = parse_query(query);
  const auto c = params.find("commit");
  if (c == params.end()) return std::optional<std::string>();
  if (!repo::is_commit_id(c->second))
    return make_error(Errc::bad_request, "commit must be a commit id of 40 lowercase hex digits");
  return std::optional<std::string>(c->second);
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
    json list = json::array();
    for (const auto& m : models) list.push_back(model_json(m));
    co_return json_response(200, json{{"models", std::move(list)}});
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
    if (auto ok = known_query(query, path, {"allow_downtime", "commit"}); !ok) co_return error_for(ok.error());
    auto allow_downtime = parse_bool_param(query, "allow_downtime");
    if (!allow_downtime) co_return error_for(allow_downtime.error());
    auto commit = commit_param(query);
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
    co_return json_response(200, plan_json(*plan));
  }
  if (action == "verify") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = known_query(query, path, {}); !ok) co_return error_for(ok.error());
    if (!repo::valid_model_name(name)) co_return unknown();
    auto report = co_await control.verify(name);
    if (!report) co_return error_for(report.error());
    co_return json_response(200, verify_json(*report));
  }
  if (action == "pull") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = known_query(query, path, {}); !ok) co_return error_for(ok.error());
    co_return start_pull(name, req.body, control);
  }
  if (action == "stop") {
    if (req.method != "POST") co_return method_not_allowed(req, path, "POST");
    if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
    if (auto ok = known_query(query, path, {}); !ok) co_return error_for(ok.error());
    co_return start_stop(name, req.body, control);
  }
  if (req.method != "DELETE") co_return method_not_allowed(req, path, "DELETE");
  if (!access.allows(peer)) co_return forbidden(req, path, peer, access);
  if (auto ok = known_query(query, path, {"commit"}); !ok) co_return error_for(ok.error());
  if (!repo::valid_model_name(name)) co_return unknown();
  // ?commit=C removes that one revision; without it, the whole model.
  const auto params = parse_query(query);
  const auto commit = params.find("commit");
  const std::optional<std::string> one = commit == params.end() ? std::nullopt : std::optional(commit->second);
  if (one && !repo::is_commit_id(*one))
    co_return error_for(make_error(Errc::bad_request, "commit must be a commit id of 40 lowercase hex digits"));
  Result<deploy::Removal> removed = make_error(Errc::internal, "not removed");
  if (one)
    removed = co_await control.remove_revision(name, *one);
  else
    removed = co_await control.remove(name);
  if (!removed) co_return error_for(removed.error());
  co_return json_response(200, removal_json(*removed));
}

}  // namespace modeld::control
