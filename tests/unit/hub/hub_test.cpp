#include "hub/hub.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

using namespace modeld;
using modeld::test::Exchange;
using modeld::test::HeaderList;
using modeld::test::TestServer;
namespace asio = boost::asio;

namespace {

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kBlob = "fedcba9876543210fedcba9876543210fedcba98";
const std::string kSha256 = std::string(64, 'a');

std::string listing() {
  return fmt::format(R"({{"id": "org/name", "sha": "{0}", "siblings": [
      {{"rfilename": "model-00001.safetensors", "size": 1000, "blobId": "{1}",
        "lfs": {{"sha256": "{2}", "size": 1000, "pointerSize": 134}}}},
      {{"rfilename": "config.json", "size": 12, "blobId": "{1}"}},
      {{"rfilename": "sub/tokenizer.json", "size": 34, "blobId": "{1}", "lfs": null}}]}})",
                     kCommit, kBlob, kSha256);
}

// A client whose token goes to `server` only, and a Hub on it with a fast retry schedule.
struct Fixture {
  asio::io_context ioc;
  std::unique_ptr<TestServer> server;
  std::unique_ptr<http::Client> client;
  std::unique_ptr<hub::Hub> hub;

  explicit Fixture(TestServer::Handler handler) {
    server = std::make_unique<TestServer>(ioc, std::move(handler));
    http::ClientOptions opts;
    opts.auth_origin = server->url("");
    opts.bearer_token = "hf_SECRET_TOKEN";
    client = std::make_unique<http::Client>(ioc.get_executor(), opts);
    hub = std::make_unique<hub::Hub>(*client, server->url("/"));
    hub::RetryPolicy fast;
    fast.backoff_base = std::chrono::milliseconds(1);
    fast.max_retry_after = std::chrono::milliseconds(5);
    hub->set_retry_policy(fast);
  }

  Result<repo::Snapshot> snapshot(const std::string& repo = "org/name", const std::string& rev = "main") {
    return test::run(ioc, hub->snapshot(repo, rev));
  }
};

// An answer with an X-Error-Code.
TestServer::Handler hub_error(unsigned status, std::string code, std::string message) {
  return [=](Exchange& ex) -> asio::awaitable<void> {
    HeaderList h{{"X-Error-Code", code}, {"X-Error-Message", message}};
    co_await ex.respond(status, R"({"error": "x"})", std::move(h));
  };
}

http::ResponseHead head(unsigned status, HeaderList headers = {}) {
  http::ResponseHead h;
  h.status = status;
  for (auto& [k, v] : headers) h.headers.add(k, v);
  return h;
}

}  // namespace

TEST_CASE("a snapshot lists the commit and every file, sorted by path") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, listing()); });
  auto snap = f.snapshot("org/name", "refs/pr/1");
  REQUIRE(snap);
  CHECK(snap->repo == "org/name");
  CHECK(snap->revision == "refs/pr/1");
  CHECK(snap->commit == kCommit);
  REQUIRE(snap->files.size() == 3);
  CHECK(snap->files[0].path == "config.json");
  CHECK_FALSE(snap->files[0].is_lfs());
  CHECK(snap->files[0].size == 12);
  CHECK(snap->files[0].blob_id == kBlob);
  CHECK(snap->files[1].path == "model-00001.safetensors");
  CHECK(snap->files[1].lfs_sha256 == std::optional<std::string>(kSha256));
  CHECK(snap->files[1].size == 1000);
  CHECK(snap->files[2].path == "sub/tokenizer.json");
  CHECK_FALSE(snap->files[2].is_lfs());

  // A branch is resolved to its commit with a small request first, then listed at the commit.
  REQUIRE(f.server->requests().size() == 2);
  CHECK(f.server->requests()[0].target() == "/api/models/org/name/revision/refs%2Fpr%2F1?expand=sha");
  const auto& req = f.server->requests()[1];
  CHECK(req.target() == "/api/models/org/name/revision/" + kCommit + "?blobs=true");
  CHECK(req[boost::beast::http::field::authorization] == "Bearer hf_SECRET_TOKEN");
}

TEST_CASE("RepoNotFound is hub_not_found naming the listing, status and Hub message") {
  Fixture f(hub_error(404, "RepoNotFound", "Repository not found"));
  auto snap = f.snapshot();
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::hub_not_found);
  CHECK(snap.error().message.find("listing org/name at main") != std::string::npos);
  CHECK(snap.error().message.find("404") != std::string::npos);
  CHECK(snap.error().message.find("Repository not found") != std::string::npos);
  CHECK(snap.error().message.find("hf_SECRET_TOKEN") == std::string::npos);
  CHECK(f.server->requests().size() == 1);  // not retried
}

TEST_CASE("RevisionNotFound is hub_not_found") {
  Fixture f(hub_error(404, "RevisionNotFound", "Invalid rev id: nope"));
  auto snap = f.snapshot("org/name", "nope");
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::hub_not_found);
}

TEST_CASE("GatedRepo is hub_unauthorized") {
  Fixture f(hub_error(403, "GatedRepo", "Access to model org/name is restricted"));
  auto snap = f.snapshot();
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::hub_unauthorized);
  CHECK(snap.error().message.find("restricted") != std::string::npos);
  CHECK(f.server->requests().size() == 1);
}

TEST_CASE("an HTML page with status 200 is hub_bad_response quoting its start and content type") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> {
    HeaderList h{{"Content-Type", "text/html; charset=utf-8"}};
    co_await ex.respond(200, "<!DOCTYPE html>\n<html><body>Sign in to the proxy" + std::string(200, '.'), std::move(h));
  });
  auto snap = f.snapshot();
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::hub_bad_response);
  CHECK(snap.error().message.find(R"(<!DOCTYPE html>\n<html><body>Sign in)") != std::string::npos);  // escaped, one line
  CHECK(snap.error().message.find("text/html") != std::string::npos);
  CHECK(snap.error().message.size() < 400);
}

TEST_CASE("a listing with a bad field is hub_bad_response naming the field") {
  struct Case {
    std::string body, field;
  };
  std::vector<Case> cases = {
      {R"({"sha": "abc", "siblings": []})", "'sha'"},
      {fmt::format(R"({{"sha": "{}"}})", kCommit), "'siblings'"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"size": 1, "blobId": "{}"}}]}})", kCommit, kBlob),
       "siblings[0].rfilename"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "a", "blobId": "{}"}}]}})", kCommit, kBlob),
       "siblings[0].size"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "a", "size": -1, "blobId": "{}"}}]}})", kCommit, kBlob),
       "siblings[0].size"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "a", "size": 1}}]}})", kCommit), "siblings[0].blobId"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "a", "size": 1, "blobId": "{}", "lfs": {{"sha256": "xyz"}}}}]}})",
                   kCommit, kBlob),
       "siblings[0].lfs.sha256"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "../../etc/passwd", "size": 1, "blobId": "{}"}}]}})",
                   kCommit, kBlob),
       "unsafe path: '../../etc/passwd'"},
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "/abs", "size": 1, "blobId": "{}"}}]}})", kCommit, kBlob),
       "unsafe path"},
      // Control characters are shown escaped, as JSON escapes them, not dropped or replaced.
      {fmt::format(R"({{"sha": "{}", "siblings": [{{"rfilename": "a\u0000b\u007f\u001bc\n../x", "size": 1, "blobId": "{}"}}]}})",
                   kCommit, kBlob),
       R"(unsafe path: 'a\u0000b\u007f\u001bc\n../x')"},
  };
  for (const auto& c : cases) {
    Fixture f([&](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, c.body); });
    auto snap = f.snapshot();
    INFO(c.body);
    REQUIRE_FALSE(snap);
    CHECK(snap.error().code == Errc::hub_bad_response);
    CHECK(snap.error().message.find(c.field) != std::string::npos);
  }
}

TEST_CASE("the listing is retried on 503 and then succeeds") {
  int calls = 0;
  Fixture f([&](Exchange& ex) -> asio::awaitable<void> {
    if (++calls < 3) {
      HeaderList h{{"Retry-After", "1"}};
      co_await ex.respond(503, "busy", std::move(h));
    } else {
      co_await ex.respond(200, listing());
    }
  });
  auto start = std::chrono::steady_clock::now();
  auto snap = f.snapshot();
  REQUIRE(snap);
  CHECK(snap->commit == kCommit);
  CHECK(f.server->requests().size() == 4);  // the resolve request three times, then the listing
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));  // Retry-After capped
}

TEST_CASE("a listing that stays unavailable is hub_unavailable after max_tries") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(429, "slow down"); });
  auto snap = f.snapshot();
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::hub_unavailable);
  CHECK(snap.error().message.find("429") != std::string::npos);
  CHECK(f.server->requests().size() == 5);
}

TEST_CASE("a listing whose connection fails is retried and ends network_error") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n{\"sha\"");
  });
  auto snap = f.snapshot();
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::network_error);
  CHECK(snap.error().message.find("listing org/name at main") != std::string::npos);
  CHECK(f.server->requests().size() == 5);
}

TEST_CASE("a repository id that is not org/name is refused before any request") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, listing()); });
  for (const char* repo : {"name", "org/name/extra", "../name", "org/", ""}) {
    auto snap = f.snapshot(repo);
    INFO(repo);
    REQUIRE_FALSE(snap);
    CHECK(snap.error().code == Errc::bad_request);
  }
  CHECK(f.server->requests().empty());
}

TEST_CASE("Hub answers map to error codes") {
  using hub::Hub;
  CHECK(Hub::error_from_response(head(404, {{"X-Error-Code", "EntryNotFound"}}), "x").code == Errc::hub_not_found);
  CHECK(Hub::error_from_response(head(401, {{"X-Error-Code", "RepoNotFound"}}), "x").code == Errc::hub_not_found);
  CHECK(Hub::error_from_response(head(401, {{"X-Error-Code", "GatedRepo"}}), "x").code == Errc::hub_unauthorized);
  CHECK(Hub::error_from_response(head(401), "x").code == Errc::hub_unauthorized);
  CHECK(Hub::error_from_response(head(403), "x").code == Errc::hub_unauthorized);
  CHECK(Hub::error_from_response(head(404), "x").code == Errc::hub_not_found);
  CHECK(Hub::error_from_response(head(408), "x").code == Errc::hub_unavailable);
  CHECK(Hub::error_from_response(head(429), "x").code == Errc::hub_unavailable);
  CHECK(Hub::error_from_response(head(502), "x").code == Errc::hub_unavailable);
  CHECK(Hub::error_from_response(head(400), "x").code == Errc::hub_bad_response);
  CHECK(Hub::error_from_response(head(416), "x").code == Errc::hub_bad_response);
  auto e = Hub::error_from_response(head(404, {{"X-Error-Code", "EntryNotFound"}, {"X-Error-Message", "no\nfile"}}),
                                    "downloading f.bin");
  CHECK(e.message == R"(downloading f.bin: HTTP 404 EntryNotFound: no\nfile)");  // escaped, one line
}

TEST_CASE("a refused token and a token without access are told apart and say what to do") {
  using hub::Hub;
  auto refused = Hub::error_from_response(
      head(401, {{"X-Error-Message", "Invalid credentials in Authorization header"}}), "listing org/name");
  CHECK(refused.code == Errc::hub_unauthorized);
  CHECK(refused.message.find("HTTP 401") != std::string::npos);
  CHECK(refused.message.find("refused the token") != std::string::npos);
  CHECK(refused.message.find("token_file") != std::string::npos);
  auto anonymous = Hub::error_from_response(head(401, {{"X-Error-Code", "GatedRepo"}}), "listing org/name");
  CHECK(anonymous.message.find("a token with access to the repository may be needed") != std::string::npos);
  auto no_access = Hub::error_from_response(head(403, {{"X-Error-Code", "GatedRepo"}}), "listing org/name");
  CHECK(no_access.code == Errc::hub_unauthorized);
  CHECK(no_access.message.find("has no access") != std::string::npos);
}

TEST_CASE("a resolve URL percent-encodes path segments and keeps slashes") {
  asio::io_context ioc;
  http::Client client(ioc.get_executor(), {});
  hub::Hub hub(client, "https://huggingface.co/");
  auto u = hub.resolve_url("org/name", kCommit, "dir/a b+c.json");
  REQUIRE(u);
  CHECK(u->str() == "https://huggingface.co/org/name/resolve/" + kCommit + "/dir/a%20b%2Bc.json");
  CHECK_FALSE(hub.resolve_url("org/name", kCommit, "../x"));
  CHECK_FALSE(hub.resolve_url("org", kCommit, "x"));
}

namespace {

// A listing of `extra` files besides the three of listing(), with unknown fields, nested values
// and null lfs, as the Hub adds fields over time.
std::string big_listing(std::size_t extra) {
  std::string out = fmt::format(R"({{"id": "org/name", "cardData": {{"tags": [[1, 2], {{"a": null}}]}}, "sha": "{}",
      "siblings": [{{"rfilename": "config.json", "size": 12, "blobId": "{}", "lfs": null, "x": [{{}}]}})",
                                kCommit, kBlob);
  for (std::size_t i = 0; i < extra; ++i)
    out += fmt::format(R"(, {{"rfilename": "extra/{:06}.json", "size": {}, "blobId": "{}"}})", i, i, kBlob);
  return out + "], \"spaces\": []}";
}

// Answers 200 with `body` after `delay`.
TestServer::Handler after(std::chrono::milliseconds delay, std::string body) {
  return [=](Exchange& ex) -> asio::awaitable<void> {
    asio::steady_timer t(co_await asio::this_coro::executor);
    t.expires_after(delay);
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    co_await ex.respond(200, body);
  };
}

// Sends the head and then one byte of the body every `every`: each read gets bytes well within
// any read timeout, but the answer never completes.
TestServer::Handler drip(std::chrono::milliseconds every) {
  return [=](Exchange& ex) -> asio::awaitable<void> {
    co_await ex.write("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n");
    asio::steady_timer t(co_await asio::this_coro::executor);
    for (int i = 0; i < 2000; ++i) {
      t.expires_after(every);
      auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      co_await ex.write(i == 0 ? "{" : " ");
    }
  };
}

}  // namespace

TEST_CASE("a listing skips fields it does not know, whatever their nesting, without a JSON tree") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, big_listing(3)); });
  auto snap = f.snapshot("org/name", kCommit);
  REQUIRE(snap);
  REQUIRE(snap->files.size() == 4);
  CHECK(snap->files[0].path == "config.json");
  CHECK_FALSE(snap->files[0].is_lfs());
  CHECK(snap->files[3].path == "extra/000002.json");
  CHECK(snap->files[3].size == 2);
}

TEST_CASE("a listing at a commit is read from the Hub once, then from the cache") {
  Fixture f([](Exchange& ex) -> asio::awaitable<void> { co_await ex.respond(200, listing()); });
  for (int i = 0; i < 3; ++i) {
    auto snap = f.snapshot("org/name", kCommit);
    REQUIRE(snap);
    CHECK(snap->files.size() == 3);
    CHECK(snap->revision == kCommit);
  }
  CHECK(f.server->requests().size() == 1);
  // A branch at that commit costs only the small resolve request.
  auto branch = f.snapshot("org/name", "main");
  REQUIRE(branch);
  CHECK(branch->revision == "main");
  CHECK(branch->files.size() == 3);
  REQUIRE(f.server->requests().size() == 2);
  CHECK(f.server->requests()[1].target() == "/api/models/org/name/revision/main?expand=sha");
}

TEST_CASE("concurrent listings of one repository and revision share one set of Hub requests") {
  Fixture f(after(std::chrono::milliseconds(100), big_listing(1000)));
  std::vector<std::size_t> files;
  for (int i = 0; i < 16; ++i)
    asio::co_spawn(f.ioc, f.hub->snapshot("org/name", "main"), [&](std::exception_ptr e, Result<repo::Snapshot> r) {
      REQUIRE_FALSE(e);
      REQUIRE(r);
      files.push_back(r->files.size());
      if (files.size() == 16) f.ioc.stop();
    });
  f.ioc.run_for(std::chrono::seconds(20));
  REQUIRE(files.size() == 16);
  CHECK(f.server->requests().size() == 2);  // one resolve, one listing, for all 16
  CHECK(std::count(files.begin(), files.end(), 1001u) == 16);
}

TEST_CASE("concurrent callers share the listing itself, not copies of it") {
  Fixture f(after(std::chrono::milliseconds(50), big_listing(10)));
  std::vector<std::shared_ptr<const repo::Snapshot>> got;
  for (int i = 0; i < 4; ++i)
    asio::co_spawn(f.ioc, f.hub->listing("org/name", "main"), [&](std::exception_ptr e, auto r) {
      REQUIRE_FALSE(e);
      REQUIRE(r);
      got.push_back(*r);
      if (got.size() == 4) f.ioc.stop();
    });
  f.ioc.run_for(std::chrono::seconds(20));
  REQUIRE(got.size() == 4);
  for (const auto& g : got) CHECK(g.get() == got.front().get());
  CHECK(got.front()->revision == kCommit);
  CHECK(f.hub->cache().size() == 1);
}

TEST_CASE("a listing that drips bytes ends in timeout after listing_timeout, each try, and is retried") {
  Fixture f(drip(std::chrono::milliseconds(20)));
  f.hub->set_listing_timeout(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  auto snap = f.snapshot("org/name", kCommit);
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(snap);
  CHECK(snap.error().code == Errc::timeout);
  CHECK(snap.error().message.find("listing org/name at " + kCommit) != std::string::npos);
  CHECK(snap.error().message.find("hub.listing_timeout") != std::string::npos);
  CHECK(snap.error().message.find("gave up after 5 tries") != std::string::npos);
  CHECK(snap.error().message.find("hf_SECRET_TOKEN") == std::string::npos);
  CHECK(f.server->requests().size() == 5);
  CHECK(took >= std::chrono::milliseconds(1500));
  CHECK(took < std::chrono::seconds(10));
}

TEST_CASE("a metadata read that drips bytes ends in timeout too") {
  Fixture f(drip(std::chrono::milliseconds(20)));
  f.hub->set_listing_timeout(std::chrono::milliseconds(200));
  auto body = test::run(f.ioc, f.hub->read_metadata("org/name", kCommit, "model.safetensors.index.json", 1 << 20));
  REQUIRE_FALSE(body);
  CHECK(body.error().code == Errc::timeout);
  CHECK(body.error().message.find("reading model.safetensors.index.json of org/name") != std::string::npos);
  CHECK(f.server->requests().size() == 5);
}

TEST_CASE("a listing cancelled while it drips ends cancelled, not timeout, and is not retried") {
  Fixture f(drip(std::chrono::milliseconds(20)));
  f.hub->set_listing_timeout(std::chrono::seconds(30));
  asio::cancellation_signal cancel;
  std::optional<Result<repo::Snapshot>> out;
  asio::co_spawn(f.ioc, f.hub->snapshot("org/name", kCommit),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, Result<repo::Snapshot> r) {
                   REQUIRE_FALSE(e);
                   out.emplace(std::move(r));
                   f.ioc.stop();
                 }));
  asio::steady_timer t(f.ioc);
  t.expires_after(std::chrono::milliseconds(200));
  t.async_wait([&](auto) { cancel.emit(asio::cancellation_type::terminal); });
  f.ioc.run_for(std::chrono::seconds(10));
  REQUIRE(out);
  REQUIRE_FALSE(*out);
  CHECK(out->error().code == Errc::cancelled);
  CHECK(f.server->requests().size() == 1);
}

TEST_CASE("the listing cache keeps the most recently used listings within its bounds") {
  hub::ListingCache cache(2, 5);
  auto make = [](std::string repo, char c, std::size_t files) {
    auto s = std::make_shared<repo::Snapshot>();
    s->repo = std::move(repo);
    s->commit = std::string(40, c);
    s->files.resize(files);
    return std::shared_ptr<const repo::Snapshot>(s);
  };
  cache.put("https://hub", make("o/a", 'a', 2));
  cache.put("https://hub", make("o/b", 'b', 2));
  CHECK(cache.find("https://hub", "o/a", std::string(40, 'a')));  // now the most recent
  cache.put("https://hub", make("o/c", 'c', 2));                   // drops o/b (2 listings at most)
  CHECK_FALSE(cache.find("https://hub", "o/b", std::string(40, 'b')));
  CHECK(cache.find("https://hub", "o/a", std::string(40, 'a')));
  CHECK_FALSE(cache.find("https://mirror", "o/a", std::string(40, 'a')));  // another endpoint
  cache.put("https://hub", make("o/d", 'd', 4));  // 6 files in all: o/c goes, then o/a
  CHECK(cache.size() == 1);
  cache.put("https://hub", make("o/e", 'e', 6));  // more files than the whole cache: not kept
  CHECK(cache.size() == 1);
  CHECK(cache.find("https://hub", "o/d", std::string(40, 'd')));
  cache.forget("https://mirror", "o/d", std::string(40, 'd'));  // another endpoint's: kept
  CHECK(cache.find("https://hub", "o/d", std::string(40, 'd')));
  cache.forget("https://hub", "o/d", std::string(40, 'd'));  // refused by planning: read again
  CHECK_FALSE(cache.find("https://hub", "o/d", std::string(40, 'd')));
  CHECK(cache.size() == 0);
  cache.put("https://hub", make("o/e", 'e', 5));  // the files forgotten are room again
  CHECK(cache.size() == 1);
}

TEST_CASE("a metadata read (a safetensors index) is retried on 503 and then succeeds") {
  int calls = 0;
  Fixture f([&](Exchange& ex) -> asio::awaitable<void> {
    if (++calls < 2) {
      HeaderList h{{"Retry-After", "1"}};
      co_await ex.respond(503, "busy", std::move(h));
    } else {
      co_await ex.respond(200, R"({"weight_map": {}})");
    }
  });
  auto body = test::run(f.ioc, f.hub->read_metadata("org/name", kCommit, "model.safetensors.index.json", 1 << 20));
  REQUIRE(body);
  CHECK(*body == R"({"weight_map": {}})");
  CHECK(f.server->requests().size() == 2);
}

TEST_CASE("the retry policy backs off 1, 2, 4, 8, 8 times the base with jitter, and honours Retry-After up to its cap") {
  hub::RetryPolicy p;
  p.backoff_base = std::chrono::milliseconds(1000);
  std::mt19937 rng(7);
  for (unsigned failures = 1; failures <= 6; ++failures) {
    const double base = 1000.0 * (1u << std::min(failures - 1, 3u));
    const auto b = std::chrono::duration<double, std::milli>(p.backoff(failures, rng)).count();
    CHECK(b >= 0.75 * base);
    CHECK(b <= 1.25 * base);
  }
  p.max_tries = 3;
  p.max_retry_after = std::chrono::seconds(30);
  hub::Retrier r(p);
  auto first = r.failed(std::chrono::seconds(3600));
  REQUIRE(first);
  CHECK(*first == std::chrono::seconds(30));  // Retry-After capped
  auto second = r.failed(std::nullopt);
  REQUIRE(second);
  CHECK(*second >= std::chrono::milliseconds(1500));
  CHECK(*second <= std::chrono::milliseconds(2500));
  CHECK_FALSE(r.failed(std::nullopt));  // the third try was the last
  CHECK(r.failures() == 3);
}

TEST_CASE("a run's retry budget counts failures in a row, shares one pause, and gives up past its budget") {
  hub::RetryPolicy p;
  p.backoff_base = std::chrono::milliseconds(100);
  hub::RetryBudget budget(p, 2, std::chrono::minutes(1));
  const Error e = make_error(Errc::hub_unavailable, "downloading x: HTTP 503");
  const auto sent = hub::RetryBudget::Clock::now();
  auto first = budget.failed(e, sent, std::nullopt);
  REQUIRE(first);
  CHECK(*first > std::chrono::milliseconds(0));
  // A request sent before that pause began failed for the same reason: it costs nothing more.
  auto same = budget.failed(e, sent - std::chrono::seconds(1), std::nullopt);
  REQUIRE(same);
  auto second = budget.failed(e, hub::RetryBudget::Clock::now() + std::chrono::seconds(1), std::nullopt);
  REQUIRE(second);
  budget.progressed();
  REQUIRE(budget.failed(e, hub::RetryBudget::Clock::now() + std::chrono::seconds(2), std::nullopt));
  REQUIRE(budget.failed(e, hub::RetryBudget::Clock::now() + std::chrono::seconds(3), std::nullopt));
  auto out = budget.failed(e, hub::RetryBudget::Clock::now() + std::chrono::seconds(4), std::nullopt);
  REQUIRE_FALSE(out);
  CHECK(out.error().message.find("gave up after 3 failures in a row") != std::string::npos);
  // A Retry-After longer than the wait left fails at once.
  hub::RetryBudget tight(p, 5, std::chrono::seconds(10));
  auto long_ask = tight.failed(e, hub::RetryBudget::Clock::now(), std::chrono::seconds(60));
  REQUIRE_FALSE(long_ask);
  CHECK(long_ask.error().message.find("retry after 60 s") != std::string::npos);
}
