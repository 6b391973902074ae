#include "wire/request.hpp"

#include "repo/ids.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace modeld::wire {
namespace {

using nlohmann::json;

// The fields of POST /v1/deployments, named in the error for an unknown one.
constexpr const char* kDeployFields = "model, allow_downtime, restart, commit";

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
Result<void> read_deploy_field(const std::string& key, const json& value, DeployRequest& r) {
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

}  // namespace

// Strict: a typo in a field name must not silently start a deployment with defaults.
Result<DeployRequest> parse_deploy_body(const std::string& body) {
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
  DeployRequest r;
  bool has_model = false;
  for (const auto& [key, value] : j.items()) {
    if (auto ok = read_deploy_field(key, value, r); !ok) return ok.error();
    has_model = has_model || key == "model";
  }
  if (!has_model) return make_error(Errc::bad_request, "field \"model\" is missing");
  return r;
}

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

Result<void> parse_stop_body(const std::string& body) {
  if (body.empty()) return {};
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(Errc::bad_request, "a stop's request body must be empty or {}");
  if (!j.empty())
    return make_error(Errc::bad_request, fmt::format("unknown field \"{}\" (a stop takes none)", j.begin().key()));
  return {};
}

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

Result<bool> bool_param(std::string_view query, std::string_view key) {
  auto params = parse_query(query);
  auto it = params.find(key);
  if (it == params.end()) return false;
  const auto& v = it->second;
  if (v.empty() || v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return make_error(Errc::bad_request, fmt::format("{} must be true or false, not \"{}\"", key, v));
}

Result<std::optional<std::string>> commit_param(std::string_view query) {
  const auto params = parse_query(query);
  const auto c = params.find("commit");
  if (c == params.end()) return std::optional<std::string>();
  if (!repo::is_commit_id(c->second))
    return make_error(Errc::bad_request, "commit must be a commit id of 40 lowercase hex digits");
  return std::optional<std::string>(c->second);
}

Result<std::size_t> limit_param(std::string_view query, std::size_t fallback, std::size_t max) {
  auto params = parse_query(query);
  auto it = params.find("limit");
  if (it == params.end()) return fallback;
  const auto& v = it->second;
  std::size_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc{} || p != v.data() + v.size() || n == 0)
    return make_error(Errc::bad_request, fmt::format("limit must be a positive integer, not \"{}\"", v));
  return std::min(n, max);
}

}  // namespace modeld::wire
