#pragma once
// What a client asks of the control API (interface.md "Control API"): the bodies of POST
// /v1/deployments, /pull and /stop, and the query parameters of the routes, each read strictly
// (an unknown or mistyped field is refused by name, not ignored).

#include "wire/record.hpp"
#include "util/error.hpp"

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace modeld::wire {

/// What `POST /v1/deployments` asks for (interface.md "Control API"), or `POST
/// /v1/models/{name}/pull` (kind pull).
struct DeployRequest {
  std::string model;
  bool allow_downtime = false;
  bool restart = false;  ///< restart the model even when it already serves that commit with the same settings
  Kind kind = Kind::deploy;
  std::optional<std::string> commit;  ///< "commit": exactly this commit (40 lowercase hex), not the branch
};

/// Reads the body of POST /v1/deployments, {"model": NAME, "allow_downtime": bool, "restart":
/// bool, "commit": C}: bad_request for an empty body, one that is not a JSON object, an unknown
/// field, a mistyped one or a missing "model" (the message names it). Pure.
Result<DeployRequest> parse_deploy_body(const std::string& body);

/// Reads the body of POST /v1/models/{name}/pull: empty, or {"commit": C}; the commit or nullopt,
/// bad_request for anything else. Pure.
Result<std::optional<std::string>> parse_pull_body(const std::string& body);

/// Checks the body of POST /v1/models/{name}/stop: empty or {}; bad_request naming a field
/// there (a stop takes none) or saying the body is not an object. Pure.
Result<void> parse_stop_body(const std::string& body);

/// The query of a route that changes something (or plans it): bad_request naming any parameter
/// outside `known`, or one given twice, on `path` (so a misspelt ?comit=C is refused instead of
/// ignored). Pure.
Result<void> known_query(std::string_view query, std::string_view path, std::initializer_list<std::string_view> known);

/// The boolean parameter `key` of `query`: false when absent, true for "", "true" or "1", false
/// for "false" or "0"; bad_request naming it otherwise. Pure.
Result<bool> bool_param(std::string_view query, std::string_view key);

/// The "commit" parameter of `query`: nullopt when absent; bad_request unless it is 40 lowercase
/// hex digits. Pure.
Result<std::optional<std::string>> commit_param(std::string_view query);

/// The "limit" of GET /v1/deployments: `fallback` when absent, at most `max`; bad_request unless
/// it is a positive integer. Pure.
Result<std::size_t> limit_param(std::string_view query, std::size_t fallback, std::size_t max);

}  // namespace modeld::wire
