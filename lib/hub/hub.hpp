#pragma once
// The Hugging Face Hub protocol (../shared/docs/hub-protocol.md): resolve a revision to a
// commit and list its files, build download URLs, and map the Hub's error answers to Errc.

#include "http/client.hpp"
#include "hub/retry.hpp"
#include "repo/snapshot.hpp"
#include "util/error.hpp"
#include "util/single_flight.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::hub {

/// Listings already read, by endpoint, repository and commit (a commit's listing never changes),
/// least recently used first out. Never keyed on or holding the token. Not thread-safe: used on
/// the event loop only.
class ListingCache {
 public:
  /// Keeps at most `max_listings` listings and `max_files` files in all (a listing of more
  /// files than that is not kept).
  ListingCache(std::size_t max_listings, std::size_t max_files);

  /// The listing of `repo` at `commit` (40 lowercase hex digits) from `endpoint`, or null.
  std::shared_ptr<const repo::Snapshot> find(const std::string& endpoint, const std::string& repo,
                                       const std::string& commit);

  /// Keeps `listing` (its repo and commit are the key, with `endpoint`), dropping the least
  /// recently used ones beyond the bounds.
  void put(const std::string& endpoint, std::shared_ptr<const repo::Snapshot> listing);

  /// Drops the listing of `repo` at `commit` from `endpoint`, if kept (one that planning refused
  /// or whose files the Hub does not have: whatever sent it, the next read asks again).
  void forget(const std::string& endpoint, const std::string& repo, const std::string& commit);

  /// Listings kept now.
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const repo::Snapshot> listing;
  };
  std::size_t max_listings_, max_files_, files_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

/// A client for one Hub endpoint.
class Hub {
 public:
  /// Uses `client` (whose auth_origin is this endpoint's origin) to talk to `endpoint`
  /// ("https://huggingface.co", no trailing slash needed).
  Hub(http::Client& client, std::string endpoint);

  /// The commit of `revision` and every file there with size, blob id and LFS sha256: a
  /// revision that is not a 40-hex commit is first resolved with GET
  /// /api/models/{repo}/revision/{revision}?expand=sha (the revision percent-encoded whole),
  /// then the listing GET /api/models/{repo}/revision/{commit}?blobs=true comes from the
  /// ListingCache or the Hub; concurrent calls for one repo and revision share one set of
  /// requests (single-flight). Each request must be answered whole within listing_timeout and is
  /// retried per RetryPolicy. Copies the listing: prefer listing() for large repositories.
  /// Errors: bad_request (a repo that is not "org/name"), hub_not_found (RepoNotFound,
  /// RevisionNotFound, 404), hub_unauthorized (401/403, GatedRepo), hub_unavailable
  /// (408/429/5xx), hub_bad_response (not JSON, missing fields, a commit that is not 40 hex
  /// digits, an unsafe path, another commit than asked for), network_error, timeout, cancelled.
  boost::asio::awaitable<Result<repo::Snapshot>> snapshot(const std::string& repo, const std::string& revision);

  /// Like snapshot(), but shares the listing (held in a compact form: repo::RepoFile records, no JSON
  /// tree) with the cache and the other callers; its `revision` field is the commit.
  boost::asio::awaitable<Result<std::shared_ptr<const repo::Snapshot>>> listing(const std::string& repo,
                                                                          const std::string& revision);

  /// Reads repository file `path` of `repo` at `commit` (a few kB of metadata, such as a
  /// safetensors index) into memory, at most `max_bytes`, within listing_timeout per try and
  /// retried per RetryPolicy. Errors as snapshot(), the request named "reading PATH of REPO".
  boost::asio::awaitable<Result<std::string>> read_metadata(const std::string& repo, const std::string& commit,
                                                            const std::string& path, std::size_t max_bytes);

  /// The URL that serves `path` of `repo` at `commit`: {endpoint}/{repo}/resolve/{commit}/{path}
  /// with path segments percent-encoded.
  Result<http::Url> resolve_url(const std::string& repo, const std::string& commit, const std::string& path) const;

  /// Maps a non-2xx Hub answer to an Error using X-Error-Code / X-Error-Message; `what` names the
  /// request ("listing moonshotai/Kimi-K2.5 at main").
  static Error error_from_response(const http::ResponseHead& head, std::string_view what);

  /// The endpoint, as configured.
  const std::string& endpoint() const { return endpoint_; }

  /// Replaces the retry schedule of listings and metadata reads (tests use milliseconds).
  void set_retry_policy(RetryPolicy policy) { retry_ = std::move(policy); }

  /// Sets the deadline of one whole listing or metadata request, from connecting to the body's
  /// last byte (hub.listing_timeout; default 60 s); a Hub that drips bytes cannot hold a plan.
  void set_listing_timeout(std::chrono::milliseconds timeout) { listing_timeout_ = timeout; }

  /// Parses listings on `pool` (the disk pool) instead of the event loop; `pool` must outlive
  /// the Hub. Without it, parsing (about 0.1 s for 100,000 files) runs on the caller's thread.
  void set_parse_pool(boost::asio::thread_pool& pool) { parse_pool_ = &pool; }

  /// The cache of listings at commits (tests look into it).
  const ListingCache& cache() const { return cache_; }

  /// Drops the cached listing of `repo` at `commit` (ListingCache::forget), so that a listing
  /// planning refused, or one naming files the Hub then does not have, is read again next time.
  void forget_listing(const std::string& repo, const std::string& commit) { cache_.forget(endpoint_, repo, commit); }

 private:
  using Shared = std::shared_ptr<const repo::Snapshot>;
  boost::asio::awaitable<Result<Shared>> list_uncached(std::string repo, std::string revision);
  boost::asio::awaitable<Result<std::string>> resolve_commit(const std::string& repo, const std::string& revision);
  Result<http::Url> revision_url(const std::string& repo, const std::string& revision, std::string_view query,
                                 const std::string& what) const;
  boost::asio::awaitable<Result<Shared>> fetch_listing(const std::string& repo, const std::string& commit,
                                                       const std::string& what);
  boost::asio::awaitable<Result<repo::Snapshot>> parse(http::Response response, const std::string& what, bool want_files);
  boost::asio::awaitable<Result<http::Response>> get(const http::Url& url, std::size_t max_body, const std::string& what);
  boost::asio::awaitable<Result<http::Response>> get_once(const http::Request& request, std::size_t max_body,
                                                          const std::string& what);

  http::Client& client_;
  std::string endpoint_;
  RetryPolicy retry_;
  std::chrono::milliseconds listing_timeout_ = std::chrono::seconds(60);
  boost::asio::thread_pool* parse_pool_ = nullptr;
  ListingCache cache_{16, 250'000};
  util::SingleFlight<Shared> flights_;
};

}  // namespace modeld::hub
