#include "warm/warm.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace modeld;

namespace {

constexpr std::uint64_t MiB = 1u << 20;

// A folder of the test on a file system with a page cache (mincore means nothing on tmpfs).
struct Folder {
  fs::path dir;
  bool usable = false;
  Folder() {
    const char* base = std::getenv("MODELD_WARM_TEST_DIR");
    dir = fs::path(base ? base : fs::temp_directory_path().string()) / ("modeld-warm-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct statfs sf {};
    usable = ::statfs(dir.c_str(), &sf) == 0 && sf.f_type != 0x01021994 /* TMPFS_MAGIC */;
    if (!usable)
      WARN("skipped: " << dir << " is on tmpfs, where mincore shows every page resident; set MODELD_WARM_TEST_DIR "
                              "to a folder on a disk-backed file system");
  }
  ~Folder() { fs::remove_all(dir); }

  // A file of `bytes` random bytes, written, synced (clean pages) and dropped from the cache.
  fs::path cold_file(const std::string& name, std::uint64_t bytes) {
    const auto p = dir / name;
    std::vector<char> data(bytes);
    std::mt19937_64 rng(bytes);
    for (auto& c : data) c = static_cast<char>(rng());
    std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
    const int fd = ::open(p.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::close(fd);
    REQUIRE(warm::drop_cached(p).has_value());
    return p;
  }
};

std::uint64_t resident(const fs::path& p) {
  auto r = warm::resident_bytes(p);
  REQUIRE(r.has_value());
  return *r;
}

}  // namespace

TEST_CASE("a file dropped from the page cache is not resident, and warming makes it resident") {
  Folder f;
  if (!f.usable) return;
  const auto p = f.cold_file("a.safetensors", 16 * MiB);
  CHECK(resident(p) <= MiB);
  warm::Stop stop;
  warm::Options o;
  o.budget = 64 * MiB;
  o.block = 1 * MiB;
  std::vector<warm::Progress> seen;
  auto report = warm::warm_files({p}, o, [&](const warm::Progress& pr) { seen.push_back(pr); }, stop);
  CHECK(report.totals.bytes_total == 16 * MiB);
  CHECK(report.totals.bytes_resident_before <= MiB);
  // The kernel's readahead may bring pages in before a reader gets to them: those are not read again.
  CHECK(report.totals.bytes_warmed > 0);
  CHECK(report.totals.bytes_warmed <= 16 * MiB);
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK(report.skipped.empty());
  CHECK_FALSE(report.stopped);
  CHECK(resident(p) == 16 * MiB);
  REQUIRE_FALSE(seen.empty());
  CHECK(seen.back().bytes_warmed == report.totals.bytes_warmed);
}

TEST_CASE("warming a resident file reads nothing") {
  Folder f;
  if (!f.usable) return;
  const auto p = f.cold_file("b", 4 * MiB);
  warm::Stop stop;
  warm::Options o;
  o.budget = 64 * MiB;
  warm::warm_files({p}, o, {}, stop);
  auto again = warm::warm_files({p}, o, {}, stop);
  CHECK(again.totals.bytes_resident_before == 4 * MiB);
  CHECK(again.totals.bytes_warmed == 0);
}

TEST_CASE("the budget warms the first files that fit and skips the rest in order") {
  Folder f;
  if (!f.usable) return;
  const auto a = f.cold_file("1", 4 * MiB), b = f.cold_file("2", 4 * MiB), c = f.cold_file("3", 4 * MiB),
             d = f.cold_file("4", 1 * MiB);
  warm::Stop stop;
  warm::Options o;
  o.budget = 9 * MiB;
  auto report = warm::warm_files({a, b, c, d}, o, {}, stop);
  CHECK(report.warmed == std::vector<fs::path>{a, b});
  CHECK(report.budget_reached);
  REQUIRE(report.skipped.size() == 2);
  CHECK(report.skipped[0].path == c);
  CHECK(report.skipped[0].reason == "RAM budget");
  CHECK(report.skipped[1].path == d);  // it would fit, but the loader reads it after c
  CHECK(report.totals.bytes_total == 13 * MiB);
  CHECK(report.totals.bytes_warmed <= 9 * MiB);
  CHECK(resident(a) == 4 * MiB);
  CHECK(resident(c) <= MiB);
}

TEST_CASE("a stop request ends warming promptly, before the files are read") {
  Folder f;
  if (!f.usable) return;
  const auto p = f.cold_file("slow", 16 * MiB);
  warm::Stop stop;
  warm::Options o;
  o.budget = 64 * MiB;
  o.max_bytes_per_s = 2 * MiB;  // 8 s for the whole file
  o.progress_every = std::chrono::milliseconds(0);
  const auto t0 = std::chrono::steady_clock::now();
  auto report = warm::warm_files({p}, o, [&](const warm::Progress& pr) {
    if (pr.bytes_warmed > 0) stop.request();
  }, stop);
  CHECK(report.stopped);
  CHECK(report.warmed.empty());
  CHECK(report.totals.bytes_warmed < 16 * MiB);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
}

TEST_CASE("a file that cannot be opened is skipped with its error and the others are warmed") {
  Folder f;
  if (!f.usable) return;
  const auto p = f.cold_file("ok", 1 * MiB);
  warm::Stop stop;
  warm::Options o;
  o.budget = 64 * MiB;
  auto report = warm::warm_files({f.dir / "absent", p}, o, {}, stop);
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].reason.find("absent") != std::string::npos);
  CHECK(report.warmed == std::vector<fs::path>{p});
}

TEST_CASE("meminfo gives MemAvailable and MemTotal in bytes") {
  auto m = warm::parse_meminfo("MemTotal:       131072 kB\nMemFree:  1 kB\nMemAvailable:    65536 kB\n");
  REQUIRE(m.has_value());
  CHECK(m->total == 131072ull * 1024);
  CHECK(m->available == 65536ull * 1024);
  CHECK_FALSE(warm::parse_meminfo("MemTotal: 1 kB\n").has_value());
  auto real = warm::read_memory();
  REQUIRE(real.has_value());
  CHECK(real->total >= real->available);
}
