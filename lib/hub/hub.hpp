#pragma once
// The Hugging Face Hub protocol (../shared/docs/hub-protocol.md): resolve a revision to a
// commit and list its files, build download URLs, and map the Hub's error answers to Errc.

#include "http/client.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::hub {

/// One file of a repository at a commit, as the listing describes it.
struct RepoFile {
  std::string path;               ///< repository-relative, '/'-separated
  std::uint64_t size = 0;         ///< real content size in bytes
  std::string blob_id;            ///< git blob sha1 (of the LFS pointer for LFS files)
  std::optional<std::string> lfs_sha256;  ///< content sha256 for LFS files
  bool is_lfs() const { return lfs_sha256.has_value(); }
};

/// A repository at one commit.
struct Snapshot {
  std::string repo;      ///< "org/name"
  std::string revision;  ///< what was asked for (branch, tag or commit)
  std::string commit;    ///< 40 hex digits
  std::vector<RepoFile> files;  ///< sorted by path
};

/// How the listing is retried (hub-protocol.md "Retries"): on 408, 429, 5xx, network errors
/// and timeouts, waiting backoff[i] before try i+2 (the last entry repeats), or Retry-After
/// seconds when the Hub sends it, capped at max_retry_after.
struct RetryPolicy {
  unsigned max_tries = 5;
  std::vector<std::chrono::milliseconds> backoff{std::chrono::seconds(1), std::chrono::seconds(2),
                                                 std::chrono::seconds(4), std::chrono::seconds(8)};
  std::chrono::milliseconds max_retry_after = std::chrono::seconds(30);
};

/// A client for one Hub endpoint.
class Hub {
 public:
  /// Uses `client` (whose auth_origin is this endpoint's origin) to talk to `endpoint`
  /// ("https://huggingface.co", no trailing slash needed).
  Hub(http::Client& client, std::string endpoint);

  /// GET /api/models/{repo}/revision/{revision}?blobs=true (the revision percent-encoded whole):
  /// the commit and every file with size, blob id and LFS sha256, retried per RetryPolicy.
  /// Errors: bad_request (a repo that is not "org/name"), hub_not_found (RepoNotFound, RevisionNotFound, 404),
  /// hub_unauthorized (401/403, GatedRepo), hub_unavailable (408/429/5xx), hub_bad_response
  /// (not JSON, missing fields, a commit that is not 40 hex digits, an unsafe path),
  /// network_error, timeout.
  boost::asio::awaitable<Result<Snapshot>> snapshot(const std::string& repo, const std::string& revision);

  /// The URL that serves `path` of `repo` at `commit`: {endpoint}/{repo}/resolve/{commit}/{path}
  /// with path segments percent-encoded.
  Result<http::Url> resolve_url(const std::string& repo, const std::string& commit, const std::string& path) const;

  /// Maps a non-2xx Hub answer to an Error using X-Error-Code / X-Error-Message; `what` names the
  /// request ("listing moonshotai/Kimi-K2.5 at main").
  static Error error_from_response(const http::ResponseHead& head, std::string_view what);

  /// The endpoint, as configured.
  const std::string& endpoint() const { return endpoint_; }

  /// Replaces the retry schedule of snapshot() (tests use milliseconds instead of seconds).
  void set_retry_policy(RetryPolicy policy) { retry_ = std::move(policy); }

 private:
  http::Client& client_;
  std::string endpoint_;
  RetryPolicy retry_;
};

}  // namespace modeld::hub
