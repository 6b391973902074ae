#include "warm/warm.hpp"

#include "util/files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace modeld::warm {

namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t page_size() {
  static const std::uint64_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::uint64_t>(p) : 4096u;
  }();
  return page;
}

Error file_error(const std::filesystem::path& file, std::string_view what, int err) {
  return make_error(Errc::io_error, fmt::format("{} {}: {}", what, file.string(), std::strerror(err)));
}

// Calls on_run(offset, length) for each run of pages of [offset, offset + length) of `fd` that
// are resident (`want_resident`) or not; `offset` is page-aligned, `size` the file's size.
// `vec` is reused between calls. Returns false (errno set) when mmap or mincore fails.
template <class OnRun>
bool for_each_run(int fd, std::uint64_t offset, std::uint64_t length, std::uint64_t size, bool want_resident,
                  std::vector<unsigned char>& vec, OnRun&& on_run) {
  if (length == 0) return true;
  const std::uint64_t page = page_size();
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED) return false;
  const std::size_t pages = (length + page - 1) / page;
  vec.resize(pages);
  const bool ok = ::mincore(map, length, vec.data()) == 0;
  const int err = errno;
  ::munmap(map, length);
  if (!ok) {
    errno = err;
    return false;
  }
  std::size_t i = 0;
  while (i < pages) {
    if (((vec[i] & 1) != 0) != want_resident) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < pages && ((vec[j] & 1) != 0) == want_resident) ++j;
    const std::uint64_t start = offset + i * page;
    const std::uint64_t end = std::min(offset + j * page, size);
    if (end > start) on_run(start, end - start);
    i = j;
  }
  return true;
}

constexpr std::uint64_t kChunk = 1ull << 30;  // bytes mapped at once to measure a whole file

// Resident bytes of an open file of `size` bytes, in chunks of kChunk.
Result<std::uint64_t> resident_of(int fd, std::uint64_t size, const std::filesystem::path& file) {
  std::vector<unsigned char> vec;
  std::uint64_t resident = 0;
  for (std::uint64_t off = 0; off < size; off += kChunk) {
    const std::uint64_t len = std::min(kChunk, size - off);
    if (!for_each_run(fd, off, len, size, true, vec, [&](std::uint64_t, std::uint64_t n) { resident += n; }))
      return file_error(file, "cannot measure the residency of", errno);
  }
  return resident;
}

}  // namespace

Result<std::uint64_t> resident_bytes(const std::filesystem::path& file) {
  const util::OwnedFd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) return file_error(file, "cannot open", errno);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return file_error(file, "cannot stat", errno);
  return resident_of(f.get(), static_cast<std::uint64_t>(st.st_size), file);
}

Result<void> drop_cached(const std::filesystem::path& file) {
  const util::OwnedFd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) return file_error(file, "cannot open", errno);
  if (int rc = ::posix_fadvise(f.get(), 0, 0, POSIX_FADV_DONTNEED); rc != 0)
    return file_error(file, "cannot drop the cached pages of", rc);
  return {};
}

Result<Memory> parse_meminfo(std::string_view text) {
  std::optional<std::uint64_t> available, total;
  std::istringstream in{std::string(text)};
  std::string key, unit;
  std::uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    if (!(l >> key >> value)) continue;
    unit.clear();
    l >> unit;
    const std::uint64_t bytes = unit == "kB" ? value * 1024 : value;
    if (key == "MemAvailable:") available = bytes;
    if (key == "MemTotal:") total = bytes;
  }
  if (!available || !total) return make_error(Errc::io_error, "/proc/meminfo lacks MemAvailable or MemTotal");
  return Memory{*available, *total};
}

Result<Memory> read_memory(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return make_error(Errc::io_error, fmt::format("cannot read {}", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_meminfo(ss.str());
}

void Stop::request() {
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
  }
  cv_.notify_all();
}

bool Stop::wait_until(Clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return cv_.wait_until(lock, deadline, [this] { return stopped_.load(); });
}

namespace {

// One file chosen for warming, open while its blocks are read.
struct Chosen {
  std::filesystem::path path;
  util::OwnedFd fd;
  std::uint64_t size = 0;
};

// One block of a chosen file.
struct Block {
  std::size_t file;
  std::uint64_t offset, length;
};

ssize_t pread_at(int fd, void* buffer, std::size_t n, std::uint64_t offset) {
  return ::pread(fd, buffer, n, static_cast<off_t>(offset));
}

// The state the reader threads share.
class Readers {
 public:
  Readers(const Options& o, const ProgressFn& progress, Stop& stop, Progress totals)
      : options_(o), progress_(progress), stop_(stop), totals_(totals), start_(Clock::now()),
        read_(o.read ? o.read : ReadFn(pread_at)) {}

  // Reads `blocks` of `files` with options.readers threads; returns the bytes read.
  std::uint64_t run(const std::vector<Chosen>& files, const std::vector<Block>& blocks) {
    std::vector<std::thread> threads;
    const unsigned n = std::max(1u, std::min<unsigned>(options_.readers, static_cast<unsigned>(blocks.size())));
    for (unsigned i = 0; i < n && !blocks.empty(); ++i) threads.emplace_back([&] { read_blocks(files, blocks); });
    for (auto& t : threads) t.join();
    report(true);
    return warmed_.load();
  }

  // The first read error a reader met, if any; call after run().
  std::optional<ReadFailure> failure() {
    std::lock_guard lock(failure_mutex_);
    return failure_;
  }

 private:
  // Whether the readers should end: a stop request, or a read error of any of them.
  bool halted() const noexcept { return stop_.requested() || failed_.load(std::memory_order_relaxed); }

  void read_blocks(const std::vector<Chosen>& files, const std::vector<Block>& blocks) {
    std::vector<char> buffer(options_.block);
    std::vector<unsigned char> vec;
    for (;;) {
      const std::size_t i = next_.fetch_add(1);
      if (i >= blocks.size() || halted()) return;
      const Block& b = blocks[i];
      const Chosen& f = files[b.file];
      // Only what mincore shows missing is read; when it cannot tell, the whole block is.
      const bool measured =
          for_each_run(f.fd.get(), b.offset, b.length, f.size, false, vec, [&](std::uint64_t off, std::uint64_t len) {
            if (!halted()) read_run(f, off, len, buffer);
          });
      if (!measured && !halted()) read_run(f, b.offset, b.length, buffer);
      report(false);
    }
  }

  void read_run(const Chosen& f, std::uint64_t off, std::uint64_t len, std::vector<char>& buffer) {
    while (len > 0 && !halted()) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(len, buffer.size()));
      if (!pace(n)) return;
      const ssize_t got = read_(f.fd.get(), buffer.data(), n, off);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return fail(f.path, off, errno);
      if (got == 0) return;  // the file ended early (shrunk meanwhile): what is there is warmed
      warmed_ += static_cast<std::uint64_t>(got);
      off += static_cast<std::uint64_t>(got);
      len -= static_cast<std::uint64_t>(got);
    }
  }

  // Records the first read error and ends every reader after the blocks in flight.
  void fail(const std::filesystem::path& path, std::uint64_t offset, int err) {
    std::lock_guard lock(failure_mutex_);
    if (!failure_) failure_ = ReadFailure{path, offset, err};
    failed_ = true;
  }

  // Waits until reading `n` more bytes keeps within max_bytes_per_s; false when stopped meanwhile.
  bool pace(std::size_t n) {
    if (options_.max_bytes_per_s == 0) return true;
    const std::uint64_t after = reserved_.fetch_add(n) + n;
    const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(static_cast<double>(after) /
                                                                static_cast<double>(options_.max_bytes_per_s)));
    return !stop_.wait_until(due);
  }

  void report(bool last) {
    if (!progress_) return;
    std::lock_guard lock(progress_mutex_);
    const auto now = Clock::now();
    if (!last && now - last_progress_ < options_.progress_every) return;
    last_progress_ = now;
    Progress p = totals_;
    p.bytes_warmed = warmed_.load();
    progress_(p);
  }

  const Options& options_;
  const ProgressFn& progress_;
  Stop& stop_;
  const Progress totals_;
  const Clock::time_point start_;
  const ReadFn read_;
  std::atomic<std::size_t> next_{0};
  std::atomic<std::uint64_t> warmed_{0};
  std::atomic<std::uint64_t> reserved_{0};
  std::atomic<bool> failed_{false};
  std::mutex failure_mutex_;
  std::optional<ReadFailure> failure_;
  std::mutex progress_mutex_;
  Clock::time_point last_progress_{};
};

// Opens and measures `files`, choosing the prefix whose non-resident bytes fit in the budget;
// fills `report` (totals, skipped) and returns the chosen files.
std::vector<Chosen> choose(const std::vector<std::filesystem::path>& files, std::uint64_t budget, Report& report) {
  std::vector<Chosen> chosen;
  std::uint64_t left = budget;
  for (const auto& path : files) {
    Chosen c{path, util::OwnedFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), 0};
    struct stat st {};
    if (c.fd.get() < 0 || ::fstat(c.fd.get(), &st) != 0) {
      report.skipped.push_back({path, 0, file_error(path, "cannot open", errno).message});
      continue;
    }
    c.size = static_cast<std::uint64_t>(st.st_size);
    report.totals.bytes_total += c.size;
    auto resident = resident_of(c.fd.get(), c.size, path);
    if (!resident) {
      report.skipped.push_back({path, c.size, resident.error().message});
      continue;
    }
    report.totals.bytes_resident_before += *resident;
    const std::uint64_t missing = c.size - std::min(c.size, *resident);
    if (report.budget_reached || missing > left) {
      report.budget_reached = true;
      report.skipped.push_back({path, c.size, "RAM budget"});
      continue;
    }
    left -= missing;
    chosen.push_back(std::move(c));
  }
  return chosen;
}

}  // namespace

Report warm_files(const std::vector<std::filesystem::path>& files, const Options& options, const ProgressFn& progress,
                  Stop& stop) {
  Report report;
  std::vector<Chosen> chosen = choose(files, options.budget, report);
  if (progress) progress(report.totals);  // what is resident, before the first read
  // Blocks in the files' order, so the readers move through the checkpoint as a loader would.
  const std::uint64_t page = page_size();
  std::uint64_t want = options.block;
  // A rate limit reads smaller blocks, so progress and a stop request come at least every 1/4 s.
  if (options.max_bytes_per_s > 0) want = std::min<std::uint64_t>(want, options.max_bytes_per_s / 4);
  const std::uint64_t block = std::max<std::uint64_t>(page, want / page * page);
  std::vector<Block> blocks;
  for (std::size_t i = 0; i < chosen.size(); ++i)
    for (std::uint64_t off = 0; off < chosen[i].size; off += block)
      blocks.push_back({i, off, std::min(block, chosen[i].size - off)});
  Options o = options;
  o.block = static_cast<std::size_t>(block);
  Readers readers(o, progress, stop, report.totals);
  report.totals.bytes_warmed = readers.run(chosen, blocks);
  report.stopped = stop.requested();
  report.read_failure = readers.failure();
  if (!report.stopped && !report.read_failure)
    for (const auto& c : chosen) report.warmed.push_back(c.path);
  return report;
}

}  // namespace modeld::warm
