#pragma once
// The closed set of failure kinds modeld reports, and the value type that carries one.
// The API's `error.code` is the snake_case name of an Errc (interface.md: "a stable
// snake_case name").

#include <boost/system/result.hpp>

#include <string>
#include <vector>
#include <string_view>
#include <utility>

namespace modeld {

/// Every failure modeld can report to a user; to_string() gives the stable API name.
enum class Errc {
  // requests and configuration
  bad_request,          ///< a malformed API request or CLI usage
  config_invalid,       ///< the configuration does not parse or validate
  unknown_model,        ///< no model of that name is configured
  deployment_running,   ///< a deployment is already running
  model_active,         ///< the model is in service (rm refuses it)
  deployment_ended,     ///< the deployment has already reached a terminal state
  not_found,            ///< no such route, deployment or file
  forbidden,            ///< the caller may not use this route
  too_many_requests,    ///< the caller has as many requests of this kind in progress as it may
  // the Hub
  hub_unauthorized,     ///< 401/403: missing or insufficient token, gated or private repository
  hub_not_found,        ///< repository, revision or file does not exist (404, X-Error-Code)
  hub_bad_response,     ///< the Hub answered something that is not the protocol
  hub_unavailable,      ///< 408/429/5xx after all retries
  network_error,        ///< connect, TLS, read or write failed
  timeout,              ///< an operation ran past its deadline
  // files
  io_error,             ///< a file system call failed
  disk_full,            ///< ENOSPC, or a plan that cannot fit within disk_reserve
  size_mismatch,        ///< a file's size differs from the listing
  checksum_mismatch,    ///< a file's sha256 or git blob sha1 differs from the listing
  safetensors_invalid,  ///< a safetensors header is malformed or does not cover its data
  checkpoint_incomplete,///< a file, shard or tensor the checkpoint needs is missing
  plan_invalid,         ///< include/exclude filter out files the checkpoint needs, or a path escapes
  // services
  unit_failed,          ///< systemd could not start or stop a unit, or it failed
  stop_timeout,         ///< the old service did not stop within stop_timeout
  readiness_timeout,    ///< the new service was not ready within startup_timeout
  health_failed,        ///< a readiness probe answered wrongly
  // deployment
  cancelled,            ///< the user cancelled, or the daemon is shutting down
  rollback_failed,      ///< the old service could not be restored
  internal,             ///< a bug: an invariant did not hold
};

/// Returns the stable snake_case name of `c`, e.g. "checksum_mismatch".
std::string_view to_string(Errc c) noexcept;

/// Parses a name produced by to_string(); returns Errc::internal for unknown names.
Errc errc_from_string(std::string_view name) noexcept;

/// A failure: its kind and a human message naming the file, tensor, unit or URL concerned.
/// Messages never contain secrets (the Hub token).
struct Error {
  Errc code = Errc::internal;
  std::string message;
  std::vector<std::string> files;  ///< repository paths the error is about, for the journal's MODELD_FILE
};

/// Makes an Error; `message` should say what failed and where ("shard x.safetensors: ...").
inline Error make_error(Errc code, std::string message) { return Error{code, std::move(message), {}}; }

/// Makes an Error about the repository paths `files` (they also go to the journal as MODELD_FILE).
inline Error make_error(Errc code, std::string message, std::vector<std::string> files) {
  return Error{code, std::move(message), std::move(files)};
}

/// The value-or-error type returned by every operation whose failure is an expected outcome.
template <class T>
using Result = boost::system::result<T, Error>;

/// Thrown by Result<T>::value() on an error; carries the Error.
struct ErrorException : std::exception {
  Error error;
  explicit ErrorException(Error e) : error(std::move(e)) {}
  const char* what() const noexcept override { return error.message.c_str(); }
};

/// ADL hook used by boost::system::result<T, Error>::value() to throw ErrorException.
[[noreturn]] void throw_exception_from_error(const Error& e, const boost::source_location& loc);

}  // namespace modeld
