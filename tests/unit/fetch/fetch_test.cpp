#include "fetch/fetch.hpp"

#include "fetch/disk_guard.hpp"
#include "fetch/partial.hpp"
#include "store/store.hpp"
#include "verify/hash.hpp"

#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <ctime>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <random>
#include <string>
#include <future>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace modeld;
using modeld::test::Exchange;
using modeld::test::HeaderList;
using modeld::test::TestServer;
using modeld::test::header;
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

repo::RepoFile git_file(const std::string& path, const std::string& content) {
  return repo::RepoFile{path, content.size(), digest(verify::HashKind::git_sha1, content), std::nullopt};
}

repo::RepoFile lfs_file(const std::string& path, const std::string& content) {
  return repo::RepoFile{path, content.size(), std::string(40, 'e'), digest(verify::HashKind::sha256, content)};
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


// Answers with `content`, honouring "Range: bytes=N-" and "bytes=N-M" with 206 and
// Content-Range, as the CDN does.
awaitable<void> serve_content(Exchange& ex, const std::string& content) {
  std::string range = header(ex.request, "Range");
  if (range.starts_with("bytes=")) {
    auto dash = range.find('-');
    std::uint64_t start = std::stoull(range.substr(6, dash - 6));
    std::uint64_t last = content.size() - 1;
    if (dash + 1 < range.size()) last = std::min<std::uint64_t>(last, std::stoull(range.substr(dash + 1)));
    if (start >= content.size()) {
      HeaderList h{{"Content-Range", fmt::format("bytes */{}", content.size())}};
      co_await ex.respond(416, "", std::move(h));
      co_return;
    }
    HeaderList h{{"Content-Range", fmt::format("bytes {}-{}/{}", start, last, content.size())}};
    co_await ex.respond(206, content.substr(start, last + 1 - start), std::move(h));
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

  awaitable<Result<std::vector<fetch::Fetched>>> fetch_coro(std::vector<repo::RepoFile> files) {
    fetch::Fetcher fetcher(hub, client, pool, options);
    co_return co_await fetcher.run(std::move(files), [this](const fetch::Progress& p) { reports.push_back(p); });
  }

  Result<std::vector<fetch::Fetched>> fetch(std::vector<repo::RepoFile> files) {
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
  std::vector<repo::RepoFile> files;
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
  bool big_sent = false;
  env.on_file = [&](Exchange& ex, const std::string& path) -> awaitable<void> {
    if (path == "big.bin") {
      co_await ex.write(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", big.size()) + big.substr(0, 1000));
      big_sent = true;
      co_await ex.stall();
      co_return;
    }
    // Fail only once big.bin has bytes to keep (the client reads them long before this timer);
    // opening a partial fsyncs, which a busy disk can make slow, hence the generous deadline.
    asio::steady_timer t(co_await asio::this_coro::executor);
    for (int i = 0; i < 2000 && !big_sent; ++i) {
      t.expires_after(std::chrono::milliseconds(5));
      co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    t.expires_after(std::chrono::milliseconds(20));
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    HeaderList h{{"X-Error-Code", "EntryNotFound"}};
    co_await ex.respond(404, "Entry not found", std::move(h));
  };
  env.content["missing.bin"] = "";  // so that on_file answers it (with a 404)
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
  std::vector<repo::RepoFile> files;
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
  std::vector<repo::RepoFile> files;
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

namespace {

// Fetches one file whose first request is answered `status` with "Retry-After: value"; returns
// how long the fetch took.
std::chrono::steady_clock::duration fetch_after_retry_after(Env& env, unsigned status, std::string value) {
  auto bytes = random_bytes(2000, 44);
  env.content["w.bin"] = bytes;
  int calls = 0;
  env.on_file = [&, status, value](Exchange& ex, const std::string&) -> awaitable<void> {
    if (calls++ == 0) {
      HeaderList h{{"Retry-After", value}};
      co_await ex.respond(status, "not now", std::move(h));
      co_return;
    }
    co_await serve_content(ex, bytes);
  };
  auto start = std::chrono::steady_clock::now();
  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  CHECK(env.hub_server.requests().size() == 2);
  return std::chrono::steady_clock::now() - start;
}

}  // namespace

TEST_CASE("Retry-After from a 429 is honoured before the next attempt") {
  Env env;
  CHECK(fetch_after_retry_after(env, 429, "1") >= std::chrono::seconds(1));
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

// --- multi-part download, resume by ranges, shared retries ------------------------------------

namespace {

std::vector<std::string> ranges_asked(const TestServer& server) {
  std::vector<std::string> out;
  for (const auto& r : server.requests()) out.push_back(header(r, "Range"));
  std::sort(out.begin(), out.end());
  return out;
}

// A sidecar with byte ranges, as PartialFile::record writes it.
std::string sidecar_with_ranges(const repo::RepoFile& f, const std::string& boot_id,
                                const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                                const std::vector<std::pair<std::uint64_t, std::uint64_t>>& synced) {
  auto kind = f.is_lfs() ? verify::HashKind::sha256 : verify::HashKind::git_sha1;
  auto j = nlohmann::json::parse(
      fetch::Sidecar{kCommit, f.path, f.size, kind, f.is_lfs() ? *f.lfs_sha256 : f.blob_id}.to_json());
  j["boot_id"] = boot_id;
  j["ranges"] = nlohmann::json::array();
  for (auto [b, e] : ranges) j["ranges"].push_back({b, e});
  j["synced"] = nlohmann::json::array();
  for (auto [b, e] : synced) j["synced"].push_back({b, e});
  return j.dump();
}

// A partial holding `content` only in `ranges` (zeros elsewhere).
void write_partial(Env& env, const repo::RepoFile& f, const std::string& content,
                   const std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges, const std::string& sidecar) {
  std::string data(ranges.empty() ? 0 : ranges.back().second, '\0');
  for (auto [b, e] : ranges) data.replace(b, e - b, content.substr(b, e - b));
  write_all(env.part_path(f.path), data);
  write_all(fs::path(env.part_path(f.path)) += ".json", sidecar);
}

}  // namespace

TEST_CASE("byte range sets merge neighbours and list their holes") {
  fetch::RangeSet set;
  set.add({10, 20});
  set.add({30, 40});
  set.add({20, 25});  // touches the first
  set.add({0, 0});    // empty: ignored
  REQUIRE(set.items().size() == 2);
  CHECK(set.items()[0] == fetch::ByteRange{10, 25});
  CHECK(set.contiguous_end(12) == 25);
  CHECK(set.contiguous_end(25) == 25);
  CHECK(set.total() == 25);
  auto holes = set.gaps(50);
  REQUIRE(holes.size() == 3);
  CHECK(holes[0] == fetch::ByteRange{0, 10});
  CHECK(holes[1] == fetch::ByteRange{25, 30});
  CHECK(holes[2] == fetch::ByteRange{40, 50});
  set.add({5, 35});  // bridges both
  REQUIRE(set.items().size() == 1);
  CHECK(set.items()[0] == fetch::ByteRange{5, 40});
  set.clip(38);
  CHECK(set.items()[0] == fetch::ByteRange{5, 38});
  CHECK(set.gaps(38).size() == 1);
}

TEST_CASE("a single large file is fetched in parts over several connections") {
  Env env;
  env.options.parallel_files = 4;
  env.options.min_part_size = 64 << 10;
  auto bytes = random_bytes(1 << 20, 50);
  env.content["big.safetensors"] = bytes;

  auto r = env.fetch({lfs_file("big.safetensors", bytes)});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("big.safetensors")) == bytes);
  CHECK(env.no_partials());
  auto asked = ranges_asked(env.hub_server);
  INFO(fmt::format("{}", fmt::join(asked, ", ")));
  // One request per connection at least; a connection that finishes its part early takes half
  // of the largest part left, so there may be more.
  CHECK(asked.size() >= 4);
  std::set<std::uint64_t> starts;
  for (const auto& a : asked) starts.insert(a == "<none>" ? 0 : std::stoull(a.substr(6)));
  CHECK(starts.size() == asked.size());  // no byte range asked twice from the same start
  CHECK(starts.count(0) == 1);
}

TEST_CASE("parts that arrive before the start of the file are hashed from disk in order") {
  Env env;
  env.options.parallel_files = 3;
  env.options.min_part_size = 32 << 10;
  auto bytes = random_bytes(600000, 51);
  env.content["w.bin"] = bytes;
  auto file = lfs_file("w.bin", bytes);
  int later_served = 0;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    std::string range = header(ex.request, "Range");
    bool first_part = range == "<none>" || range.starts_with("bytes=0-");
    if (first_part) {
      // Hold the first part until both later parts are complete.
      asio::steady_timer t(co_await asio::this_coro::executor);
      for (int i = 0; i < 500 && later_served < 2; ++i) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      }
    }
    co_await serve_content(ex, bytes);
    if (!first_part) ++later_served;
  };

  SECTION("the right bytes pass") {
    auto r = env.fetch({file});
    REQUIRE(error_of(r) == "ok");
    CHECK(later_served >= 2);
    CHECK(read_all(env.final_path("w.bin")) == bytes);
  }
  SECTION("a wrong digest is still caught") {
    file.lfs_sha256 = std::string(64, '1');
    auto r = env.fetch({file});
    REQUIRE(!r);
    CHECK(r.error().code == Errc::checksum_mismatch);
    CHECK(!fs::exists(env.final_path("w.bin")));
    CHECK(env.no_partials());
  }
}

TEST_CASE("a partial with holes from the same boot continues with only the holes requested") {
  Env env;
  env.options.parallel_files = 2;
  env.options.min_part_size = 1 << 30;  // no splitting: one request per hole
  auto bytes = random_bytes(400000, 52);
  env.content["w.bin"] = bytes;
  auto file = lfs_file("w.bin", bytes);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> have = {{0, 100000}, {200000, 300000}};
  write_partial(env, file, bytes, have, sidecar_with_ranges(file, fetch::current_boot_id(), have, {}));

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  auto asked = ranges_asked(env.hub_server);
  REQUIRE(asked.size() == 2);
  CHECK(asked[0] == "bytes=100000-199999");
  CHECK(asked[1] == "bytes=300000-");
  CHECK(env.reports.front().bytes_done >= 200000);
}

TEST_CASE("after a reboot only the ranges of the last durable record are trusted") {
  Env env;
  env.options.min_part_size = 1 << 30;
  auto bytes = random_bytes(300000, 53);
  env.content["w.bin"] = bytes;
  auto file = git_file("w.bin", bytes);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> have = {{0, 250000}};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> synced = {{0, 120000}};
  write_partial(env, file, bytes, have, sidecar_with_ranges(file, "another-boot", have, synced));

  auto r = env.fetch({file});
  REQUIRE(error_of(r) == "ok");
  CHECK(read_all(env.final_path("w.bin")) == bytes);
  auto asked = ranges_asked(env.hub_server);
  REQUIRE(asked.size() == 1);
  CHECK(asked[0] == "bytes=120000-");
}

TEST_CASE("the sidecar records the ranges written so a later run trusts them") {
  Env env;
  auto bytes = random_bytes(200000, 54);
  auto file = git_file("w.bin", bytes);
  fetch::PartialFile part(env.options.dest_dir,
                          fetch::Sidecar{kCommit, "w.bin", bytes.size(), verify::HashKind::git_sha1, file.blob_id});
  auto opened = part.open();
  REQUIRE(opened.has_value());
  CHECK(opened->empty());
  REQUIRE(part.write_at(150000, std::span<const char>(bytes.data() + 150000, 50000)).has_value());
  fetch::RangeSet written;
  written.add({150000, 200000});
  REQUIRE(part.record(written, false).has_value());
  part.close();

  fetch::PartialFile again(env.options.dest_dir,
                           fetch::Sidecar{kCommit, "w.bin", bytes.size(), verify::HashKind::git_sha1, file.blob_id});
  auto reopened = again.open();
  REQUIRE(reopened.has_value());
  CHECK(*reopened == written);
}

TEST_CASE("a Retry-After from one file pauses every connection of the run") {
  Env env;
  env.options.parallel_files = 2;
  auto a = random_bytes(5000, 55);
  auto b = random_bytes(5000, 56);
  env.content["a.bin"] = a;
  env.content["b.bin"] = b;
  using Clock = std::chrono::steady_clock;
  std::map<std::string, std::vector<Clock::time_point>> times;
  env.on_file = [&](Exchange& ex, const std::string& path) -> awaitable<void> {
    times[path].push_back(Clock::now());
    if (times[path].size() == 1 && path == "a.bin") {
      HeaderList h{{"Retry-After", "1"}};
      co_await ex.respond(429, "slow down", std::move(h));
      co_return;
    }
    if (times[path].size() == 1 && path == "b.bin") {
      // Fail b just after a's 429 began the pause.
      asio::steady_timer t(co_await asio::this_coro::executor);
      t.expires_after(std::chrono::milliseconds(100));
      co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      co_await ex.respond(503, "busy");
      co_return;
    }
    co_await serve_content(ex, env.content.at(path));
  };
  auto r = env.fetch({git_file("a.bin", a), git_file("b.bin", b)});
  REQUIRE(error_of(r) == "ok");
  REQUIRE(times["a.bin"].size() == 2);
  REQUIRE(times["b.bin"].size() == 2);
  // b's own backoff is 1 ms here; its retry still waited for a's Retry-After.
  CHECK(times["b.bin"][1] - times["a.bin"][0] >= std::chrono::milliseconds(950));
}

TEST_CASE("a Retry-After given as an HTTP-date is honoured") {
  Env env;
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char date[64];
  std::strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  // The date has whole seconds: "2 s from now" is at least 1 s away.
  CHECK(fetch_after_retry_after(env, 503, date) >= std::chrono::seconds(1));
}

TEST_CASE("a Retry-After longer than the retry wait left fails at once") {
  Env env;
  env.options.max_retry_wait = std::chrono::seconds(60);
  auto bytes = random_bytes(2000, 58);
  env.content["w.bin"] = bytes;
  env.on_file = [&](Exchange& ex, const std::string&) -> awaitable<void> {
    HeaderList h{{"Retry-After", "3600"}};
    co_await ex.respond(429, "quota", std::move(h));
  };
  auto start = std::chrono::steady_clock::now();
  auto r = env.fetch({git_file("w.bin", bytes)});
  REQUIRE(!r);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_THAT(r.error().message, Catch::Contains("w.bin") && Catch::Contains("3600"));
  CHECK(env.hub_server.requests().size() == 1);
}

TEST_CASE("a dead Hub spends one shared retry budget, not one per connection") {
  Env env;
  env.options.parallel_files = 3;
  env.options.retry_budget = 3;
  env.options.max_attempts = 10;
  std::vector<repo::RepoFile> files;
  for (int i = 0; i < 6; ++i) {
    auto path = fmt::format("f{}.bin", i);
    env.content[path] = random_bytes(1000, 60 + i);
    files.push_back(git_file(path, env.content[path]));
  }
  env.on_file = [&](Exchange& ex, const std::string&) { return ex.respond(503, "down"); };
  auto r = env.fetch(files);
  REQUIRE(!r);
  CHECK(r.error().code == Errc::hub_unavailable);
  CHECK_THAT(r.error().message, Catch::Contains("failures in a row"));
  // (retry_budget + 1) rounds of at most parallel_files requests; 6 files x 10 attempts without
  // the shared budget.
  CHECK(env.hub_server.requests().size() <= 3u * (3u + 1u));
}

TEST_CASE("a Git LFS pointer served instead of the file is size_mismatch saying so") {
  Env env;
  auto bytes = random_bytes(50000, 59);
  env.content["model.safetensors"] = bytes;
  auto file = lfs_file("model.safetensors", bytes);
  std::string pointer = fmt::format("version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n",
                                    *file.lfs_sha256, bytes.size());
  env.on_file = [&](Exchange& ex, const std::string&) { return ex.respond(200, pointer); };
  auto r = env.fetch({file});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::size_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("model.safetensors") && Catch::Contains("Git LFS pointer"));
  CHECK(!fs::exists(env.final_path("model.safetensors")));
}

TEST_CASE("progress lists the files in flight with their bytes and connections") {
  Env env;
  env.options.parallel_files = 2;
  env.options.min_part_size = 16 << 10;
  auto bytes = random_bytes(300000, 70);
  env.content["w.bin"] = bytes;
  auto r = env.fetch({lfs_file("w.bin", bytes)});
  REQUIRE(error_of(r) == "ok");
  bool saw = false;
  for (const auto& p : env.reports)
    for (const auto& f : p.files)
      if (f.path == "w.bin" && f.bytes_total == bytes.size() && f.bytes_done > 0) saw = true;
  CHECK(saw);
  CHECK(env.reports.back().bytes_done == bytes.size());
}

TEST_CASE("a download stops with disk_full before free space drops below disk_reserve") {
  Env env;
  auto bytes = random_bytes(48u << 20, 7);
  env.content["big.bin"] = bytes;
  fs::create_directories(env.options.dest_dir);
  auto free = store::free_bytes(env.options.dest_dir);
  REQUIRE(free);
  // Room for a third of the file. (Other writers on this file system move free space too, so
  // what was written before the stop is checked end to end on a tmpfs of its own instead:
  // tests/integration/test_hostile_hub_e2e.py.)
  env.options.disk_reserve = *free - (16u << 20);
  env.options.parallel_files = 1;

  auto r = env.fetch({git_file("big.bin", bytes)});
  REQUIRE(!r);
  CHECK(r.error().code == Errc::disk_full);
  CHECK_THAT(r.error().message, Catch::Contains("big.bin") && Catch::Contains("disk_reserve") &&
                                    Catch::Contains(std::to_string(env.options.disk_reserve)));
  CHECK(r.error().files == std::vector<std::string>{"big.bin"});
  CHECK(!fs::exists(env.final_path("big.bin")));
}

namespace {

// Waits (deadline 10 s) until `guard` has an acquire() waiting for the writes in flight.
void wait_until_waiting(fetch::DiskGuard& guard) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (guard.waiting() == 0) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Allocates `bytes` of `path` on its file system (what a landed write leaves statvfs showing).
void allocate(const std::filesystem::path& path, std::uint64_t bytes) {
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  ::close(fd);
  REQUIRE(rc == 0);
}

}  // namespace

TEST_CASE("the disk guard refuses a write that would cross the reserve, naming the file and the folder") {
  TempDir dir;
  auto free = store::free_bytes(dir.path);
  REQUIRE(free);
  REQUIRE(*free > (1ull << 30));
  // More than is free past the reserve, whatever else is in flight: refused at once.
  fetch::DiskGuard guard(dir.path, *free - (100u << 20));
  auto r = guard.acquire("a.bin", 300u << 20);
  REQUIRE(!r);
  CHECK(r.error().code == Errc::disk_full);
  CHECK_THAT(r.error().message, Catch::Contains("a.bin") && Catch::Contains(dir.path.string()) &&
                                    Catch::Contains("daemon.disk_reserve"));
  CHECK(r.error().files == std::vector<std::string>{"a.bin"});
  CHECK(guard.waiting() == 0);
  CHECK(fetch::DiskGuard(dir.path, 0).acquire("c.bin", 1u << 20).has_value());
}

TEST_CASE("near the reserve the disk guard waits for the writes in flight and counts what they left once") {
  TempDir dir;
  auto free = store::free_bytes(dir.path);
  REQUIRE(free);
  REQUIRE(*free > (1ull << 30));
  // 300 MiB past the reserve: two grants of 200 MiB fit only if the first was never written.
  fetch::DiskGuard guard(dir.path, *free - (300u << 20));
  REQUIRE(guard.acquire("a.bin", 200u << 20).has_value());
  auto second = std::async(std::launch::async, [&] { return guard.acquire("b.bin", 200u << 20); });
  wait_until_waiting(guard);

  SECTION("a write that never landed leaves room: the waiting grant goes ahead") {
    guard.release(200u << 20);
    CHECK(second.get().has_value());
  }
  SECTION("a write that landed is counted once, by statvfs: the waiting grant is refused") {
    allocate(dir.path / "a.bin", 200u << 20);
    guard.release(200u << 20);
    auto r = second.get();
    REQUIRE(!r);
    CHECK(r.error().code == Errc::disk_full);
    CHECK_THAT(r.error().message, Catch::Contains("b.bin"));
  }
  CHECK(guard.waiting() == 0);
}
