#include "hub/hub.hpp"

#include "repo/ids.hpp"
#include "sys/log.hpp"
#include "util/on_pool.hpp"
#include "util/poll.hpp"
#include "util/text.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace modeld::hub {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;

namespace {

constexpr std::size_t kMaxListing = 64u << 20;  // a listing of 100,000 files is about 10-20 MiB

bool is_hex(std::string_view s, std::size_t length) {
  if (s.size() != length) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

std::string lowercase(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// What a listing's parser found about one sibling, checked when its object ends.
struct SiblingFields {
  std::optional<std::string> path;
  std::optional<std::uint64_t> size;
  std::optional<std::string> blob;
  bool lfs_object = false;             // "lfs" was an object (null or absent: not LFS)
  bool lfs_bad = false;                // "lfs" was neither an object nor null
  std::optional<std::string> sha256;   // lfs.sha256 when it was a string
};

// nlohmann's SAX interface over a listing (/revision?blobs=true): straight into repo::RepoFile records,
// so that no JSON tree of 100,000 siblings is ever built. Reads "sha" and, when `want_files`,
// "siblings"; every other value is skipped. Stops at the first problem, which `problem` names.
class ListingSax {
 public:
  using json = nlohmann::json;
  explicit ListingSax(bool want_files) : want_files_(want_files) {}

  std::optional<std::string> sha;
  bool siblings_array = false;  // "siblings" was an array
  std::vector<repo::RepoFile> files;
  std::optional<std::string> problem;
  bool not_an_object = false;

  bool null() { return scalar(Kind::null, {}); }
  bool boolean(bool) { return scalar(Kind::other, {}); }
  bool number_integer(json::number_integer_t) { return scalar(Kind::other, {}); }
  bool number_unsigned(json::number_unsigned_t v) {
    unsigned_ = v;
    return scalar(Kind::unsigned_number, {});
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(Kind::other, {}); }
  bool string(json::string_t& v) { return scalar(Kind::string, v); }
  bool binary(json::binary_t&) { return scalar(Kind::other, {}); }
  bool key(json::string_t& k) {
    if (skip_ == 0) key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    if (!problem) not_an_object = true;
    return false;
  }

 private:
  enum class Kind { null, string, unsigned_number, other };
  enum class At { start, top, siblings, sibling, lfs };

  bool fail(std::string why) {
    problem = std::move(why);
    return false;
  }
  std::string field(std::string_view name) const { return fmt::format("siblings[{}].{}", index_, name); }
  bool scalar(Kind kind, std::string_view text);
  bool open(bool object);
  bool close();
  bool finish_sibling();

  bool want_files_;
  std::vector<At> at_{At::start};
  std::size_t skip_ = 0;  // depth inside a value that is skipped
  std::string key_;
  std::uint64_t unsigned_ = 0;
  std::size_t index_ = 0;  // of the sibling being read
  SiblingFields cur_;
};

bool ListingSax::scalar(Kind kind, std::string_view text) {
  if (skip_ > 0) return true;
  switch (at_.back()) {
    case At::start:
      not_an_object = true;
      return false;
    case At::top:
      if (key_ == "sha") sha = kind == Kind::string ? std::optional<std::string>(text) : std::nullopt;
      if (key_ == "siblings") siblings_array = false;
      return true;
    case At::siblings:
      return fail(fmt::format("siblings[{}] is not an object", index_));
    case At::sibling:
      if (key_ == "rfilename") cur_.path = kind == Kind::string ? std::optional<std::string>(text) : std::nullopt;
      if (key_ == "size") cur_.size = kind == Kind::unsigned_number ? std::optional(unsigned_) : std::nullopt;
      if (key_ == "blobId") cur_.blob = kind == Kind::string ? std::optional<std::string>(text) : std::nullopt;
      if (key_ == "lfs") {
        cur_.lfs_object = false;
        cur_.lfs_bad = kind != Kind::null;
      }
      return true;
    case At::lfs:
      if (key_ == "sha256") cur_.sha256 = kind == Kind::string ? std::optional<std::string>(text) : std::nullopt;
      return true;
  }
  return true;
}

bool ListingSax::open(bool object) {
  if (skip_ > 0) {
    ++skip_;
    return true;
  }
  const At at = at_.back();
  if (at == At::start) {
    if (!object) not_an_object = true;
    at_.push_back(At::top);
    return object;
  }
  if (at == At::siblings) {
    if (!object) return fail(fmt::format("siblings[{}] is not an object", index_));
    cur_ = SiblingFields{};
    at_.push_back(At::sibling);
    return true;
  }
  if (at == At::top && key_ == "siblings") siblings_array = !object;
  if (at == At::top && key_ == "siblings" && !object && want_files_) {
    at_.push_back(At::siblings);
    return true;
  }
  if (at == At::sibling && key_ == "lfs") {
    cur_.lfs_object = object;
    cur_.lfs_bad = !object;
    cur_.sha256.reset();
    if (object) {
      at_.push_back(At::lfs);
      return true;
    }
  }
  // A container where a string or a number belongs counts as not of the right kind.
  if (at == At::top && key_ == "sha") sha.reset();
  if (at == At::sibling && key_ == "rfilename") cur_.path.reset();
  if (at == At::sibling && key_ == "size") cur_.size.reset();
  if (at == At::sibling && key_ == "blobId") cur_.blob.reset();
  if (at == At::lfs && key_ == "sha256") cur_.sha256.reset();
  skip_ = 1;
  return true;
}

bool ListingSax::close() {
  if (skip_ > 0) {
    --skip_;
    return true;
  }
  const At at = at_.back();
  at_.pop_back();
  if (at == At::sibling) {
    if (!finish_sibling()) return false;
    ++index_;
  }
  return true;
}

// The checks of one sibling, in the order of its fields' documentation.
bool ListingSax::finish_sibling() {
  repo::RepoFile f;
  if (!cur_.path) return fail(fmt::format("field '{}' is missing or not a string", field("rfilename")));
  f.path = std::move(*cur_.path);
  if (!util::safe_relative_path(f.path))
    return fail(fmt::format("field '{}' is an unsafe path: '{}'", field("rfilename"), util::excerpt(f.path, 200)));
  if (!cur_.size)
    return fail(fmt::format("field '{}' ({}) is missing or not a non-negative integer", field("size"), f.path));
  f.size = *cur_.size;
  if (!cur_.blob || !is_hex(*cur_.blob, 40))
    return fail(fmt::format("field '{}' ({}) is missing or not a 40-hex-digit blob id", field("blobId"), f.path));
  f.blob_id = lowercase(std::move(*cur_.blob));
  if (cur_.lfs_bad || (cur_.lfs_object && (!cur_.sha256 || !is_hex(*cur_.sha256, 64))))
    return fail(fmt::format("field '{}' ({}) is missing or not 64 hex digits", field("lfs.sha256"), f.path));
  if (cur_.lfs_object) f.lfs_sha256 = lowercase(std::move(*cur_.sha256));
  files.push_back(std::move(f));
  return true;
}

// Parses a listing answer (the files only when `want_files`): the commit and, sorted by path and
// without duplicates, the files. CPU work in proportion to the body (about 0.1 s for 10 MB).
Result<repo::Snapshot> parse_snapshot(const http::Response& response, std::string_view what, bool want_files) {
  auto bad = [&](std::string why) { return make_error(Errc::hub_bad_response, fmt::format("{}: {}", what, why)); };
  ListingSax sax(want_files);
  const bool ok = nlohmann::json::sax_parse(response.body, &sax);
  if (sax.problem) return bad(*sax.problem);
  if (!ok || sax.not_an_object)
    return bad(fmt::format("the answer (HTTP {}, Content-Type '{}') is not a JSON object: '{}'",
                           response.head.status,
                           util::excerpt(response.head.headers.get("Content-Type").value_or(""), 80),
                           util::excerpt(response.body, 80)));
  if (!sax.sha || !is_hex(*sax.sha, 40)) return bad("field 'sha' is missing or not a 40-hex-digit commit");
  repo::Snapshot snap;
  snap.commit = lowercase(std::move(*sax.sha));
  if (!want_files) return snap;
  if (!sax.siblings_array) return bad("field 'siblings' is missing or not an array");
  snap.files = std::move(sax.files);
  snap.files.shrink_to_fit();
  std::sort(snap.files.begin(), snap.files.end(), [](const repo::RepoFile& a, const repo::RepoFile& b) { return a.path < b.path; });
  auto dup = std::adjacent_find(snap.files.begin(), snap.files.end(),
                                [](const repo::RepoFile& a, const repo::RepoFile& b) { return a.path == b.path; });
  if (dup != snap.files.end()) return bad(fmt::format("the file '{}' is listed twice", dup->path));
  return snap;
}

}  // namespace

ListingCache::ListingCache(std::size_t max_listings, std::size_t max_files)
    : max_listings_(max_listings), max_files_(max_files) {}

namespace {
std::string cache_key(const std::string& endpoint, const std::string& repo, const std::string& commit) {
  return endpoint + '\n' + repo + '\n' + commit;
}
}  // namespace

std::shared_ptr<const repo::Snapshot> ListingCache::find(const std::string& endpoint, const std::string& repo,
                                                   const std::string& commit) {
  const auto key = cache_key(endpoint, repo, commit);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.key == key; });
  if (it == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it);
  return entries_.front().listing;
}

void ListingCache::forget(const std::string& endpoint, const std::string& repo, const std::string& commit) {
  const auto key = cache_key(endpoint, repo, commit);
  std::erase_if(entries_, [&](const Entry& e) {
    if (e.key != key) return false;
    files_ -= e.listing->files.size();
    return true;
  });
}

void ListingCache::put(const std::string& endpoint, std::shared_ptr<const repo::Snapshot> listing) {
  if (!listing || listing->files.size() > max_files_ || max_listings_ == 0) return;
  forget(endpoint, listing->repo, listing->commit);
  auto key = cache_key(endpoint, listing->repo, listing->commit);
  files_ += listing->files.size();
  entries_.push_front(Entry{std::move(key), std::move(listing)});
  while (entries_.size() > max_listings_ || files_ > max_files_) {
    files_ -= entries_.back().listing->files.size();
    entries_.pop_back();
  }
}

Hub::Hub(http::Client& client, std::string endpoint) : client_(client), endpoint_(std::move(endpoint)) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
}

awaitable<Result<repo::Snapshot>> Hub::snapshot(const std::string& repo, const std::string& revision) {
  auto shared = co_await listing(repo, revision);
  if (!shared) co_return shared.error();
  repo::Snapshot copy = **shared;
  copy.revision = revision;
  co_return copy;
}

awaitable<Result<Hub::Shared>> Hub::listing(const std::string& repo, const std::string& revision) {
  if (!repo::valid_repo_id(repo))
    co_return make_error(Errc::bad_request, fmt::format("'{}' is not a repository id of the form org/name", repo));
  if (revision.empty()) co_return make_error(Errc::bad_request, fmt::format("listing {}: the revision is empty", repo));
  // The key holds no token: one Hub object serves one endpoint with one token.
  co_return co_await flights_.run(repo + '\n' + revision, [this, &repo, &revision] { return list_uncached(repo, revision); });
}

awaitable<Result<Hub::Shared>> Hub::list_uncached(std::string repo, std::string revision) {
  const std::string what = fmt::format("listing {} at {}", repo, revision);
  std::string commit = lowercase(revision);
  if (!is_hex(revision, 40)) {
    auto resolved = co_await resolve_commit(repo, revision);
    if (!resolved) co_return resolved.error();
    commit = std::move(*resolved);
  }
  if (auto hit = cache_.find(endpoint_, repo, commit)) co_return hit;
  auto fetched = co_await fetch_listing(repo, commit, what);
  if (!fetched) co_return fetched.error();
  cache_.put(endpoint_, *fetched);
  co_return fetched;
}

// {endpoint}/api/models/{repo}/revision/{revision}?{query}, the revision percent-encoded whole;
// bad_request naming `what` when that is no URL.
Result<http::Url> Hub::revision_url(const std::string& repo, const std::string& revision, std::string_view query,
                                    const std::string& what) const {
  auto url = http::Url::parse(fmt::format("{}/api/models/{}/revision/{}?{}", endpoint_, util::url_encode_path(repo),
                                          util::url_encode_segment(revision), query));
  if (!url) return make_error(Errc::bad_request, fmt::format("{}: {}", what, url.error().message));
  return url;
}

// A branch or tag to its commit, without the listing: GET .../revision/REV?expand=sha answers
// {"_id", "id", "sha"} on the Hub (a server that ignores `expand` sends the whole listing, whose
// siblings are skipped).
awaitable<Result<std::string>> Hub::resolve_commit(const std::string& repo, const std::string& revision) {
  const std::string what = fmt::format("listing {} at {}", repo, revision);
  auto url = revision_url(repo, revision, "expand=sha", what);
  if (!url) co_return url.error();
  auto r = co_await get(*url, kMaxListing, what);
  if (!r) co_return r.error();
  auto snap = co_await parse(std::move(*r), what, false);
  if (!snap) co_return snap.error();
  co_return std::move(snap->commit);
}

awaitable<Result<Hub::Shared>> Hub::fetch_listing(const std::string& repo, const std::string& commit,
                                                  const std::string& what) {
  auto url = revision_url(repo, commit, "blobs=true", what);
  if (!url) co_return url.error();
  auto r = co_await get(*url, kMaxListing, what);
  if (!r) co_return r.error();
  auto snap = co_await parse(std::move(*r), what, true);
  if (!snap) co_return snap.error();
  if (snap->commit != commit)
    co_return make_error(Errc::hub_bad_response, fmt::format("{}: asked for commit {}, the Hub answered {}", what,
                                                             commit, snap->commit));
  snap->repo = repo;
  snap->revision = commit;
  co_return std::make_shared<const repo::Snapshot>(std::move(*snap));
}

// Parses on the parse pool when there is one; the body is freed as soon as the records are made.
awaitable<Result<repo::Snapshot>> Hub::parse(http::Response response, const std::string& what, bool want_files) {
  auto job = [&response, &what, want_files] {
    auto snap = parse_snapshot(response, what, want_files);
    response.body = std::string();
    return snap;
  };
  if (!parse_pool_) co_return job();
  co_return co_await util::on_pool<Result<repo::Snapshot>>(*parse_pool_, job);
}

awaitable<Result<std::string>> Hub::read_metadata(const std::string& repo, const std::string& commit,
                                                  const std::string& path, std::size_t max_bytes) {
  auto url = resolve_url(repo, commit, path);
  if (!url) co_return url.error();
  auto r = co_await get(*url, max_bytes, fmt::format("reading {} of {}", path, repo));
  if (!r) co_return r.error();
  co_return std::move(r->body);
}

// GET `url` (Accept: application/json), each try within listing_timeout, retried per RetryPolicy;
// the 2xx answer, else the Hub's error (error_from_response), network_error or timeout.
awaitable<Result<http::Response>> Hub::get(const http::Url& url, std::size_t max_body, const std::string& what) {
  http::Request request;
  request.url = url;
  request.headers.add("Accept", "application/json");
  Retrier retrier(retry_);
  for (;;) {
    std::optional<std::chrono::seconds> asked;
    auto r = co_await get_once(request, max_body, what);
    if (r && r->head.status >= 200 && r->head.status < 300) co_return r;
    Error last = r ? error_from_response(r->head, what) : r.error();
    if (r ? !retryable_status(r->head.status) : !retryable(r.error().code)) co_return last;
    if (r) asked = retry_after(r->head);
    auto wait = retrier.failed(asked);
    if (!wait) {
      last.message += fmt::format(" (gave up after {} tries)", retrier.max_tries());
      co_return last;
    }
    // A deployment that sits in planning through minutes of retries says why, each time.
    sys::logf(sys::Level::warning, "{}; retrying in {:.1f} s (try {} of {})", last.message,
              std::chrono::duration<double>(*wait).count(), retrier.failures() + 1, retrier.max_tries());
    if (!co_await util::pause_for(*wait)) co_return make_error(Errc::cancelled, what + ": cancelled");
  }
}

// One try of get(): the request races a timer of listing_timeout; the loser is cancelled.
awaitable<Result<http::Response>> Hub::get_once(const http::Request& request, std::size_t max_body,
                                                const std::string& what) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer deadline(co_await asio::this_coro::executor);
  deadline.expires_after(listing_timeout_);
  auto raced = co_await (client_.request(request, max_body) || deadline.async_wait(asio::use_awaitable));
  if (raced.index() == 1)
    co_return make_error(Errc::timeout, fmt::format("{}: no complete answer within {} ms (hub.listing_timeout)", what,
                                                    listing_timeout_.count()));
  auto r = std::get<0>(std::move(raced));
  if (!r) co_return make_error(r.error().code, fmt::format("{}: {}", what, r.error().message));
  co_return r;
}

Result<http::Url> Hub::resolve_url(const std::string& repo, const std::string& commit, const std::string& path) const {
  if (!repo::valid_repo_id(repo))
    return make_error(Errc::bad_request, fmt::format("'{}' is not a repository id of the form org/name", repo));
  if (commit.empty() || commit.find('/') != std::string::npos)
    return make_error(Errc::bad_request, fmt::format("'{}' is not a commit", commit));
  if (!util::safe_relative_path(path))
    return make_error(Errc::bad_request, fmt::format("'{}' is not a safe repository path", path));
  return http::Url::parse(fmt::format("{}/{}/resolve/{}/{}", endpoint_, util::url_encode_path(repo),
                                      util::url_encode_segment(commit), util::url_encode_path(path)));
}

Error Hub::error_from_response(const http::ResponseHead& head, std::string_view what) {
  auto code = head.headers.get("X-Error-Code");
  auto text = head.headers.get("X-Error-Message");
  Errc errc = Errc::hub_bad_response;
  if (code && (*code == "RepoNotFound" || *code == "RevisionNotFound" || *code == "EntryNotFound"))
    errc = Errc::hub_not_found;
  else if ((code && *code == "GatedRepo") || head.status == 401 || head.status == 403)
    errc = Errc::hub_unauthorized;
  else if (head.status == 404)
    errc = Errc::hub_not_found;
  else if (retryable_status(head.status))
    errc = Errc::hub_unavailable;
  std::string message = fmt::format("{}: HTTP {}", what, head.status);
  if (code) message += fmt::format(" {}", util::excerpt(*code, 40));
  if (text) message += fmt::format(": {}", util::excerpt(*text, 300));
  // The Hub answers 401 to a token it does not accept (wrong, expired, revoked), saying so in
  // X-Error-Message, and also for a private or missing repository when no token was sent.
  if (head.status == 401 && text && text->find("Invalid credentials") != std::string::npos)
    message += " (the Hub refused the token modeld sent: it is wrong, expired or revoked; put a valid token in "
               "[hub] token_file, the hf-token credential or $HF_TOKEN and restart modeld)";
  else if (head.status == 401)
    message += " (a token with access to the repository may be needed)";
  else if (head.status == 403)
    message += " (the token is valid but has no access to this repository: request access on the repository's "
               "Hub page, or use a token that has it)";
  return make_error(errc, std::move(message));
}

}  // namespace modeld::hub
