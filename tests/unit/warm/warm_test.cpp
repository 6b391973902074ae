#include "warm/warm.hpp"

#include "util/files.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace modeld;

namespace {

constexpr std::uint64_t MiB = 1u << 20;
constexpr long kTmpfsMagic = 0x01021994, kRamfsMagic = static_cast<long>(0x858458f6);

// A folder of the test on a file system with a page cache: MODELD_WARM_TEST_DIR (under ctest the
// ext4 loop image of the warm_loop fixture) or the temporary folder. On tmpfs mincore shows every
// page resident and warming reads nothing, so a case there fails rather than passing empty.
struct Folder {
  fs::path dir;
  Folder() {
    const char* base = std::getenv("MODELD_WARM_TEST_DIR");
    const fs::path root = base ? fs::path(base) : fs::temp_directory_path();
    struct statfs sf {};
    REQUIRE(::statfs(root.c_str(), &sf) == 0);
    if (sf.f_type == kTmpfsMagic || sf.f_type == kRamfsMagic)
      FAIL(root << " is a tmpfs, where mincore shows every page resident: set MODELD_WARM_TEST_DIR to a folder on "
                   "a disk-backed file system (ctest mounts an ext4 loop image for these cases)");
    dir = root / ("modeld-warm-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~Folder() { fs::remove_all(dir); }

  // A file of `bytes` random bytes, written, synced (clean pages) and dropped from the cache by
  // the test itself (posix_fadvise DONTNEED), so warming starts cold whatever wrote the file.
  fs::path cold_file(const std::string& name, std::uint64_t bytes);
};

// Bytes of `p` in the page cache, read by the test's own mincore (independent of warm::resident_bytes).
std::uint64_t resident(const fs::path& p) {
  const util::OwnedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.get() >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd.get(), &st) == 0);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size == 0) return 0;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  REQUIRE(map != MAP_FAILED);
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  const bool ok = ::mincore(map, size, vec.data()) == 0;
  ::munmap(map, size);
  REQUIRE(ok);
  std::uint64_t pages = 0;
  for (std::size_t i = 0; i + 1 < vec.size(); ++i) pages += vec[i] & 1;
  return pages * page + ((vec.back() & 1) ? size - (vec.size() - 1) * page : 0);
}

// What the kernel may reclaim of a file between warming's last read and the test's mincore when
// other tests fill the page cache at the same time (CI's ctest -j2 took 24 KiB of 16 MiB once):
// far less than a block, so a warming that skipped a block or a file still fails.
constexpr std::uint64_t kReclaimSlack = 256u << 10;

// Whether all of `p` is in the page cache after warming, but for what reclaim may have taken since.
bool warmed_all(const fs::path& p) {
  const auto size = fs::file_size(p), now = resident(p);
  if (now + kReclaimSlack < size) UNSCOPED_INFO(p << ": " << now << " of " << size << " bytes resident");
  return now + kReclaimSlack >= size;
}

// Drops the clean pages of [offset, offset + length) of `p` (0: to the end) from the page cache.
void drop(const fs::path& p, std::uint64_t offset = 0, std::uint64_t length = 0) {
  const util::OwnedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.get() >= 0);
  REQUIRE(::posix_fadvise(fd.get(), static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_DONTNEED) ==
          0);
}

// Reads all of `p`, so that it is resident.
void read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> buffer(MiB);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
  }
  REQUIRE(resident(p) == fs::file_size(p));
}

fs::path Folder::cold_file(const std::string& name, std::uint64_t bytes) {
  const auto p = dir / name;
  std::vector<char> data(bytes);
  std::mt19937_64 rng(bytes);
  for (auto& c : data) c = static_cast<char>(rng());
  std::ofstream(p, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  const util::OwnedFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(::fdatasync(fd.get()) == 0);
  drop(p);
  REQUIRE(resident(p) == 0);
  return p;
}

// A file of `mib` MiB of which every other MiB, from MiB `first_dropped` (0 or 1) on, is dropped
// from the page cache.
fs::path half_resident(Folder& f, const std::string& name, std::uint64_t mib, std::uint64_t first_dropped = 1) {
  const auto p = f.cold_file(name, mib * MiB);
  read_all(p);
  for (std::uint64_t i = first_dropped; i < mib; i += 2) drop(p, i * MiB, MiB);
  REQUIRE(resident(p) == (mib - (mib - first_dropped + 1) / 2) * MiB);
  return p;
}

// Bytes this process's read calls have returned so far (`rchar` of /proc/self/io), the page cache
// included: the kernel's count, summed over every thread of the process (warming's readers too,
// the exited ones included), independent of what warming reports of itself.
std::uint64_t read_chars() {
  std::ifstream in("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  FAIL("/proc/self/io has no rchar line");
  return 0;
}

// What the reads around a warming may add to rchar besides warming's own: the read of
// /proc/self/io that took the first count (some hundred bytes; the second's are counted after
// it returns). Far less than a page of the files warmed, so a warming that read resident pages
// again (a whole MiB at least, here) would exceed it.
constexpr std::uint64_t kReadSlack = 64u << 10;

warm::Options options(std::uint64_t budget) {
  warm::Options o;
  o.budget = budget;
  return o;
}

}  // namespace

TEST_CASE("a file dropped from the page cache is not resident, and warming makes it resident") {
  Folder f;
  const auto p = f.cold_file("a.safetensors", 16 * MiB);
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.block = 1 * MiB;
  std::vector<warm::Progress> seen;
  auto report = warm::warm_files({p}, o, [&](const warm::Progress& pr) { seen.push_back(pr); }, stop);
  CHECK(report.totals.bytes_total == 16 * MiB);
  CHECK(report.totals.bytes_resident_before == 0);
  // The kernel's readahead may bring pages in before a reader gets to them: those are not read again.
  CHECK(report.totals.bytes_warmed > 0);
  CHECK(report.totals.bytes_warmed <= 16 * MiB);
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK(report.skipped.empty());
  CHECK_FALSE(report.stopped);
  CHECK(warmed_all(p));
  REQUIRE_FALSE(seen.empty());
  CHECK(seen.back().bytes_warmed == report.totals.bytes_warmed);
}

TEST_CASE("warming a resident file reads nothing") {
  Folder f;
  const auto p = f.cold_file("b", 4 * MiB);
  warm::Stop stop;
  read_all(p);
  const auto before = read_chars();
  auto again = warm::warm_files({p}, options(64 * MiB), {}, stop);
  const auto read = read_chars() - before;
  CHECK(again.totals.bytes_resident_before == 4 * MiB);
  CHECK(again.totals.bytes_warmed == 0);
  CHECK(read <= kReadSlack);  // the kernel's count: no read call of warming returned a byte
  CHECK(again.warmed == std::vector<fs::path>{p});
}

TEST_CASE("warming reads only the pages that are not resident") {
  // What a warming resumed after a restart meets: part of the file is in the page cache already.
  Folder f;
  const auto p = half_resident(f, "half", 8);
  warm::Stop stop;
  const auto before = read_chars();
  auto report = warm::warm_files({p}, options(64 * MiB), {}, stop);
  const auto read = read_chars() - before;
  CHECK(report.totals.bytes_resident_before == 4 * MiB);
  CHECK(report.totals.bytes_warmed > 0);
  CHECK(report.totals.bytes_warmed <= 4 * MiB);
  // The kernel's count of what the process's read calls returned (warming's reader threads are
  // its own): the 4 MiB that were not resident at most, and not nothing; never less than warming
  // says it read.
  CHECK(read <= 4 * MiB + kReadSlack);
  CHECK(read > kReadSlack);  // more than the reads of /proc/self/io themselves
  CHECK(read >= report.totals.bytes_warmed);
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK(warmed_all(p));
}

TEST_CASE("the budget warms the first files that fit and skips the rest in order") {
  Folder f;
  const auto a = f.cold_file("1", 4 * MiB), b = f.cold_file("2", 4 * MiB), c = f.cold_file("3", 4 * MiB),
             d = f.cold_file("4", 1 * MiB);
  warm::Stop stop;
  auto report = warm::warm_files({a, b, c, d}, options(9 * MiB), {}, stop);
  CHECK(report.warmed == std::vector<fs::path>{a, b});
  CHECK(report.budget_reached);
  REQUIRE(report.skipped.size() == 2);
  CHECK(report.skipped[0].path == c);
  CHECK(report.skipped[0].reason == "RAM budget");
  CHECK(report.skipped[0].bytes == 4 * MiB);
  CHECK(report.skipped[1].path == d);  // it would fit, but the loader reads it after c
  CHECK(report.totals.bytes_total == 13 * MiB);
  CHECK(report.totals.bytes_warmed <= 9 * MiB);
  CHECK(warmed_all(a));
  CHECK(resident(c) == 0);
  CHECK(resident(d) == 0);
}

TEST_CASE("only the bytes that are not resident count against the budget") {
  Folder f;
  const auto a = f.cold_file("resident", 4 * MiB), b = f.cold_file("cold", 4 * MiB);
  const auto c = half_resident(f, "half", 4);
  read_all(a);
  warm::Stop stop;
  auto report = warm::warm_files({a, b, c}, options(6 * MiB), {}, stop);
  CHECK(report.warmed == std::vector<fs::path>{a, b, c});
  CHECK(report.skipped.empty());
  CHECK_FALSE(report.budget_reached);
  CHECK(report.totals.bytes_resident_before == 6 * MiB);
  CHECK(report.totals.bytes_warmed <= 6 * MiB);
  CHECK(warmed_all(b));
  CHECK(warmed_all(c));
}

TEST_CASE("progress starts with what is resident before any read, grows and ends with the report's totals") {
  Folder f;
  const auto p = half_resident(f, "progress", 8, 0);  // the first block read is not resident
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.block = 1 * MiB;
  o.readers = 2;
  o.progress_every = std::chrono::milliseconds(0);
  std::vector<warm::Progress> seen;
  auto report = warm::warm_files({p}, o, [&](const warm::Progress& pr) { seen.push_back(pr); }, stop);
  REQUIRE(seen.size() >= 2);
  CHECK(seen.front().bytes_total == 8 * MiB);
  CHECK(seen.front().bytes_resident_before == 4 * MiB);
  CHECK(seen.front().bytes_warmed == 0);
  for (std::size_t i = 1; i < seen.size(); ++i) {
    CAPTURE(i);
    CHECK(seen[i].bytes_total == 8 * MiB);
    CHECK(seen[i].bytes_resident_before == 4 * MiB);
    CHECK(seen[i].bytes_warmed >= seen[i - 1].bytes_warmed);
  }
  CHECK(seen.back().bytes_warmed == report.totals.bytes_warmed);
  CHECK(report.totals.bytes_warmed > 0);
}

TEST_CASE("a stop request ends warming promptly, before the files are read") {
  Folder f;
  const auto p = f.cold_file("slow", 16 * MiB);
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
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

TEST_CASE("a stop requested before warming begins reads nothing") {
  Folder f;
  const auto p = f.cold_file("stopped", 4 * MiB);
  warm::Stop stop;
  stop.request();
  auto report = warm::warm_files({p}, options(64 * MiB), {}, stop);
  CHECK(report.stopped);
  CHECK(report.warmed.empty());
  CHECK(report.totals.bytes_total == 4 * MiB);
  CHECK(report.totals.bytes_warmed == 0);
  CHECK(resident(p) == 0);
}

TEST_CASE("a read rate limit spreads the reads over the time it allows") {
  Folder f;
  const auto p = f.cold_file("paced", 4 * MiB);
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.max_bytes_per_s = 8 * MiB;  // 4 MiB in 0.5 s at the earliest
  const auto t0 = std::chrono::steady_clock::now();
  auto report = warm::warm_files({p}, o, {}, stop);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(450));
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK(warmed_all(p));
}

TEST_CASE("a file that cannot be opened is skipped with its error and the others are warmed") {
  Folder f;
  const auto p = f.cold_file("ok", 1 * MiB);
  warm::Stop stop;
  auto report = warm::warm_files({f.dir / "absent", p}, options(64 * MiB), {}, stop);
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].reason.find("absent") != std::string::npos);
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK(warmed_all(p));
}

// A read function for warm::Options::read: pread(2), except that reads of `bad` starting at or
// past byte `from` answer -1 with `err`; records each read's (file descriptor, offset).
struct FaultyReads {
  fs::path bad;
  std::uint64_t from = 0;
  int err = EIO;
  std::mutex mutex;
  std::vector<std::pair<int, std::uint64_t>> seen;
  int bad_fd = -1;

  warm::ReadFn fn() {
    return [this](int fd, void* buffer, std::size_t n, std::uint64_t offset) -> ssize_t {
      {
        std::lock_guard lock(mutex);
        seen.emplace_back(fd, offset);
        if (fd_is(fd, bad) && offset >= from) {
          bad_fd = fd;
          errno = err;
          return -1;
        }
      }
      return ::pread(fd, buffer, n, static_cast<off_t>(offset));
    };
  }

  // Whether `fd` is open on `p` (same device and inode).
  static bool fd_is(int fd, const fs::path& p) {
    struct stat a {}, b {};
    return ::fstat(fd, &a) == 0 && ::stat(p.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  }
};

TEST_CASE("a read error ends warming with the file, the offset and the errno, and no file counts as warmed") {
  Folder f;
  // b is long enough that the kernel's readahead past the bad sector cannot reach its end (with
  // 4 MiB, the readahead of the 2 MiB read before the error brought in all of it once, under -j2).
  const auto a = f.cold_file("a.safetensors", 4 * MiB), b = f.cold_file("b.safetensors", 16 * MiB),
             c = f.cold_file("c.safetensors", 4 * MiB);
  FaultyReads faults;
  faults.bad = b;
  faults.from = 2 * MiB;  // a bad sector 2 MiB into b
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.block = 1 * MiB;
  o.readers = 1;  // one reader: the reads come in order, none after the failed one
  o.read = faults.fn();
  auto report = warm::warm_files({a, b, c}, o, {}, stop);
  REQUIRE(report.read_failure.has_value());
  CHECK(report.read_failure->path == b);
  // Where the first read of b at or past 2 MiB started: the kernel's readahead may have brought
  // pages past 2 MiB in before the reader got there (6 MiB once under load), which are not read.
  CHECK(report.read_failure->offset >= 2 * MiB);
  const auto first_bad = std::find_if(faults.seen.begin(), faults.seen.end(), [&](const auto& r) {
    return r.first == faults.bad_fd && r.second >= 2 * MiB;
  });
  REQUIRE(first_bad != faults.seen.end());
  CHECK(report.read_failure->offset == first_bad->second);
  CHECK(report.read_failure->err == EIO);
  CHECK(report.warmed.empty());
  CHECK(report.skipped.empty());  // an error is not a skip
  CHECK_FALSE(report.stopped);
  CHECK_FALSE(report.budget_reached);
  CHECK(warmed_all(a));  // what came before the error was read
  CHECK(resident(c) == 0);        // nothing after it
  REQUIRE_FALSE(faults.seen.empty());
  CHECK(faults.seen.back() == std::pair<int, std::uint64_t>{faults.bad_fd, report.read_failure->offset});
  CHECK(resident(b) < 16 * MiB);  // not read to its end
}

TEST_CASE("a read error stops every reader, not only the one that met it") {
  Folder f;
  std::vector<fs::path> files;
  for (int i = 0; i < 8; ++i) files.push_back(f.cold_file("shard-" + std::to_string(i), 4 * MiB));
  FaultyReads faults;
  faults.bad = files[0];  // every block of the first file fails, the first ones the readers take
  faults.err = ENXIO;
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.block = 1 * MiB;
  o.readers = 4;
  o.read = faults.fn();
  auto report = warm::warm_files(files, o, {}, stop);
  REQUIRE(report.read_failure.has_value());
  CHECK(report.read_failure->path == files[0]);
  CHECK(report.read_failure->offset % MiB == 0);  // the start of whichever of its blocks failed first
  CHECK(report.read_failure->offset < 4 * MiB);
  CHECK(report.read_failure->err == ENXIO);
  CHECK(report.warmed.empty());
  // The other readers end after the blocks in flight (at most one each): the last files stay cold.
  CHECK(report.totals.bytes_warmed <= 3 * MiB);
  CHECK(resident(files.back()) == 0);
}

TEST_CASE("an interrupted read (EINTR) is tried again and warming completes") {
  Folder f;
  const auto p = f.cold_file("interrupted", 4 * MiB);
  std::mutex mutex;
  std::set<std::uint64_t> interrupted;  // each offset is interrupted once, then read
  warm::Stop stop;
  warm::Options o = options(64 * MiB);
  o.block = 1 * MiB;
  o.read = [&](int fd, void* buffer, std::size_t n, std::uint64_t offset) -> ssize_t {
    {
      std::lock_guard lock(mutex);
      if (interrupted.insert(offset).second) {
        errno = EINTR;
        return -1;
      }
    }
    return ::pread(fd, buffer, n, static_cast<off_t>(offset));
  };
  auto report = warm::warm_files({p}, o, {}, stop);
  CHECK_FALSE(report.read_failure.has_value());
  CHECK(report.warmed == std::vector<fs::path>{p});
  CHECK_FALSE(interrupted.empty());
  CHECK(warmed_all(p));
}

TEST_CASE("resident bytes agree with mincore, are capped at the file's size and follow a truncation") {
  Folder f;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto odd = f.cold_file("odd", 3 * page + 100);
  CHECK(warm::resident_bytes(odd).value() == 0);
  read_all(odd);
  CHECK(warm::resident_bytes(odd).value() == 3 * page + 100);  // not 4 whole pages
  const auto half = half_resident(f, "half", 5);
  CHECK(warm::resident_bytes(half).value() == 3 * MiB);
  fs::resize_file(half, 2 * MiB + 10);  // keeps MiB 0 resident, MiB 1 dropped, 10 bytes of MiB 2
  CHECK(warm::resident_bytes(half).value() == resident(half));
  CHECK(warm::resident_bytes(half).value() == 1 * MiB + 10);
}

TEST_CASE("drop_cached drops a file's clean pages from the page cache") {
  Folder f;
  const auto p = f.cold_file("dropped", 4 * MiB);
  read_all(p);
  REQUIRE(warm::drop_cached(p).has_value());
  CHECK(resident(p) == 0);
}

TEST_CASE("resident_bytes and drop_cached fail with an io_error naming a missing file") {
  Folder f;
  const auto missing = f.dir / "missing.safetensors";
  auto r = warm::resident_bytes(missing);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  CHECK(r.error().message.find(missing.string()) != std::string::npos);
  auto d = warm::drop_cached(missing);
  REQUIRE_FALSE(d.has_value());
  CHECK(d.error().code == Errc::io_error);
  CHECK(d.error().message.find(missing.string()) != std::string::npos);
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
