// The download engine. One coroutine per file slot (a "worker") takes files from a shared queue;
// each file goes through FileTask: open (or continue) its partial file, download the missing
// bytes with Range, write and hash them on the disk pool in large blocks, then check size and
// digest and give the file its final name. Retries follow hub-protocol.md "Retries".

#include "fetch/fetch.hpp"

#include "fetch/partial.hpp"
#include "sys/log.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"
#include "verify/hash.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <deque>
#include <memory>
#include <optional>
#include <random>

namespace modeld::fetch {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using asio::awaitable;

namespace {

bool retryable(Errc c) { return c == Errc::network_error || c == Errc::timeout || c == Errc::hub_unavailable; }

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
  if (prefix.starts_with("version https://git-lfs")) return "an LFS pointer file";
  if (prefix.starts_with("<")) return "an HTML page";
  return "";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const char* kind_name(verify::HashKind k) { return k == verify::HashKind::sha256 ? "sha256" : "git blob sha1"; }

// A token bucket shared by all workers: each block is paid for before it is buffered; a worker
// that overdraws waits until the debt is repaid, which throttles its socket reads (TCP
// back-pressure) and so the whole run to max_bytes_per_s.
class RateLimiter {
 public:
  explicit RateLimiter(std::uint64_t bytes_per_s) : rate_(static_cast<double>(bytes_per_s)) {}

  awaitable<void> acquire(std::size_t n) {
    if (rate_ <= 0) co_return;
    auto now = Clock::now();
    tokens_ = std::min(tokens_ + std::chrono::duration<double>(now - last_).count() * rate_, rate_);
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

// Progress counters plus the 5 s moving average of the download rate and the report throttle.
class ProgressTracker {
 public:
  ProgressTracker(std::function<void(const Progress&)> cb, std::chrono::milliseconds interval)
      : cb_(std::move(cb)), interval_(interval) {
    samples_.emplace_back(Clock::now(), 0);
  }

  Progress& counters() { return p_; }

  // `n` bytes arrived from the network (counted in bytes_done by the caller).
  void downloaded(std::uint64_t n) {
    downloaded_ += n;
    report(false);
  }

  // Calls the callback when the interval has passed since the last call, or when `force`.
  void report(bool force) {
    auto now = Clock::now();
    if (now - samples_.back().first >= std::chrono::milliseconds(200)) samples_.emplace_back(now, downloaded_);
    while (samples_.size() > 2 && now - samples_[1].first >= window_) samples_.pop_front();
    double dt = std::chrono::duration<double>(now - samples_.front().first).count();
    // Under a second of samples gives wild rates (and ETAs of hours): report none until then.
    if (dt >= 1.0) p_.rate_bytes_per_s = static_cast<double>(downloaded_ - samples_.front().second) / dt;
    if (!cb_) return;
    if (!force && reported_ && now - last_report_ < interval_) return;
    reported_ = true;
    last_report_ = now;
    cb_(p_);
  }

 private:
  static constexpr auto window_ = std::chrono::seconds(5);
  std::function<void(const Progress&)> cb_;
  std::chrono::milliseconds interval_;
  Progress p_;
  std::uint64_t downloaded_ = 0;
  std::deque<std::pair<Clock::time_point, std::uint64_t>> samples_;
  Clock::time_point last_report_{};
  bool reported_ = false;
};

// What all workers of one run share; lives in the run's coroutine frame, which outlives them.
struct RunState {
  RunState(hub::Hub& h, http::Client& c, asio::thread_pool& p, const Options& o,
           const std::vector<hub::RepoFile>& f, std::function<void(const Progress&)> cb)
      : hub(h),
        client(c),
        pool(p),
        options(o),
        // One write block per file in flight, ~32 MiB in all (fetch.hpp).
        block_size(std::clamp<std::size_t>((32u << 20) / std::max(1u, o.parallel_files), 256u << 10, 4u << 20)),
        limiter(o.max_bytes_per_s),
        progress(std::move(cb), o.progress_interval),
        files(f),
        results(f.size()) {}

  hub::Hub& hub;
  http::Client& client;
  asio::thread_pool& pool;
  const Options& options;
  std::size_t block_size;
  RateLimiter limiter;
  ProgressTracker progress;
  std::mt19937 rng{std::random_device{}()};

  const std::vector<hub::RepoFile>& files;
  std::size_t next = 0;
  std::vector<std::optional<Fetched>> results;
  std::optional<Error> first_error;
  std::vector<std::unique_ptr<asio::cancellation_signal>> signals;

  // Records the first failure and cancels every other worker; they keep their partials.
  void fail(std::size_t worker, Error e) {
    if (first_error) return;
    first_error = std::move(e);
    for (std::size_t i = 0; i < signals.size(); ++i)
      if (i != worker) signals[i]->emit(asio::cancellation_type::terminal);
  }
};

// One file: its partial, hasher and the state of the current attempt.
class FileTask {
 public:
  FileTask(RunState& s, const hub::RepoFile& f)
      : s_(s),
        file_(f),
        kind_(f.is_lfs() ? verify::HashKind::sha256 : verify::HashKind::git_sha1),
        expected_(lower(f.is_lfs() ? *f.lfs_sha256 : f.blob_id)),
        part_(s.options.dest_dir, Sidecar{s.options.commit, f.path, f.size, kind_, expected_}) {
    buf_.reserve(s_.block_size);
  }

  ~FileTask() { part_.close(); }

  awaitable<Result<Fetched>> run() {
    if (auto r = co_await open(); !r) co_return r.error();
    unsigned attempt = 0;
    bool restarted = false;
    for (;;) {
      ++attempt;
      if (on_disk_ < file_.size) {
        auto r = co_await download();
        if (!r) {
          Error e = r.error();
          auto cs = co_await asio::this_coro::cancellation_state;
          if (e.code == Errc::cancelled || is_cancelled(cs.cancelled()))
            co_return make_error(Errc::cancelled, fmt::format("downloading {}: cancelled", file_.path));
          if (range_416_ && !restarted) {
            // The server has fewer bytes than the partial claims to continue from: start over once.
            restarted = true;
            --attempt;
            co_await discard_and_reopen();
            continue;
          }
          if (!retryable(e.code)) {
            // A partial without a byte in it is worth nothing to a later run.
            if (discard_ || on_disk_ == 0) co_await discard();
            co_return e;
          }
          if (discard_) co_await discard_and_reopen();
          if (attempt >= s_.options.max_attempts) {
            if (on_disk_ == 0) co_await discard();
            e.message += fmt::format(" (after {} attempts)", attempt);
            co_return e;
          }
          auto delay = backoff(attempt);
          sys::logf(sys::Level::warning, sys::Fields{.phase = "downloading", .extra = {{"MODELD_FILE", file_.path}}},
                    "{}; retrying in {:.1f} s (attempt {} of {})", e.message,
                    std::chrono::duration<double>(delay).count(), attempt + 1, s_.options.max_attempts);
          asio::steady_timer timer(co_await asio::this_coro::executor);
          timer.expires_after(delay);
          co_await timer.async_wait(asio::use_awaitable);
          continue;
        }
      }
      co_return co_await finish();
    }
  }

 private:
  // Opens the partial; bytes kept from an earlier run are re-hashed from disk (never downloaded
  // again), a block at a time so a cancellation is noticed between blocks.
  awaitable<Result<void>> open() {
    auto opened = co_await util::on_pool<Result<std::uint64_t>>(s_.pool, [this] { return part_.open(); });
    if (!opened) co_return opened.error();
    hasher_.emplace(kind_, file_.size);
    prefix_.clear();
    on_disk_ = 0;
    std::uint64_t have = *opened;
    // The write buffer (empty now) doubles as the read block, so re-hashing stays in the budget.
    std::vector<char>& block = buf_;
    block.resize(s_.block_size);
    while (on_disk_ < have) {
      auto n = co_await util::on_pool<Result<std::size_t>>(s_.pool, [&]() -> Result<std::size_t> {
        auto want = std::min<std::uint64_t>(block.size(), have - on_disk_);
        auto r = part_.read_at(on_disk_, std::span<char>(block.data(), want));
        if (r && *r > 0) hasher_->update(std::span<const char>(block.data(), *r));
        return r;
      });
      if (!n) {
        block.clear();
        co_return n.error();
      }
      if (*n == 0) break;  // shorter than fstat said: continue from what is there
      note_prefix(std::span<const char>(block.data(), *n));
      on_disk_ += *n;
    }
    block.clear();
    counted_ = on_disk_;
    s_.progress.counters().bytes_done += on_disk_;
    co_return Result<void>{};
  }

  awaitable<void> discard() {
    co_await util::on_pool<int>(s_.pool, [this] {
      part_.discard();
      return 0;
    });
  }

  awaitable<void> discard_and_reopen() {
    co_await discard();
    reset_to_zero();
    s_.progress.counters().bytes_done -= counted_;
    counted_ = 0;
    discard_ = false;
    if (auto r = co_await open(); !r) discard_error_ = r.error();
  }

  // Forgets the bytes received so far (the partial is cut at the next write).
  void reset_to_zero() {
    hasher_.emplace(kind_, file_.size);
    on_disk_ = 0;
    buf_.clear();
    prefix_.clear();
    truncate_pending_ = true;
  }

  std::chrono::milliseconds backoff(unsigned attempt) {
    auto base = s_.options.backoff_base;
    auto delay = base * (1u << std::min(attempt - 1, 3u));  // 1, 2, 4, 8, 8, ...
    std::uniform_real_distribution<double> jitter(0.75, 1.25);
    auto ms = std::chrono::milliseconds(static_cast<std::int64_t>(static_cast<double>(delay.count()) * jitter(s_.rng)));
    if (retry_after_) ms = std::max<std::chrono::milliseconds>(ms, *retry_after_);
    return ms;
  }

  // One request for the missing bytes; the received bytes are on disk when it returns.
  awaitable<Result<void>> download() {
    if (discard_error_) co_return *discard_error_;
    range_416_ = false;
    retry_after_.reset();
    auto url = s_.hub.resolve_url(s_.options.repo, s_.options.commit, file_.path);
    if (!url) co_return url.error();
    http::Request req;
    req.url = *url;
    request_offset_ = on_disk_;
    if (on_disk_ > 0) req.headers.add("Range", fmt::format("bytes={}-", on_disk_));

    http::BodySink sink;
    sink.on_head = [this](const http::ResponseHead& h) { return on_head(h); };
    sink.on_data = [this](std::span<const char> d) { return on_data(d); };
    Result<http::ResponseHead> r = make_error(Errc::internal, "no answer");
    try {
      r = co_await s_.client.stream(std::move(req), std::move(sink));
    } catch (const boost::system::system_error& e) {
      if (e.code() != asio::error::operation_aborted) throw;
      r = make_error(Errc::cancelled, fmt::format("downloading {}: cancelled", file_.path));
    }
    // (GCC 12 miscompiles co_await inside || and ?:, hence the separate statements.)
    auto cs = co_await asio::this_coro::cancellation_state;
    bool cancelled = is_cancelled(cs.cancelled()) || (!r && r.error().code == Errc::cancelled);
    if (cancelled) {
      // Keep what arrived: write the buffered block before giving up. The cancellation state is
      // reset so this one short pool job can be awaited; the caller still returns cancelled.
      co_await asio::this_coro::reset_cancellation_state();
      if (!discard_) (void)co_await flush();
      co_return make_error(Errc::cancelled, fmt::format("downloading {}: cancelled", file_.path));
    }
    if (!discard_) {
      if (auto f = co_await flush(); !f) co_return f.error();
    }
    if (!r) co_return r.error();
    if (on_disk_ != file_.size) {
      // The server ended its answer normally but it is shorter than the listing: the bytes are
      // not the file (the client reports a connection cut short as network_error instead).
      discard_ = true;
      std::string what = describe_content(prefix_);
      co_return make_error(Errc::size_mismatch,
                           fmt::format("{}: the server's answer ended after {} of {} bytes{}", file_.path, on_disk_,
                                       file_.size, what.empty() ? "" : "; it is " + what));
    }
    co_return Result<void>{};
  }

  Result<void> on_head(const http::ResponseHead& h) {
    std::string ctype = h.headers.get("Content-Type").value_or("no Content-Type");
    if (h.status == 416) {
      // Never asked with the whole file on disk (that goes straight to verification), so the
      // server has fewer bytes than the partial: run() starts over once.
      auto cr = h.headers.get("Content-Range").value_or("");
      range_416_ = true;
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: the server answered 416 (range not satisfiable) to bytes={}- ({})",
                                    file_.path, request_offset_, cr.empty() ? "no Content-Range" : cr));
    }
    if (h.status < 200 || h.status >= 300) {
      if (auto ra = h.headers.get("Retry-After")) {
        if (auto secs = parse_u64(*ra)) retry_after_ = std::chrono::seconds(std::min<std::uint64_t>(*secs, 300));
      }
      return hub::Hub::error_from_response(h, fmt::format("downloading {}", file_.path));
    }
    std::uint64_t start = 0;
    if (h.status == 206) {
      auto text = h.headers.get("Content-Range");
      auto cr = text ? parse_content_range(*text) : std::nullopt;
      if (!cr || cr->first != request_offset_)
        return make_error(Errc::hub_bad_response,
                          fmt::format("{}: the server answered 206 with Content-Range \"{}\" to bytes={}-",
                                      file_.path, text.value_or(""), request_offset_));
      if (cr->total && *cr->total != file_.size)
        return make_error(Errc::size_mismatch, fmt::format("{}: the server has {} bytes ({}) where the listing says {}",
                                                           file_.path, *cr->total, ctype, file_.size));
      start = cr->first;
    } else if (h.status != 200) {
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: unexpected status {} to a download", file_.path, h.status));
    }
    std::uint64_t expected = file_.size - start;
    if (h.content_length && *h.content_length != expected)
      return make_error(Errc::size_mismatch,
                        fmt::format("{}: expected {} bytes but the server sent {} bytes of {} (status {})",
                                    file_.path, expected, *h.content_length, ctype, h.status));
    if (start != on_disk_) {
      // A 200 to a Range request: the server ignored the range and sends the file from 0.
      s_.progress.counters().bytes_done -= counted_;
      counted_ = 0;
      reset_to_zero();
    }
    return {};
  }

  awaitable<Result<void>> on_data(std::span<const char> data) {
    if (on_disk_ + buf_.size() + data.size() > file_.size) {
      discard_ = true;
      co_return make_error(Errc::size_mismatch,
                           fmt::format("{}: the server sent more than the listed {} bytes", file_.path, file_.size));
    }
    co_await s_.limiter.acquire(data.size());
    if (on_disk_ + buf_.size() < 64) note_prefix(data);
    s_.progress.counters().bytes_done += data.size();
    counted_ += data.size();
    s_.progress.downloaded(data.size());
    while (!data.empty()) {
      auto take = std::min(data.size(), s_.block_size - buf_.size());
      buf_.insert(buf_.end(), data.begin(), data.begin() + static_cast<std::ptrdiff_t>(take));
      data = data.subspan(take);
      if (buf_.size() == s_.block_size) {
        if (auto r = co_await flush(); !r) co_return r.error();
      }
    }
    co_return Result<void>{};
  }

  // Writes the buffered block at the end of the partial and hashes it, on the pool.
  awaitable<Result<void>> flush() {
    if (buf_.empty() && !truncate_pending_) co_return Result<void>{};
    auto r = co_await util::on_pool<Result<void>>(s_.pool, [this]() -> Result<void> {
      if (truncate_pending_) {
        if (auto t = part_.truncate(0); !t) return t;
      }
      if (auto w = part_.write_at(on_disk_, buf_); !w) return w;
      hasher_->update(std::span<const char>(buf_.data(), buf_.size()));
      return {};
    });
    if (!r) co_return r.error();
    truncate_pending_ = false;
    on_disk_ += buf_.size();
    buf_.clear();
    co_return Result<void>{};
  }

  // All bytes are on disk: fsync, compare with the listing, then promote or discard.
  awaitable<Result<Fetched>> finish() {
    if (auto r = co_await flush(); !r) co_return r.error();
    if (auto r = co_await util::on_pool<Result<void>>(s_.pool, [this] { return part_.sync(); }); !r) co_return r.error();
    std::string actual = hasher_->hex();
    hasher_.reset();
    if (actual != expected_) {
      co_await discard();  // these bytes can never become the file
      std::string what = describe_content(prefix_);
      co_return make_error(Errc::checksum_mismatch,
                           fmt::format("{}: {} is {} but the listing says {}{}", file_.path, kind_name(kind_), actual,
                                       expected_, what.empty() ? "" : "; what arrived is " + what));
    }
    if (auto r = co_await util::on_pool<Result<void>>(s_.pool, [this] { return part_.promote(); }); !r) co_return r.error();
    ++s_.progress.counters().files_done;
    s_.progress.report(false);
    co_return Fetched{file_.path, file_.size, actual};
  }

  void note_prefix(std::span<const char> data) {
    if (prefix_.size() >= 64) return;
    prefix_.append(data.data(), std::min<std::size_t>(data.size(), 64 - prefix_.size()));
  }

  RunState& s_;
  const hub::RepoFile& file_;
  verify::HashKind kind_;
  std::string expected_;
  PartialFile part_;
  std::optional<verify::Hasher> hasher_;
  std::uint64_t on_disk_ = 0;  // bytes written to the partial and fed to the hasher
  std::vector<char> buf_;      // bytes received after on_disk_, not yet written
  std::string prefix_;         // the file's first bytes, to say what arrived when it is wrong
  std::uint64_t counted_ = 0;  // this file's share of progress.bytes_done
  bool truncate_pending_ = false;
  bool discard_ = false;  // the bytes received are not the file: drop the partial
  std::optional<Error> discard_error_;
  // The current attempt.
  std::uint64_t request_offset_ = 0;
  bool range_416_ = false;
  std::optional<std::chrono::milliseconds> retry_after_;
};

awaitable<void> worker(RunState& s, std::size_t id) {
  while (!s.first_error && s.next < s.files.size()) {
    std::size_t i = s.next++;
    Result<Fetched> r = make_error(Errc::internal, "not run");
    try {
      FileTask task(s, s.files[i]);
      r = co_await task.run();
    } catch (const boost::system::system_error& e) {
      // After a cancellation every await throws operation_aborted (asio's throw_if_cancelled).
      if (e.code() == asio::error::operation_aborted)
        r = make_error(Errc::cancelled, fmt::format("downloading {}: cancelled", s.files[i].path));
      else
        r = make_error(Errc::internal, fmt::format("downloading {}: {}", s.files[i].path, e.what()));
    } catch (const std::exception& e) {
      r = make_error(Errc::internal, fmt::format("downloading {}: {}", s.files[i].path, e.what()));
    }
    if (!r) {
      s.fail(id, r.error());
      co_return;
    }
    s.results[i] = std::move(*r);
  }
}

awaitable<Result<std::vector<Fetched>>> run_all(hub::Hub& hub, http::Client& client, asio::thread_pool& pool,
                                                const Options& options, std::vector<hub::RepoFile> files,
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
  s.progress.counters().files_total = static_cast<unsigned>(files.size());
  for (const auto& f : files) s.progress.counters().bytes_total += f.size;

  auto ex = co_await asio::this_coro::executor;
  std::size_t n = std::min<std::size_t>(std::max(1u, options.parallel_files), files.size());
  for (std::size_t i = 0; i < n; ++i) s.signals.push_back(std::make_unique<asio::cancellation_signal>());
  asio::steady_timer all_done(ex, asio::steady_timer::time_point::max());
  std::size_t running = n;
  for (std::size_t i = 0; i < n; ++i) {
    asio::co_spawn(ex, worker(s, i),
                   asio::bind_cancellation_slot(s.signals[i]->slot(), [&, i](std::exception_ptr e) {
                     if (e) s.fail(i, make_error(Errc::internal, "a download worker failed unexpectedly"));
                     if (--running == 0) all_done.cancel();
                   }));
  }
  bool forwarded = false;
  while (running > 0) {
    co_await all_done.async_wait(asio::as_tuple(asio::use_awaitable));
    auto cs = co_await asio::this_coro::cancellation_state;
    if (running > 0 && !forwarded && is_cancelled(cs.cancelled())) {
      forwarded = true;
      for (auto& sig : s.signals) sig->emit(asio::cancellation_type::terminal);
    }
  }

  s.progress.report(true);
  if (s.first_error) co_return *s.first_error;
  std::vector<Fetched> out;
  out.reserve(files.size());
  for (auto& r : s.results) out.push_back(std::move(*r));
  co_return out;
}

}  // namespace

Fetcher::Fetcher(hub::Hub& hub, http::Client& client, asio::thread_pool& disk_pool, Options options)
    : hub_(hub), client_(client), pool_(disk_pool), options_(std::move(options)) {}

awaitable<Result<std::vector<Fetched>>> Fetcher::run(std::vector<hub::RepoFile> files,
                                                     std::function<void(const Progress&)> on_progress) {
  // A child coroutine: the caller's cancellation reaches it through co_spawn, and its own
  // cancellation settings stay its own.
  auto ex = co_await asio::this_coro::executor;
  co_return co_await asio::co_spawn(ex,
                                    run_all(hub_, client_, pool_, options_, std::move(files), std::move(on_progress)),
                                    asio::use_awaitable);
}

}  // namespace modeld::fetch
