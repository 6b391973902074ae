#include "fetch/fetch.hpp"

#include "fetch/partial.hpp"
#include "verify/hash.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace modeld;
using modeld::test::Exchange;
using modeld::test::HeaderList;
using modeld::test::TestServer;
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
namespace fs = std::filesystem;
using asio::awaitable;

namespace {

const std::string kRepo = "org/model";
const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<unsigned> counter{0};
    path = fs::temp_directory_path() /
           fmt::format("modeld-fetch-test-{}-{}-{}", ::getpid(), counter++, std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

std::string digest(verify::HashKind kind, const std::string& content) {
  verify::Hasher h(kind, content.size());
  h.update(std::span<const char>(content.data(), content.size()));
  return h.hex();
}

hub::RepoFile git_file(const std::string& path, const std::string& content) {
  return hub::RepoFile{path, content.size(), digest(verify::HashKind::git_sha1, content), std::nullopt};
}

hub::RepoFile lfs_file(const std::string& path, const std::string& content) {
  return hub::RepoFile{path, content.size(), std::string(40, 'e'), digest(verify::HashKind::sha256, content)};
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& content) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

std::string header(const bhttp::request<bhttp::string_body>& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string("<none>") : std::string(it->value());
}

// Answers with `content`, honouring "Range: bytes=N-" with 206 and Content-Range, as the CDN does.
awaitable<void> serve_content(Exchange& ex, const std::string& content) {
  std::string range = header(ex.request, "Range");
  if (range.starts_with("bytes=") && range.ends_with("-")) {
    std::uint64_t start = std::stoull(range.substr(6));
    if (start >= content.size()) {
      HeaderList h{{"Content-Range", fmt::format("bytes */{}", content.size())}};
      co_await ex.respond(416, "", std::move(h));
      co_return;
    }
    HeaderList h{{"Content-Range", fmt::format("bytes {}-{}/{}", start, content.size() - 1, content.size())}};
    co_await ex.respond(206, content.substr(start), std::move(h));
    co_return;
  }
  co_await ex.respond(200, content);
}

// A Hub (and a CDN) serving files of one commit, a disk pool and a Fetcher's options.
// `on_file` decides how the Hub answers a file; by default it serves it whole or by range.
struct Env {
  asio::io_context ioc;
  asio::thread_pool pool{2};
  TempDir dir;
  std::map<std::string, std::string> content;  // repository path -> bytes
  std::function<awaitable<void>(Exchange&, const std::string&)> on_file;
  std::function<awaitable<void>(Exchange&)> on_cdn;
  TestServer hub_server{ioc, [this](Exchange& ex) { return answer(ex); }};
  TestServer cdn{ioc, [this](Exchange& ex) { return on_cdn(ex); }};
  http::Client client{ioc.get_executor(), client_options()};
  hub::Hub hub{client, hub_server.url("")};
  fetch::Options options;
  std::vector<fetch::Progress> reports;

  Env() {
    options.repo = kRepo;
    options.commit = kCommit;
    options.dest_dir = dir.path / "rev";
    options.backoff_base = std::chrono::milliseconds(1);
    options.progress_interval = std::chrono::milliseconds(0);
    on_file = [this](Exchange& ex, const std::string& path) { return serve_content(ex, content.at(path)); };
  }

  static http::ClientOptions client_options() {
    http::ClientOptions o;
    o.connect_timeout = std::chrono::seconds(2);
    o.read_timeout = std::chrono::seconds(2);
    return o;
  }

  awaitable<void> answer(Exchange& ex) {
    std::string prefix = fmt::format("/{}/resolve/{}/", kRepo, kCommit);
    std::string target(ex.request.target());
    if (!target.starts_with(prefix)) {
      co_await ex.respond(400, "bad target " + target);
      co_return;
    }
    std::string path = target.substr(prefix.size());
    if (!content.count(path)) {
      HeaderList h{{"X-Error-Code", "EntryNotFound"}};
      co_await ex.respond(404, "Entry not found", std::move(h));
      co_return;
    }
    co_await on_file(ex, path);
  }

  fs::path final_path(const std::string& path) const { return options.dest_dir / path; }
  fs::path part_path(const std::string& path) const {
    return fetch::partial_dir(options.dest_dir) / fetch::partial_name(path);
  }
  bool no_partials() const {
    auto d = fetch::partial_dir(options.dest_dir);
    return !fs::exists(d) || fs::is_empty(d);
  }

  awaitable<Result<std::vector<fetch::Fetched>>> fetch_coro(std::vector<hub::RepoFile> files) {
    fetch::Fetcher fetcher(hub, client, pool, options);
    co_return co_await fetcher.run(std::move(files), [this](const fetch::Progress& p) { reports.push_back(p); });
  }

  Result<std::vector<fetch::Fetched>> fetch(std::vector<hub::RepoFile> files) {
    return test::run(ioc, fetch_coro(std::move(files)));
  }
};

std::string error_of(const Result<std::vector<fetch::Fetched>>& r) {
  return r ? std::string("ok") : fmt::format("{}: {}", to_string(r.error().code), r.error().message);
}

}  // namespace

TEST_CASE("several files are downloaded in parallel with correct content and no partials left") {
  Env env;
  env.options.parallel_files = 3;
  std::vector<hub::RepoFile> files;
  const std::vector<std::string> paths = {"config.json", "a/b/weights.bin", "tokenizer.json", "empty.txt", "c d.txt"};
  for (std::size_t i = 0; i < paths.size(); ++i) {
    auto bytes = paths[i] == "empty.txt" ? std::string() : random_bytes(20000 + i * 70001, static_cast<unsigned>(i));
    env.content[paths[i]] = bytes;
    files.push_back(git_file(paths[i], bytes));
  }
  files[1] = lfs_file(paths[1], env.content[paths[1]]);
  // The Hub URL-encodes the space; the test server sees the encoded target.
  env.content["c%20d.txt"] = env.content["c d.txt"];

  auto r = env.fetch(files);
  REQUIRE(error_of(r) == "ok");
  REQUIRE(r->size() == files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    CHECK((*r)[i].path == files[i].path);
    CHECK((*r)[i].size == files[i].size);
    CHECK((*r)[i].digest == (files[i].is_lfs() ? *files[i].lfs_sha256 : files[i].blob_id));
    CHECK(read_all(env.final_path(files[i].path)) == env.content[files[i].path]);
  }
  CHECK(env.no_partials());
  // The empty file needs no request at all.
  CHECK(env.hub_server.requests().size() == files.size() - 1);
}

TEST_CASE("an LFS file is fetched through a 302 to the CDN origin") {
  Env env;
  auto bytes = random_bytes(300000, 7);
  env.content["model.safetensors"] = bytes;
  auto cdn_url = env.cdn.url("/blobs/abc?signed=1");
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    HeaderList h{{"Location", cdn_url}, {"X-Linked-Size", std::to_string(bytes.size())}};
    co_await ex.respond(302, "", std::move(h));
  };
  env.on_cdn = [&](Exchange& ex) { return serve_content(ex, bytes); };

  auto r = env.fetch({lfs_file("model.safetensors", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("model.safetensors")) == bytes);
  REQUIRE(env.cdn.requests().size() == 1);
  CHECK(env.cdn.requests()[0].target() == "/blobs/abc?signed=1");
  CHECK(env.no_partials());
}

TEST_CASE("a body cut short mid-way is resumed with Range and ends correct") {
  Env env;
  auto bytes = random_bytes(500000, 3);
  env.content["w.bin"] = bytes;
  const std::size_t cut = 123457;
  int calls = 0;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    if (calls++ == 0) {
      co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", bytes.size()) +
                        bytes.substr(0, cut));
      co_return;  // the server closes the connection mid-body
    }
    co_await serve_content(ex, bytes);
  };

  auto r = env.fetch({lfs_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  REQUIRE(env.hub_server.requests().size() == 2);
  CHECK(header(env.hub_server.requests()[0], "Range") == "<none>");
  CHECK(header(env.hub_server.requests()[1], "Range") == fmt::format("bytes={}-", cut));
  CHECK(env.no_partials());
}

TEST_CASE("a partial left from an earlier run is continued with only the missing bytes requested") {
  Env env;
  auto bytes = random_bytes(200000, 4);
  env.content["w.bin"] = bytes;
  auto file = git_file("w.bin", bytes);
  const std::size_t have = 77777;
  write_all(env.part_path("w.bin"), bytes.substr(0, have));
  fetch::Sidecar sc{kCommit, "w.bin", bytes.size(), verify::HashKind::git_sha1, file.blob_id};
  write_all(fs::path(env.part_path("w.bin")) += ".json", sc.to_json());

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  REQUIRE(env.hub_server.requests().size() == 1);
  CHECK(header(env.hub_server.requests()[0], "Range") == fmt::format("bytes={}-", have));
  REQUIRE(!env.reports.empty());
  // The resumed bytes count as done from the first report on.
  CHECK(env.reports.front().bytes_done >= have);
  CHECK(env.no_partials());
}

TEST_CASE("a partial whose sidecar names a different digest is discarded") {
  Env env;
  auto bytes = random_bytes(150000, 5);
  env.content["w.bin"] = bytes;
  write_all(env.part_path("w.bin"), random_bytes(5000, 99));
  fetch::Sidecar sc{kCommit, "w.bin", bytes.size(), verify::HashKind::sha256, std::string(64, 'a')};
  write_all(fs::path(env.part_path("w.bin")) += ".json", sc.to_json());

  auto r = env.fetch({lfs_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  REQUIRE(env.hub_server.requests().size() == 1);
  CHECK(header(env.hub_server.requests()[0], "Range") == "<none>");
}

TEST_CASE("a server that ignores Range and answers 200 restarts the file from byte 0") {
  Env env;
  auto bytes = random_bytes(100000, 6);
  env.content["w.bin"] = bytes;
  auto file = lfs_file("w.bin", bytes);
  write_all(env.part_path("w.bin"), bytes.substr(0, 40000));
  fetch::Sidecar sc{kCommit, "w.bin", bytes.size(), verify::HashKind::sha256, *file.lfs_sha256};
  write_all(fs::path(env.part_path("w.bin")) += ".json", sc.to_json());
  env.on_file = [&](Exchange& ex, const std::string&) { return ex.respond(200, bytes); };

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  REQUIRE(env.hub_server.requests().size() == 1);
  CHECK(header(env.hub_server.requests()[0], "Range") == "bytes=40000-");
  CHECK(env.reports.back().bytes_done == bytes.size());
}

TEST_CASE("a 200 HTML page instead of the file is refused and the final name never appears") {
  Env env;
  auto bytes = random_bytes(90000, 8);
  env.content["w.bin"] = bytes;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    HeaderList h{{"Content-Type", "text/html; charset=utf-8"}};
    co_await ex.respond(200, "<!DOCTYPE html><html><body>Sign in</body></html>", std::move(h));
  };

  auto r = env.fetch({lfs_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::size_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("w.bin") && Catch::Contains("text/html"));
  CHECK(!fs::exists(env.final_path("w.bin")));
  CHECK(env.hub_server.requests().size() == 1);  // not retried
}

TEST_CASE("an HTML page of the listed size is a checksum mismatch that says it is an HTML page") {
  Env env;
  auto bytes = random_bytes(4096, 9);
  env.content["w.bin"] = bytes;
  std::string page = "<!DOCTYPE html><html>" + std::string(4096 - 21 - 7, ' ') + "</html>";
  REQUIRE(page.size() == bytes.size());
  env.on_file = [&](Exchange& ex, const std::string&) { return ex.respond(200, page); };

  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::checksum_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("an HTML page"));
}

TEST_CASE("a wrong digest is checksum_mismatch naming both digests and nothing is promoted") {
  Env env;
  auto bytes = random_bytes(64000, 10);
  env.content["w.bin"] = bytes;
  auto file = lfs_file("w.bin", bytes);
  auto actual = *file.lfs_sha256;
  file.lfs_sha256 = std::string(64, '0');

  auto r = env.fetch({file});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::checksum_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("w.bin") && Catch::Contains(actual) &&
                                    Catch::Contains(std::string(64, '0')));
  CHECK(!fs::exists(env.final_path("w.bin")));
  CHECK(env.no_partials());  // bytes that can never be right are not kept
  CHECK(env.hub_server.requests().size() == 1);
}

TEST_CASE("a 503 is retried and the download then succeeds") {
  Env env;
  auto bytes = random_bytes(30000, 11);
  env.content["w.bin"] = bytes;
  int calls = 0;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    if (calls++ == 0) {
      co_await ex.respond(503, "busy");
      co_return;
    }
    co_await serve_content(ex, bytes);
  };

  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  CHECK(env.hub_server.requests().size() == 2);
}

TEST_CASE("a 503 on every attempt fails with hub_unavailable after max_attempts") {
  Env env;
  env.options.max_attempts = 3;
  auto bytes = random_bytes(1000, 12);
  env.content["w.bin"] = bytes;
  env.on_file = [&](Exchange& ex, const std::string&) { return ex.respond(503, "busy"); };

  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::hub_unavailable);
  CHECK_THAT(r.error().message, Catch::Contains("w.bin") && Catch::Contains("3 attempts"));
  CHECK(env.hub_server.requests().size() == 3);
}

TEST_CASE("a 404 is not retried") {
  Env env;
  auto bytes = random_bytes(1000, 13);
  auto r = env.fetch({git_file("missing.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::hub_not_found);
  CHECK_THAT(r.error().message, Catch::Contains("missing.bin"));
  CHECK(env.hub_server.requests().size() == 1);
}

TEST_CASE("the first failure stops the other files and is the one returned") {
  Env env;
  env.options.parallel_files = 2;
  auto big = random_bytes(400000, 14);
  env.content["big.bin"] = big;
  env.on_file = [&](Exchange& ex, const std::string& path) -> awaitable<void> {
    if (path == "big.bin") {
      co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.size()) + big.substr(0, 1000));
      co_await ex.stall();
      co_return;
    }
    co_await serve_content(ex, env.content.at(path));
  };
  auto start = std::chrono::steady_clock::now();
  auto r = env.fetch({lfs_file("big.bin", big), git_file("missing.bin", "x")});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::hub_not_found);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));  // not the read timeout
  CHECK(fs::exists(env.part_path("big.bin")));
}

TEST_CASE("cancellation leaves the partial and returns cancelled promptly") {
  Env env;
  auto bytes = random_bytes(600000, 15);
  env.content["w.bin"] = bytes;
  const std::size_t half = 300000;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", bytes.size()) +
                      bytes.substr(0, half));
    co_await ex.stall();
  };
  std::chrono::steady_clock::time_point cancelled_at;
  auto r = test::run_cancelling(env.ioc, env.fetch_coro({lfs_file("w.bin", bytes)}), [&] {
    if (env.reports.empty() || env.reports.back().bytes_done < half) return false;
    cancelled_at = std::chrono::steady_clock::now();
    return true;
  });
  auto took = std::chrono::steady_clock::now() - cancelled_at;
  REQUIRE(!r);
  CHECK(r.error().code == Errc::cancelled);
  CHECK(took < std::chrono::seconds(1));
  CHECK(!fs::exists(env.final_path("w.bin")));
  // The bytes received are kept, with their sidecar, for a later run.
  CHECK(read_all(env.part_path("w.bin")) == bytes.substr(0, half));
  CHECK(fs::exists(fs::path(env.part_path("w.bin")) += ".json"));
}

TEST_CASE("progress reaches bytes_total and files_total") {
  Env env;
  std::vector<hub::RepoFile> files;
  std::uint64_t total = 0;
  for (unsigned i = 0; i < 4; ++i) {
    auto path = fmt::format("f{}.bin", i);
    env.content[path] = random_bytes(50000 + i * 1000, 20 + i);
    files.push_back(git_file(path, env.content[path]));
    total += files.back().size;
  }
  auto r = env.fetch(files);
  REQUIRE(error_of(r) == "ok");
  REQUIRE(!env.reports.empty());
  const auto& last = env.reports.back();
  CHECK(last.bytes_total == total);
  CHECK(last.bytes_done == total);
  CHECK(last.files_total == 4);
  CHECK(last.files_done == 4);
  for (std::size_t i = 1; i < env.reports.size(); ++i) CHECK(env.reports[i].bytes_done >= env.reports[i - 1].bytes_done);
}

TEST_CASE("max_bytes_per_s limits the rate of all files together") {
  Env env;
  env.options.parallel_files = 2;
  env.options.max_bytes_per_s = 400000;
  std::vector<hub::RepoFile> files;
  for (unsigned i = 0; i < 2; ++i) {
    auto path = fmt::format("f{}.bin", i);
    env.content[path] = random_bytes(100000, 30 + i);
    files.push_back(git_file(path, env.content[path]));
  }
  auto start = std::chrono::steady_clock::now();
  auto r = env.fetch(files);
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(error_of(r) == "ok");
  // 200 kB at 400 kB/s with an empty bucket at the start: at least 0.5 s (minus the last block).
  CHECK(took >= std::chrono::milliseconds(400));
}

TEST_CASE("an unsafe path is refused before anything is requested") {
  Env env;
  auto r = env.fetch({git_file("../escape.bin", "x")});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::plan_invalid);
  CHECK(env.hub_server.requests().empty());
}

TEST_CASE("a partial that already holds the whole file is verified without a request") {
  Env env;
  auto bytes = random_bytes(70000, 40);
  env.content["w.bin"] = bytes;
  auto file = lfs_file("w.bin", bytes);
  write_all(env.part_path("w.bin"), bytes);
  fetch::Sidecar sc{kCommit, "w.bin", bytes.size(), verify::HashKind::sha256, *file.lfs_sha256};
  write_all(fs::path(env.part_path("w.bin")) += ".json", sc.to_json());

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  CHECK(env.hub_server.requests().empty());
  CHECK(env.no_partials());
}

TEST_CASE("a 416 to a resumed request discards the partial and starts over once") {
  Env env;
  auto bytes = random_bytes(50000, 41);
  env.content["w.bin"] = bytes;
  auto file = git_file("w.bin", bytes);
  write_all(env.part_path("w.bin"), bytes.substr(0, 20000));
  fetch::Sidecar sc{kCommit, "w.bin", bytes.size(), verify::HashKind::git_sha1, file.blob_id};
  write_all(fs::path(env.part_path("w.bin")) += ".json", sc.to_json());
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    if (header(ex.request, "Range") != "<none>") {
      HeaderList h{{"Content-Range", "bytes */10000"}};
      co_await ex.respond(416, "", std::move(h));
      co_return;
    }
    co_await ex.respond(200, bytes);
  };

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  REQUIRE(env.hub_server.requests().size() == 2);
  CHECK(header(env.hub_server.requests()[1], "Range") == "<none>");
}

TEST_CASE("a chunked body longer than the listed size is size_mismatch and its partial is dropped") {
  Env env;
  auto bytes = random_bytes(10000, 42);
  env.content["w.bin"] = bytes;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    std::string body = bytes + "extra bytes";
    co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                  "{:x}\r\n{}\r\n0\r\n\r\n",
                                  body.size(), body));
  };

  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::size_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("w.bin") && Catch::Contains("more than"));
  CHECK(!fs::exists(env.final_path("w.bin")));
  CHECK(env.no_partials());
}

TEST_CASE("a chunked answer that ends early is size_mismatch saying it is an HTML page") {
  Env env;
  auto bytes = random_bytes(10000, 43);
  env.content["w.bin"] = bytes;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    std::string body = "<html><body>Rate limited</body></html>";
    co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                  "{:x}\r\n{}\r\n0\r\n\r\n",
                                  body.size(), body));
  };

  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::size_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("an HTML page"));
  CHECK(!fs::exists(env.final_path("w.bin")));
  CHECK(env.no_partials());
}

TEST_CASE("Retry-After from a 429 is honoured before the next attempt") {
  Env env;
  auto bytes = random_bytes(2000, 44);
  env.content["w.bin"] = bytes;
  int calls = 0;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    if (calls++ == 0) {
      HeaderList h{{"Retry-After", "1"}};
      co_await ex.respond(429, "slow down", std::move(h));
      co_return;
    }
    co_await serve_content(ex, bytes);
  };
  auto start = std::chrono::steady_clock::now();
  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::seconds(1));
  CHECK(env.hub_server.requests().size() == 2);
}

TEST_CASE("partial file names keep distinct paths distinct") {
  CHECK(fetch::partial_name("a/b.bin") == "a%2Fb.bin.part");
  CHECK(fetch::partial_name("a%2Fb.bin") == "a%252Fb.bin.part");
  auto long_name = fetch::partial_name(std::string(300, 'x'));
  CHECK(long_name.size() == 64 + 5);
  CHECK(long_name != fetch::partial_name(std::string(301, 'x')));
}

TEST_CASE("a sidecar reads back what was written and anything else is rejected") {
  fetch::Sidecar sc{kCommit, "dir/w.bin", 12345, verify::HashKind::git_sha1, std::string(40, 'a')};
  auto back = fetch::Sidecar::parse(sc.to_json());
  REQUIRE(back);
  CHECK(*back == sc);
  CHECK(!fetch::Sidecar::parse("not json"));
  CHECK(!fetch::Sidecar::parse(R"({"commit":"x","path":"p","size":-1,"digest_kind":"sha256","digest":"d"})"));
  CHECK(!fetch::Sidecar::parse(R"({"commit":"x","path":"p","size":1,"digest_kind":"md5","digest":"d"})"));
}

TEST_CASE("an LFS body cut short at the CDN resumes with Range through the redirect") {
  Env env;
  auto bytes = random_bytes(250000, 45);
  env.content["model.safetensors"] = bytes;
  auto cdn_url = env.cdn.url("/blobs/abc");
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    HeaderList h{{"Location", cdn_url}};
    co_await ex.respond(302, "", std::move(h));
  };
  const std::size_t cut = 99999;
  int calls = 0;
  env.on_cdn = [&](Exchange& ex) -> awaitable<void> {
    if (calls++ == 0) {
      co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", bytes.size()) +
                        bytes.substr(0, cut));
      co_return;
    }
    co_await serve_content(ex, bytes);
  };

  auto r = env.fetch({lfs_file("model.safetensors", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("model.safetensors")) == bytes);
  REQUIRE(env.cdn.requests().size() == 2);
  CHECK(header(env.cdn.requests()[1], "Range") == fmt::format("bytes={}-", cut));
}
