#include "hub/hub.hpp"

#include "util/text.hpp"

#include <boost/asio/as_tuple.hpp>
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

constexpr std::size_t kMaxListing = 64u << 20;  // a listing of 100,000 files is about 20 MiB

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

// A piece of server-supplied text fit for one line of a message: control characters become
// spaces and it is cut at `limit` characters.
std::string excerpt(std::string_view text, std::size_t limit) {
  std::string out;
  for (char c : text.substr(0, limit)) out.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c);
  if (text.size() > limit) out += "...";
  return out;
}

bool retryable_status(unsigned status) { return status == 408 || status == 429 || (status >= 500 && status < 600); }

// Retry-After as seconds or an HTTP-date (RFC 9110 10.2.3).
std::optional<std::chrono::milliseconds> retry_after(const http::ResponseHead& head) {
  auto v = head.headers.get("Retry-After");
  if (!v) return std::nullopt;
  auto s = http::parse_retry_after(*v, std::chrono::system_clock::now());
  if (!s) return std::nullopt;
  return std::chrono::milliseconds(std::min<std::chrono::seconds>(*s, std::chrono::hours(24)));
}

bool valid_repo_id(std::string_view repo) {
  auto slash = repo.find('/');
  return slash != std::string_view::npos && slash > 0 && slash + 1 < repo.size() &&
         repo.find('/', slash + 1) == std::string_view::npos && util::safe_relative_path(repo);
}

Result<Snapshot> parse_snapshot(const http::Response& response, std::string_view what) {
  auto bad = [&](std::string why) { return make_error(Errc::hub_bad_response, fmt::format("{}: {}", what, why)); };
  json j = json::parse(response.body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return bad(fmt::format("the answer (HTTP {}, Content-Type '{}') is not a JSON object: '{}'",
                           response.head.status,
                           excerpt(response.head.headers.get("Content-Type").value_or(""), 80),
                           excerpt(response.body, 80)));
  Snapshot snap;
  auto sha = j.find("sha");
  if (sha == j.end() || !sha->is_string() || !is_hex(sha->get_ref<const std::string&>(), 40))
    return bad("field 'sha' is missing or not a 40-hex-digit commit");
  snap.commit = lowercase(sha->get<std::string>());

  auto siblings = j.find("siblings");
  if (siblings == j.end() || !siblings->is_array()) return bad("field 'siblings' is missing or not an array");
  snap.files.reserve(siblings->size());
  for (std::size_t i = 0; i < siblings->size(); ++i) {
    const json& s = (*siblings)[i];
    auto field = [&](std::string_view name) { return fmt::format("siblings[{}].{}", i, name); };
    if (!s.is_object()) return bad(fmt::format("siblings[{}] is not an object", i));
    RepoFile f;
    auto name = s.find("rfilename");
    if (name == s.end() || !name->is_string()) return bad(fmt::format("field '{}' is missing or not a string", field("rfilename")));
    f.path = name->get<std::string>();
    if (!util::safe_relative_path(f.path))
      return bad(fmt::format("field '{}' is an unsafe path: '{}'", field("rfilename"), excerpt(f.path, 200)));
    auto size = s.find("size");
    if (size == s.end() || !size->is_number_unsigned())
      return bad(fmt::format("field '{}' ({}) is missing or not a non-negative integer", field("size"), f.path));
    f.size = size->get<std::uint64_t>();
    auto blob = s.find("blobId");
    if (blob == s.end() || !blob->is_string() || !is_hex(blob->get_ref<const std::string&>(), 40))
      return bad(fmt::format("field '{}' ({}) is missing or not a 40-hex-digit blob id", field("blobId"), f.path));
    f.blob_id = lowercase(blob->get<std::string>());
    auto lfs = s.find("lfs");
    if (lfs != s.end() && !lfs->is_null()) {
      auto sha256 = lfs->is_object() ? lfs->find("sha256") : lfs->end();
      if (!lfs->is_object() || sha256 == lfs->end() || !sha256->is_string() ||
          !is_hex(sha256->get_ref<const std::string&>(), 64))
        return bad(fmt::format("field '{}' ({}) is missing or not 64 hex digits", field("lfs.sha256"), f.path));
      f.lfs_sha256 = lowercase(sha256->get<std::string>());
    }
    snap.files.push_back(std::move(f));
  }
  std::sort(snap.files.begin(), snap.files.end(), [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
  auto dup = std::adjacent_find(snap.files.begin(), snap.files.end(),
                                [](const RepoFile& a, const RepoFile& b) { return a.path == b.path; });
  if (dup != snap.files.end()) return bad(fmt::format("the file '{}' is listed twice", dup->path));
  return snap;
}

}  // namespace

Hub::Hub(http::Client& client, std::string endpoint) : client_(client), endpoint_(std::move(endpoint)) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
}

awaitable<Result<Snapshot>> Hub::snapshot(const std::string& repo, const std::string& revision) {
  if (!valid_repo_id(repo))
    co_return make_error(Errc::bad_request, fmt::format("'{}' is not a repository id of the form org/name", repo));
  if (revision.empty()) co_return make_error(Errc::bad_request, fmt::format("listing {}: the revision is empty", repo));
  const std::string what = fmt::format("listing {} at {}", repo, revision);
  auto url = http::Url::parse(fmt::format("{}/api/models/{}/revision/{}?blobs=true", endpoint_,
                                          util::url_encode_path(repo), util::url_encode_segment(revision)));
  if (!url) co_return make_error(Errc::bad_request, fmt::format("{}: {}", what, url.error().message));
  http::Request request;
  request.url = *url;
  request.headers.add("Accept", "application/json");

  Error last = make_error(Errc::internal, what + ": not tried");
  const unsigned tries = std::max(1u, retry_.max_tries);
  for (unsigned attempt = 1;; ++attempt) {
    std::optional<std::chrono::milliseconds> wait;
    auto r = co_await client_.request(request, kMaxListing);
    if (!r) {
      if (r.error().code != Errc::network_error && r.error().code != Errc::timeout) co_return r.error();
      last = make_error(r.error().code, fmt::format("{}: {}", what, r.error().message));
    } else if (r->head.status >= 200 && r->head.status < 300) {
      auto snap = parse_snapshot(*r, what);
      if (!snap) co_return snap.error();
      snap->repo = repo;
      snap->revision = revision;
      co_return snap;
    } else {
      last = error_from_response(r->head, what);
      if (!retryable_status(r->head.status)) co_return last;
      if (auto ra = retry_after(r->head)) wait = std::min(*ra, retry_.max_retry_after);
    }
    if (attempt >= tries) break;
    if (!wait) {
      wait = retry_.backoff.empty() ? std::chrono::milliseconds(0)
                                    : retry_.backoff[std::min<std::size_t>(attempt - 1, retry_.backoff.size() - 1)];
    }
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(*wait);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return make_error(Errc::cancelled, what + ": cancelled");
  }
  last.message += fmt::format(" (gave up after {} tries)", tries);
  co_return last;
}

Result<http::Url> Hub::resolve_url(const std::string& repo, const std::string& commit, const std::string& path) const {
  if (!valid_repo_id(repo))
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
  if (code) message += fmt::format(" {}", excerpt(*code, 40));
  if (text) message += fmt::format(": {}", excerpt(*text, 300));
  // The Hub answers 401 also for a private or missing repository when no token was sent.
  if (head.status == 401) message += " (a token with access to the repository may be needed)";
  return make_error(errc, std::move(message));
}

}  // namespace modeld::hub
