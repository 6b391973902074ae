// The download engine.
//
// A run has `parallel_files` connection slots ("workers", coroutines on the io_context). A worker
// takes work in this order: a hole of a file that is already open (a resumed partial may have
// several), the next file of the listing (opening its partial re-hashes the bytes kept from an
// earlier run), else it splits the largest part still in flight and takes its second half. Each
// part ("segment") is one Range request; its bytes are buffered into large blocks that are
// written (and, when the block continues the hashed prefix, hashed in the same pool job) on the
// disk pool. Blocks that arrive ahead of the hashed prefix are hashed later by a catch-up that
// re-reads them from the partial file (page cache). A file is finished (fsync, digest check,
// rename) when every byte is written and hashed. Retries follow hub-protocol.md "Retries", with
// one budget and one pause shared by the whole run.

#include "fetch/fetch.hpp"

#include "fetch/disk_guard.hpp"
#include "fetch/partial.hpp"
#include "hub/retry.hpp"
#include "sys/log.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "verify/hash.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>

namespace modeld::fetch {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using asio::awaitable;
using namespace std::chrono_literals;

namespace {

// Same-boot sidecar records (partial.hpp) at most this often per file. Only whole write blocks
// (clamp(16 MiB / parallel_files, 256 KiB, 2 MiB), fetch.hpp) reach the file, so a kill -9
// costs what arrived in this interval plus the block each connection was filling: nothing to
// speak of on a fast link, up to a minute of transfer at 32 KiB/s.
constexpr auto kRecordInterval = 250ms;
// Durable records (fdatasync, then an fsynced sidecar) at least this often per file, so a power
// loss costs at most this much.
constexpr std::uint64_t kDurableBytes = 1ull << 30;
constexpr auto kDurableInterval = 30s;
// Split points are rounded down to this, so parts start on page boundaries.
constexpr std::uint64_t kSplitAlign = 64u << 10;

bool is_cancelled(asio::cancellation_type t) { return t != asio::cancellation_type::none; }

// "bytes A-B/T" or "bytes A-B/*" (RFC 9110 14.4); nullopt when it is not that shape.
struct ContentRange {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  std::optional<std::uint64_t> total;
};

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<ContentRange> parse_content_range(std::string_view s) {
  if (!s.starts_with("bytes ")) return std::nullopt;
  s.remove_prefix(6);
  auto dash = s.find('-');
  auto slash = s.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  auto first = parse_u64(s.substr(0, dash));
  auto last = parse_u64(s.substr(dash + 1, slash - dash - 1));
  if (!first || !last || *last < *first) return std::nullopt;
  ContentRange cr{*first, *last, std::nullopt};
  auto total = s.substr(slash + 1);
  if (total != "*") {
    cr.total = parse_u64(total);
    if (!cr.total) return std::nullopt;
  }
  return cr;
}

// What the first bytes of a wrong file look like, for the error message; "" when unrecognised.
std::string describe_content(std::string_view prefix) {
  std::size_t i = 0;
  while (i < prefix.size() && (prefix[i] == ' ' || prefix[i] == '\n' || prefix[i] == '\r' || prefix[i] == '\t')) ++i;
  prefix.remove_prefix(i);
  if (prefix.starts_with("version https://git-lfs")) return "a Git LFS pointer file";
  if (prefix.starts_with("<")) return "an HTML page";
  if (prefix.starts_with("{")) return "a JSON document";
  return "";
}

const char* kind_name(verify::HashKind k) { return k == verify::HashKind::sha256 ? "sha256" : "git blob sha1"; }

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A token bucket shared by all workers: each block is paid for before it is buffered; a worker
// that overdraws waits until the debt is repaid, which throttles its socket reads (TCP
// back-pressure) and so the whole run to max_bytes_per_s.
class RateLimiter {
 public:
  explicit RateLimiter(std::uint64_t bytes_per_s) : rate_(static_cast<double>(bytes_per_s)) {}

  awaitable<void> acquire(std::size_t n) {
    if (rate_ <= 0) co_return;
    auto now = Clock::now();
    tokens_ = std::min(tokens_ + seconds(now - last_) * rate_, rate_);
    last_ = now;
    tokens_ -= static_cast<double>(n);
    if (tokens_ >= 0) co_return;
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(-tokens_ / rate_)));
    co_await timer.async_wait(asio::use_awaitable);
  }

 private:
  double rate_;
  double tokens_ = 0;
  Clock::time_point last_ = Clock::now();
};

// A write block whose bytes sit at the same offset modulo kDirectAlign in memory as in the file,
// in memory aligned to kDirectAlign, so the middle of every block can go out with O_DIRECT
// (PartialFile::write_at); a block fills up to the next aligned file offset.
class Block {
 public:
  // Allocates `capacity` bytes (a multiple of kDirectAlign).
  void allocate(std::size_t capacity) {
    buf_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlign, capacity)));
    if (!buf_) throw std::bad_alloc();
    cap_ = capacity;
  }
  // Empties the block; its next byte belongs at file offset `offset`.
  void start(std::uint64_t offset) {
    lead_ = static_cast<std::size_t>(offset % kDirectAlign);
    size_ = 0;
  }
  std::size_t room() const { return cap_ - lead_ - size_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const char> bytes() const { return {buf_.get() + lead_, size_}; }
  // The free room after the bytes, where the HTTP client may read the next bytes directly.
  std::span<char> free_space() { return {buf_.get() + lead_ + size_, room()}; }
  // Adds `d` to the bytes: without a copy when `d` is the start of free_space().
  void take(std::span<const char> d) {
    char* tail = buf_.get() + lead_ + size_;
    if (d.data() != tail) std::memmove(tail, d.data(), d.size());
    size_ += d.size();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> buf_;
  std::size_t cap_ = 0;
  std::size_t lead_ = 0;
  std::size_t size_ = 0;
};

struct Segment;

// One file of the run. Everything here is touched on the io_context thread only, except the
// partial file's I/O and the hasher, which pool jobs use while `hash_busy` (hasher) or a
// segment's flush (its own byte range) is in flight.
struct FileState {
  FileState(const Options& o, const repo::RepoFile& f)
      : file(f),
        kind(f.is_lfs() ? verify::HashKind::sha256 : verify::HashKind::git_sha1),
        expected(util::ascii_lower(f.is_lfs() ? *f.lfs_sha256 : f.blob_id)),
        part(o.dest_dir, Sidecar{o.commit, f.path, f.size, kind, expected}) {}

  enum class Stage { waiting, opening, open, finishing, done, failed };

  const repo::RepoFile& file;
  verify::HashKind kind;
  std::string expected;
  PartialFile part;
  Stage stage = Stage::waiting;

  std::optional<verify::Hasher> hasher;
  std::uint64_t hashed = 0;  // bytes [0, hashed) went through the hasher
  bool hash_busy = false;    // a pool job is using the hasher
  RangeSet written;          // bytes on disk (completed writes)
  std::vector<ByteRange> holes;  // parts not yet taken by any segment
  std::vector<Segment*> active;  // segments fetching parts of this file now
  bool ranges_ok = true;         // false once the server ignored a Range: no more splitting
  bool restarted = false;        // the file was started over once after a 416
  bool discard = false;          // the bytes are not the file: delete the partial at the end
  std::vector<char> catch_up_block;
  std::string prefix;  // the file's first bytes, to say what arrived when it is wrong
  unsigned failures = 0;  // attempts in a row that brought no byte of this file

  std::uint64_t counted = 0;  // this file's share of Progress::bytes_done
  Clock::time_point last_record{};
  Clock::time_point last_durable = Clock::now();
  std::uint64_t since_durable = 0;
  // Per-file rate: bytes counted at the last sample and an exponential average.
  std::uint64_t rate_bytes = 0;
  Clock::time_point rate_time = Clock::now();
  double rate = 0;

  std::optional<Fetched> result;

  bool all_written() const { return written.contiguous_end(0) >= file.size; }

  void note_prefix(std::uint64_t offset, std::span<const char> data) {
    if (offset != prefix.size() || prefix.size() >= 64) return;
    prefix.append(data.data(), std::min<std::size_t>(data.size(), 64 - prefix.size()));
  }
};

// One part of a file fetched by one request (and its retries).
struct Segment {
  FileState& f;
  std::uint64_t end;       // one past the last byte to fetch; a split lowers it
  std::uint64_t received;  // next byte to receive (the block holds [flushed, received))
  std::uint64_t flushed;   // next byte to write
  Block block;
};

// What all workers of one run share; lives in the run's coroutine frame, which outlives them.
struct RunState {
  RunState(hub::Hub& h, http::Client& c, asio::thread_pool& p, const Options& o,
           const std::vector<repo::RepoFile>& list, std::function<void(const Progress&)> cb)
      : hub(h),
        client(c),
        pool(p),
        options(o),
        // A multiple of 64 KiB (O_DIRECT alignment), ~16 MiB for all connections together.
        block_size(std::clamp<std::size_t>((16u << 20) / std::max(1u, o.parallel_files), 256u << 10, 2u << 20) /
                   (64u << 10) * (64u << 10)),
        limiter(o.max_bytes_per_s),
        guard(o.dest_dir, o.disk_reserve),
        on_progress(std::move(cb)) {
    for (const auto& f : list) files.push_back(std::make_unique<FileState>(o, f));
    samples.emplace_back(Clock::now(), 0);
  }

  hub::Hub& hub;
  http::Client& client;
  asio::thread_pool& pool;
  const Options& options;
  std::size_t block_size;
  RateLimiter limiter;
  DiskGuard guard;
  std::function<void(const Progress&)> on_progress;

  std::vector<std::unique_ptr<FileState>> files;
  std::size_t next_file = 0;
  std::optional<Error> first_error;
  bool stopping = false;
  std::vector<std::unique_ptr<asio::cancellation_signal>> signals;
  std::size_t running = 0;  // workers and catch-ups not yet finished
  std::unique_ptr<asio::steady_timer> all_done;
  // Never expires; cancelling it wakes the workers waiting for work (a file finished opening).
  std::unique_ptr<asio::steady_timer> work_event;

  // The shared retry state: failures in a row, one pause for every connection, its total.
  hub::RetryBudget retries{hub::RetryPolicy{.backoff_base = options.backoff_base}, options.retry_budget,
                           options.max_retry_wait};

  // Progress.
  Progress progress;
  std::uint64_t received_total = 0;  // bytes that came from the network
  std::deque<std::pair<Clock::time_point, std::uint64_t>> samples;
  Clock::time_point last_report{};
  bool reported = false;

  // Records the first failure and stops everything; partials are kept.
  void fail(Error e) {
    if (!first_error) first_error = std::move(e);
    stop();
  }

  void stop() {
    if (stopping) return;
    stopping = true;
    for (auto& sig : signals) sig->emit(asio::cancellation_type::terminal);
    notify_work();
  }

  void notify_work() {
    if (work_event) work_event->cancel();
  }

  awaitable<void> wait_work() { co_await work_event->async_wait(asio::as_tuple(asio::use_awaitable)); }

  bool any_opening() const {
    return std::any_of(files.begin(), files.end(),
                       [](const auto& f) { return f->stage == FileState::Stage::opening; });
  }

  // `n` bytes of `f` came from the network.
  void received(FileState& f, std::uint64_t n) {
    progress.bytes_done += n;
    f.counted += n;
    received_total += n;
    retries.progressed();
    f.failures = 0;
    report(false);
  }

  // Takes back the bytes `f` had counted (its partial is started over).
  void uncount(FileState& f) {
    progress.bytes_done -= f.counted;
    f.counted = 0;
  }

  // Calls on_progress when progress_interval has passed since the last call, or when `force`.
  void report(bool force) {
    auto now = Clock::now();
    if (now - samples.back().first >= 200ms) samples.emplace_back(now, received_total);
    while (samples.size() > 2 && now - samples[1].first >= 5s) samples.pop_front();
    double dt = seconds(now - samples.front().first);
    // Under a second of samples gives wild rates (and ETAs of hours): report none until then.
    if (dt >= 1.0) progress.rate_bytes_per_s = static_cast<double>(received_total - samples.front().second) / dt;
    if (!on_progress) return;
    if (!force && reported && now - last_report < options.progress_interval) return;
    reported = true;
    last_report = now;
    progress.files.clear();
    for (auto& f : files) {
      if (f->stage != FileState::Stage::open && f->stage != FileState::Stage::finishing) continue;
      double fdt = seconds(now - f->rate_time);
      if (fdt >= 1.0) {
        double inst = static_cast<double>(f->counted - std::min(f->counted, f->rate_bytes)) / fdt;
        f->rate = f->rate == 0 ? inst : 0.5 * f->rate + 0.5 * inst;
        f->rate_bytes = f->counted;
        f->rate_time = now;
      }
      progress.files.push_back(
          FileProgress{f->file.path, f->counted, f->file.size, f->rate, static_cast<unsigned>(f->active.size())});
    }
    on_progress(progress);
  }

  // Runs `coro` as a tracked child: the run waits for it, and an exception fails the run.
  void spawn(awaitable<void> coro, asio::cancellation_slot slot = {}) {
    ++running;
    auto done = [this](std::exception_ptr e) {
      if (e) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(e);
        } catch (const boost::system::system_error& se) {
          if (se.code() == asio::error::operation_aborted) what.clear();
          else what = se.what();
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        if (!what.empty()) fail(make_error(Errc::internal, "a download worker failed unexpectedly: " + what));
      }
      if (--running == 0 && all_done) all_done->cancel();
    };
    if (slot.is_connected())
      asio::co_spawn(all_done->get_executor(), std::move(coro), asio::bind_cancellation_slot(slot, std::move(done)));
    else
      asio::co_spawn(all_done->get_executor(), std::move(coro), std::move(done));
  }

  // Decides what a retryable failure costs: returns the pause before the next attempt, or the
  // error that ends the run. `sent` is when the failed request was sent.
  Result<Clock::duration> retry(FileState& f, const Error& e, Clock::time_point sent,
                                std::optional<std::chrono::seconds> retry_after) {
    ++f.failures;
    if (f.failures >= options.max_attempts) {
      Error out = e;
      out.message += fmt::format(" (after {} attempts)", f.failures);
      return out;
    }
    return retries.failed(e, sent, retry_after);
  }

  // Waits out the shared retry pause, if any.
  awaitable<void> wait_pause() {
    while (Clock::now() < retries.paused_until() && !stopping) {
      asio::steady_timer timer(co_await asio::this_coro::executor);
      timer.expires_at(retries.paused_until());
      co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }
};

Error cancelled_error(const FileState& f) { return make_error(Errc::cancelled, fmt::format("downloading {}: cancelled", f.file.path)); }

awaitable<Result<void>> finish_if_complete(RunState& s, FileState& f);

// Hashes the bytes that are on disk past the hashed prefix, in order, re-reading them from the
// partial file; then finishes the file when it is complete.
awaitable<Result<void>> catch_up(RunState& s, FileState& f) {
  if (f.hash_busy) co_return Result<void>{};
  f.hash_busy = true;
  Result<void> out;
  while (!s.stopping) {
    std::uint64_t end = f.written.contiguous_end(f.hashed);
    if (end <= f.hashed) break;
    f.catch_up_block.resize(s.block_size);
    std::uint64_t at = f.hashed;
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(f.catch_up_block.size(), end - at));
    auto n = co_await util::on_pool<Result<std::size_t>>(s.pool, [&f, at, want]() -> Result<std::size_t> {
      auto r = f.part.read_at(at, std::span<char>(f.catch_up_block.data(), want));
      if (r && *r > 0) f.hasher->update(std::span<const char>(f.catch_up_block.data(), *r));
      return r;
    });
    if (!n) {
      out = n.error();
      break;
    }
    if (*n == 0) {
      out = make_error(Errc::io_error, fmt::format("{}: the partial file {} is shorter than its sidecar says", f.file.path,
                                                   f.part.part_path().string()));
      f.discard = true;
      break;
    }
    f.note_prefix(at, std::span<const char>(f.catch_up_block.data(), *n));
    f.hashed += *n;
  }
  f.catch_up_block.clear();
  f.catch_up_block.shrink_to_fit();
  f.hash_busy = false;
  if (!out) co_return out;
  co_return co_await finish_if_complete(s, f);
}

// `e` marked as being about the file of `f` (for the journal's MODELD_FILE), unless it names files already.
Error about_file(Error e, const FileState& f) {
  if (e.files.empty() && e.code != Errc::cancelled) e.files.push_back(f.file.path);
  return e;
}

// Starts a catch-up on its own coroutine when written bytes wait past the hashed prefix.
void kick_catch_up(RunState& s, FileState& f) {
  if (f.hash_busy || s.stopping || f.written.contiguous_end(f.hashed) <= f.hashed) return;
  s.spawn([](RunState& s, FileState& f) -> awaitable<void> {
    auto r = co_await catch_up(s, f);
    if (!r) s.fail(about_file(r.error(), f));
  }(s, f));
}

// The file is complete when every byte is written and hashed and no part is in flight: fsync,
// compare the digest with the listing, then promote (or discard).
awaitable<Result<void>> finish_if_complete(RunState& s, FileState& f) {
  if (f.stage != FileState::Stage::open || !f.holes.empty() || !f.active.empty() || f.hash_busy || s.stopping)
    co_return Result<void>{};
  if (!f.all_written()) co_return Result<void>{};
  if (f.hashed < f.file.size) co_return co_await catch_up(s, f);
  f.stage = FileState::Stage::finishing;
  if (auto r = co_await util::on_pool<Result<void>>(s.pool, [&f] { return f.part.sync(); }); !r) {
    f.stage = FileState::Stage::failed;
    co_return r.error();
  }
  std::string actual = f.hasher->hex();
  f.hasher.reset();
  if (actual != f.expected) {
    f.stage = FileState::Stage::failed;
    f.discard = true;  // these bytes can never become the file
    std::string what = describe_content(f.prefix);
    co_return make_error(Errc::checksum_mismatch,
                         fmt::format("{}: {} is {} but the listing says {}{}", f.file.path, kind_name(f.kind), actual,
                                     f.expected, what.empty() ? "" : "; what arrived is " + what));
  }
  if (auto r = co_await util::on_pool<Result<void>>(s.pool, [&f] { return f.part.promote(); }); !r) {
    f.stage = FileState::Stage::failed;
    co_return r.error();
  }
  f.stage = FileState::Stage::done;
  f.result = Fetched{f.file.path, f.file.size, actual};
  ++s.progress.files_done;
  s.report(false);
  co_return Result<void>{};
}

// Opens a file's partial: trusted ranges from an earlier run count as done and are re-hashed
// from disk (never downloaded again); the holes become work.
awaitable<Result<void>> open_file(RunState& s, FileState& f) {
  f.stage = FileState::Stage::opening;
  auto opened = co_await util::on_pool<Result<RangeSet>>(s.pool, [&f] { return f.part.open(); });
  if (!opened) {
    f.stage = FileState::Stage::failed;
    s.notify_work();
    co_return opened.error();
  }
  f.written = std::move(*opened);
  f.hasher.emplace(f.kind, f.file.size);
  f.hashed = 0;
  f.counted = f.written.total();
  f.rate_bytes = f.counted;
  s.progress.bytes_done += f.counted;
  if (f.counted > 0) s.report(false);  // resumed bytes show at once, however slow the link
  f.holes = f.written.gaps(f.file.size);
  f.stage = FileState::Stage::open;
  s.notify_work();  // idle workers may take its holes or split its first part
  if (f.counted > 0)
    sys::logf(sys::Level::info, sys::Fields{.phase = "downloading", .extra = {{"MODELD_FILE", f.file.path}}},
              "{}: resuming with {} of {} bytes on disk from an earlier run", f.file.path, f.counted, f.file.size);
  // The kept prefix is hashed now; kept ranges past a hole wait until the hole is filled.
  co_return co_await catch_up(s, f);
}

// Starts a file over from byte 0 (after a 416): the partial is emptied, the counters reset.
awaitable<Result<void>> restart_file(RunState& s, FileState& f, Segment& seg) {
  f.restarted = true;
  s.uncount(f);
  f.written = RangeSet{};
  f.hasher.emplace(f.kind, f.file.size);
  f.hashed = 0;
  f.prefix.clear();
  f.holes.clear();
  seg.received = seg.flushed = 0;
  seg.end = f.file.size;
  seg.block.start(0);
  co_return co_await util::on_pool<Result<void>>(s.pool, [&f]() -> Result<void> {
    if (auto r = f.part.truncate(0); !r) return r;
    return f.part.record(RangeSet{}, true);
  });
}

// One segment's request: head checks, body into blocks, blocks to disk.
class SegmentRequest {
 public:
  SegmentRequest(RunState& s, Segment& seg) : s_(s), seg_(seg), f_(seg.f) {}

  // Sends one request for [received, end) and takes its body; the received bytes are on disk
  // when it returns. Success means the segment is complete.
  awaitable<Result<void>> run() {
    auto url = s_.hub.resolve_url(s_.options.repo, s_.options.commit, f_.file.path);
    if (!url) co_return url.error();
    http::Request req;
    req.url = *url;
    first_ = seg_.received;
    const std::uint64_t asked_end = seg_.end;
    bool whole = first_ == 0 && asked_end == f_.file.size;
    if (!whole) {
      if (asked_end == f_.file.size) req.headers.add("Range", fmt::format("bytes={}-", first_));
      else req.headers.add("Range", fmt::format("bytes={}-{}", first_, asked_end - 1));
    }
    http::BodySink sink;
    sink.on_head = [this](const http::ResponseHead& h) { return on_head(h); };
    sink.on_data = [this](std::span<const char> d) { return on_data(d); };
    sink.buffer = [this] { return seg_.block.free_space(); };  // bytes land in the write block
    Result<http::ResponseHead> r = make_error(Errc::internal, "no answer");
    try {
      r = co_await s_.client.stream(std::move(req), std::move(sink));
    } catch (const boost::system::system_error& e) {
      if (e.code() != asio::error::operation_aborted) throw;
      r = cancelled_error(f_);
    }
    // (GCC 12 miscompiles co_await inside || and ?:, hence the separate statements.)
    auto cs = co_await asio::this_coro::cancellation_state;
    bool cancelled = is_cancelled(cs.cancelled()) || (!r && r.error().code == Errc::cancelled && !reached_end_);
    if (cancelled) {
      // Keep what arrived: write the buffered block before giving up. The cancellation state is
      // reset so this one short pool job can be awaited; the caller still returns cancelled.
      co_await asio::this_coro::reset_cancellation_state();
      (void)co_await flush(true);
      co_return cancelled_error(f_);
    }
    if (auto fl = co_await flush(false); !fl) co_return fl.error();
    if (mismatch_) {
      std::string what = describe_content(sniffed_);
      co_return make_error(Errc::size_mismatch, *mismatch_ + (what.empty() ? "" : "; it is " + what));
    }
    if (reached_end_) co_return Result<void>{};  // stopped on purpose at the segment's end
    if (!r) co_return r.error();
    if (seg_.received < seg_.end) {
      if (status_ == 206)  // the server sent less of the range than asked: continue from there
        co_return make_error(Errc::network_error, fmt::format("{}: the server's answer to bytes={}- ended at byte {}",
                                                             f_.file.path, first_, seg_.received));
      // The server ended its answer normally but it is shorter than the listing: the bytes are
      // not the file (the client reports a connection cut short as network_error instead).
      f_.discard = true;
      std::string what = describe_content(f_.prefix);
      co_return make_error(Errc::size_mismatch,
                           fmt::format("{}: the server's answer ended after {} of {} bytes{}", f_.file.path,
                                       seg_.received, f_.file.size, what.empty() ? "" : "; it is " + what));
    }
    co_return Result<void>{};
  }

  bool got_416() const { return status_ == 416; }
  std::optional<std::chrono::seconds> retry_after() const { return retry_after_; }

 private:
  Result<void> on_head(const http::ResponseHead& h) {
    status_ = h.status;
    std::string ctype = h.headers.get("Content-Type").value_or("no Content-Type");
    if (h.status == 416) {
      auto cr = h.headers.get("Content-Range").value_or("");
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: the server answered 416 (range not satisfiable) to bytes={}- ({})", f_.file.path,
                                    first_, cr.empty() ? "no Content-Range" : cr));
    }
    if (h.status < 200 || h.status >= 300) {
      retry_after_ = hub::retry_after(h);
      return hub::Hub::error_from_response(h, fmt::format("downloading {}", f_.file.path));
    }
    std::uint64_t start = 0;
    std::uint64_t expected = f_.file.size;
    if (h.status == 206) {
      auto text = h.headers.get("Content-Range");
      auto cr = text ? parse_content_range(*text) : std::nullopt;
      if (!cr || cr->first != first_ || cr->last >= f_.file.size)
        return make_error(Errc::hub_bad_response,
                          fmt::format("{}: the server answered 206 with Content-Range \"{}\" to bytes={}-", f_.file.path,
                                      text.value_or(""), first_));
      if (cr->total && *cr->total != f_.file.size)
        return make_error(Errc::size_mismatch, fmt::format("{}: the server has {} bytes ({}) where the listing says {}",
                                                           f_.file.path, *cr->total, ctype, f_.file.size));
      start = cr->first;
      expected = cr->last + 1 - cr->first;
    } else if (h.status != 200) {
      return make_error(Errc::hub_bad_response, fmt::format("{}: unexpected status {} to a download", f_.file.path, h.status));
    }
    if (h.content_length && *h.content_length != expected) {
      mismatch_ = fmt::format("{}: expected {} bytes but the server sent {} bytes of {} (status {})", f_.file.path,
                              expected, *h.content_length, ctype, h.status);
      if (*h.content_length > (64u << 10)) return make_error(Errc::size_mismatch, *mismatch_);
      return {};  // a small wrong body: read its start to say what it is
    }
    if (start != seg_.received) {
      // A 200 to a Range request: the server ignores ranges and sends the file from byte 0.
      // Skip to where this segment continues, and split this file no more.
      skip_ = seg_.received;
      f_.ranges_ok = false;
    }
    return {};
  }

  awaitable<Result<void>> on_data(std::span<const char> data) {
    if (mismatch_) {
      sniffed_.append(data.data(), std::min<std::size_t>(data.size(), 256 - std::min<std::size_t>(256, sniffed_.size())));
      if (sniffed_.size() >= 256) co_return make_error(Errc::size_mismatch, *mismatch_);
      co_return Result<void>{};
    }
    if (skip_ > 0) {
      auto n = static_cast<std::size_t>(std::min<std::uint64_t>(skip_, data.size()));
      skip_ -= n;
      data = data.subspan(n);
      if (data.empty()) co_return Result<void>{};
    }
    if (seg_.received + data.size() > seg_.end) {
      if (seg_.end == f_.file.size) {
        f_.discard = true;
        co_return make_error(Errc::size_mismatch,
                             fmt::format("{}: the server sent more than the listed {} bytes", f_.file.path, f_.file.size));
      }
      // The segment was split (or asked a bounded range): take up to its end, then stop.
      data = data.first(static_cast<std::size_t>(seg_.end - seg_.received));
      reached_end_ = true;
    }
    co_await s_.limiter.acquire(data.size());
    f_.note_prefix(seg_.received, data);
    s_.received(f_, data.size());
    seg_.received += data.size();
    while (!data.empty()) {
      auto take = std::min(data.size(), seg_.block.room());
      seg_.block.take(data.first(take));
      data = data.subspan(take);
      if (seg_.block.room() == 0) {
        if (auto r = co_await flush(false); !r) co_return r.error();
      }
    }
    if (!reached_end_ && seg_.received >= seg_.end && seg_.end < f_.file.size) reached_end_ = true;
    if (reached_end_) co_return cancelled_error(f_);  // stops the stream; run() sees reached_end_
    co_return Result<void>{};
  }

 public:
  // Writes the block at its offset on the pool, hashing it in the same job when it continues
  // the hashed prefix, and records the sidecar every kRecordInterval (durably every
  // kDurableBytes or kDurableInterval, and when `durable`).
  awaitable<Result<void>> flush(bool durable) {
    auto& f = f_;
    if (seg_.block.empty() && !durable) co_return Result<void>{};
    std::uint64_t at = seg_.flushed;
    std::size_t len = seg_.block.size();
    bool hash_inline = len > 0 && at == f.hashed && !f.hash_busy;
    if (hash_inline) f.hash_busy = true;
    auto now = Clock::now();
    bool record = durable || now - f.last_record >= kRecordInterval;
    durable = durable || f.since_durable + len >= kDurableBytes || now - f.last_durable >= kDurableInterval;
    record = record || durable;
    RangeSet snapshot;
    if (record) {
      snapshot = f.written;
      snapshot.add({at, at + len});
    }
    auto r = co_await util::on_pool<Result<void>>(s_.pool, [&]() -> Result<void> {
      if (len > 0) {
        if (auto g = s_.guard.acquire(f.file.path, len); !g) return g;
        auto w = f.part.write_at(at, seg_.block.bytes());
        s_.guard.release(len);
        if (!w) return w;
        if (hash_inline) f.hasher->update(seg_.block.bytes());
      }
      if (record) return f.part.record(snapshot, durable);
      return {};
    });
    if (hash_inline) f.hash_busy = false;
    if (!r) co_return r.error();
    if (hash_inline) f.hashed += len;
    f.written.add({at, at + len});
    seg_.flushed += len;
    seg_.block.start(seg_.flushed);
    if (record) f.last_record = now;
    if (durable) {
      f.since_durable = 0;
      f.last_durable = now;
    } else {
      f.since_durable += len;
    }
    kick_catch_up(s_, f);
    co_return Result<void>{};
  }

 private:
  RunState& s_;
  Segment& seg_;
  FileState& f_;
  std::uint64_t first_ = 0;
  unsigned status_ = 0;
  std::uint64_t skip_ = 0;
  bool reached_end_ = false;
  std::optional<std::string> mismatch_;
  std::string sniffed_;
  std::optional<std::chrono::seconds> retry_after_;
};

// Fetches one segment with retries; success means its bytes are all on disk.
awaitable<Result<void>> run_segment(RunState& s, Segment& seg) {
  FileState& f = seg.f;
  for (;;) {
    if (seg.received >= seg.end) co_return Result<void>{};
    co_await s.wait_pause();
    if (s.stopping) co_return cancelled_error(f);
    auto sent = Clock::now();
    SegmentRequest req(s, seg);
    auto r = co_await req.run();
    if (r) continue;  // complete (or stopped at a split point): the loop condition ends it
    Error e = r.error();
    auto cs = co_await asio::this_coro::cancellation_state;
    if (e.code == Errc::cancelled || is_cancelled(cs.cancelled()) || s.stopping) co_return cancelled_error(f);
    if (req.got_416()) {
      // The server has fewer bytes than this part starts at. Start the file over once when this
      // is its only part; a second 416, or one amid other parts, is the server's fault.
      if (!f.restarted && f.active.size() == 1 && f.holes.empty() && !f.hash_busy) {
        sys::logf(sys::Level::warning, sys::Fields{.phase = "downloading", .extra = {{"MODELD_FILE", f.file.path}}},
                  "{}; starting the file over", e.message);
        if (auto rr = co_await restart_file(s, f, seg); !rr) co_return rr.error();
        continue;
      }
      co_return e;
    }
    if (!hub::retryable(e.code)) co_return e;
    auto delay = s.retry(f, e, sent, req.retry_after());
    if (!delay) co_return delay.error();
    sys::logf(sys::Level::warning, sys::Fields{.phase = "downloading", .extra = {{"MODELD_FILE", f.file.path}}},
              "{}; retrying in {:.1f} s", e.message, seconds(*delay));
  }
}

// The next part for a worker: a hole of an open file, else the next file, else the second half of
// the largest part in flight; nullptr when there is nothing left to share out.
awaitable<Result<std::unique_ptr<Segment>>> take_work(RunState& s) {
  for (;;) {
    if (s.stopping) co_return std::unique_ptr<Segment>{};
    for (auto& f : s.files) {
      if (f->stage != FileState::Stage::open || f->holes.empty()) continue;
      ByteRange hole = f->holes.front();
      f->holes.erase(f->holes.begin());
      co_return std::make_unique<Segment>(Segment{*f, hole.end, hole.begin, hole.begin, {}});
    }
    if (s.next_file < s.files.size()) {
      FileState& f = *s.files[s.next_file++];
      if (auto r = co_await open_file(s, f); !r) co_return r.error();
      continue;  // its holes are work now (or it was complete and is finished)
    }
    Segment* best = nullptr;
    for (auto& f : s.files) {
      if (f->stage != FileState::Stage::open || !f->ranges_ok) continue;
      for (Segment* seg : f->active)
        if (!best || seg->end - seg->received > best->end - best->received) best = seg;
    }
    if (!best || best->end - best->received < 2 * s.options.min_part_size) {
      // Nothing to split now. A file being opened may bring holes or a part to split; parts in
      // flight only shrink, so otherwise this worker is done.
      if (!s.any_opening()) co_return std::unique_ptr<Segment>{};
      co_await s.wait_work();
      continue;
    }
    std::uint64_t mid = best->received + (best->end - best->received) / 2;
    mid -= mid % kSplitAlign;
    if (mid < best->received + s.options.min_part_size) mid = best->received + s.options.min_part_size;
    auto seg = std::make_unique<Segment>(Segment{best->f, best->end, mid, mid, {}});
    best->end = mid;
    co_return seg;
  }
}

awaitable<void> worker(RunState& s) {
  while (!s.stopping) {
    auto work = co_await take_work(s);
    if (!work) {
      s.fail(work.error());
      co_return;
    }
    if (!*work) co_return;
    Segment& seg = **work;
    FileState& f = seg.f;
    f.active.push_back(&seg);
    seg.block.allocate(s.block_size);
    seg.block.start(seg.flushed);
    Result<void> r = make_error(Errc::internal, "not run");
    try {
      r = co_await run_segment(s, seg);
    } catch (const boost::system::system_error& e) {
      // After a cancellation every await throws operation_aborted (asio's throw_if_cancelled).
      if (e.code() != asio::error::operation_aborted) throw;
      r = cancelled_error(f);
    }
    std::erase(f.active, &seg);
    if (r) r = co_await finish_if_complete(s, f);
    if (!r) {
      if (f.stage == FileState::Stage::open) f.stage = FileState::Stage::failed;
      s.fail(about_file(r.error(), f));
      co_return;
    }
  }
}

awaitable<Result<std::vector<Fetched>>> run_all(hub::Hub& hub, http::Client& client, asio::thread_pool& pool,
                                                const Options& options, std::vector<repo::RepoFile> files,
                                                std::function<void(const Progress&)> on_progress) {
  // This coroutine has its own cancellation state (Fetcher::run spawns it), so changing how it
  // reacts to cancellation does not leak into the caller: it accepts terminal and total
  // cancellation, and it must keep awaiting its workers after a cancellation, so awaits must not
  // throw.
  co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
  co_await asio::this_coro::throw_if_cancelled(false);

  for (const auto& f : files) {
    if (!util::safe_relative_path(f.path))
      co_return make_error(Errc::plan_invalid, fmt::format("{}: not a safe relative path", f.path));
    if ((f.is_lfs() ? *f.lfs_sha256 : f.blob_id).empty())
      co_return make_error(Errc::hub_bad_response, fmt::format("{}: the listing has no digest for it", f.path));
  }

  RunState s(hub, client, pool, options, files, std::move(on_progress));
  s.progress.files_total = static_cast<unsigned>(files.size());
  s.progress.bytes_total = util::total_size(files);

  auto ex = co_await asio::this_coro::executor;
  s.all_done = std::make_unique<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
  s.work_event = std::make_unique<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
  std::size_t n = files.empty() ? 0 : std::max(1u, options.parallel_files);
  for (std::size_t i = 0; i < n; ++i) s.signals.push_back(std::make_unique<asio::cancellation_signal>());
  for (std::size_t i = 0; i < n; ++i) s.spawn(worker(s), s.signals[i]->slot());
  bool forwarded = false;
  while (s.running > 0) {
    co_await s.all_done->async_wait(asio::as_tuple(asio::use_awaitable));
    auto cs = co_await asio::this_coro::cancellation_state;
    if (s.running > 0 && !forwarded && is_cancelled(cs.cancelled())) {
      forwarded = true;
      if (!s.first_error) s.first_error = make_error(Errc::cancelled, "download cancelled");
      s.stop();
    }
  }

  // Every coroutine has ended: leave each unfinished partial with a durable record of its
  // ranges (or delete it when its bytes are known wrong).
  for (auto& f : s.files) {
    if (f->stage == FileState::Stage::done || f->stage == FileState::Stage::waiting) continue;
    FileState* fp = f.get();
    co_await util::on_pool<int>(pool, [fp] {
      if (fp->discard || fp->written.empty()) {
        fp->part.discard();
      } else {
        (void)fp->part.record(fp->written, true);
        fp->part.close();
      }
      return 0;
    });
  }

  // The final report counts what is on disk, not what was received: bytes still in a block
  // when the run stopped (a full disk, a cancel) were never written.
  s.progress.bytes_done = 0;
  for (auto& f : s.files)
    s.progress.bytes_done += f->stage == FileState::Stage::done ? f->file.size : f->written.total();
  s.report(true);
  if (s.first_error) co_return *s.first_error;
  std::vector<Fetched> out;
  out.reserve(files.size());
  for (auto& f : s.files) {
    if (!f->result) co_return make_error(Errc::internal, fmt::format("{}: the download ended without it", f->file.path));
    out.push_back(std::move(*f->result));
  }
  co_return out;
}

}  // namespace

Fetcher::Fetcher(hub::Hub& hub, http::Client& client, asio::thread_pool& disk_pool, Options options)
    : hub_(hub), client_(client), pool_(disk_pool), options_(std::move(options)) {}

awaitable<Result<std::vector<Fetched>>> Fetcher::run(std::vector<repo::RepoFile> files,
                                                     std::function<void(const Progress&)> on_progress) {
  // A child coroutine: the caller's cancellation reaches it through co_spawn, and its own
  // cancellation settings stay its own.
  auto ex = co_await asio::this_coro::executor;
  co_return co_await asio::co_spawn(ex,
                                    run_all(hub_, client_, pool_, options_, std::move(files), std::move(on_progress)),
                                    asio::use_awaitable);
}

}  // namespace modeld::fetch
