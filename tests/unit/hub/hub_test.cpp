#include "hub/hub.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

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
    fast.backoff = {std::chrono::milliseconds(1)};
    fast.max_retry_after = std::chrono::milliseconds(5);
    hub->set_retry_policy(fast);
  }

  Result<hub::Snapshot> snapshot(const std::string& repo = "org/name", const std::string& rev = "main") {
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

  REQUIRE(f.server->requests().size() == 1);
  const auto& req = f.server->requests()[0];
  CHECK(req.target() == "/api/models/org/name/revision/refs%2Fpr%2F1?blobs=true");
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
  CHECK(snap.error().message.find("<!DOCTYPE html> <html><body>Sign in") != std::string::npos);
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
  CHECK(f.server->requests().size() == 3);
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
  CHECK(e.message == "downloading f.bin: HTTP 404 EntryNotFound: no file");
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
