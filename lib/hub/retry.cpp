#include "hub/retry.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace modeld::hub {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

bool retryable_status(unsigned status) { return status == 408 || status == 429 || (status >= 500 && status < 600); }

bool retryable(Errc code) { return code == Errc::network_error || code == Errc::timeout || code == Errc::hub_unavailable; }

std::optional<std::chrono::seconds> retry_after(const http::ResponseHead& head) {
  auto v = head.headers.get("Retry-After");
  if (!v) return std::nullopt;
  auto s = http::parse_retry_after(*v, std::chrono::system_clock::now());
  if (!s) return std::nullopt;
  return std::min<std::chrono::seconds>(*s, std::chrono::hours(24));
}

std::chrono::nanoseconds RetryPolicy::backoff(unsigned failures, std::mt19937& rng) const {
  const auto base = backoff_base * (1u << std::min(std::max(failures, 1u) - 1, 3u));  // 1, 2, 4, 8, 8 ...
  std::uniform_real_distribution<double> jitter(0.75, 1.25);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(base * jitter(rng));
}

Retrier::Retrier(RetryPolicy policy) : policy_(std::move(policy)) {}

unsigned Retrier::max_tries() const { return std::max(1u, policy_.max_tries); }

std::optional<std::chrono::milliseconds> Retrier::failed(std::optional<std::chrono::seconds> retry_after) {
  ++failures_;
  if (failures_ >= max_tries()) return std::nullopt;
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(policy_.backoff(failures_, rng_));
  if (retry_after)
    wait = std::max(wait, std::min<std::chrono::milliseconds>(*retry_after, policy_.max_retry_after));
  return wait;
}

RetryBudget::RetryBudget(RetryPolicy policy, unsigned budget, std::chrono::milliseconds max_wait)
    : policy_(std::move(policy)), budget_(budget), max_wait_(max_wait) {}

Result<RetryBudget::Clock::duration> RetryBudget::failed(const Error& e, Clock::time_point sent,
                                                         std::optional<std::chrono::seconds> retry_after) {
  auto give_up = [&](std::string why) {
    Error out = e;
    out.message += " (" + why + ")";
    return out;
  };
  const auto now = Clock::now();
  // A request sent before the current pause began failed for the reason that began it.
  const bool counted_already = sent < pause_began_ && !retry_after;
  if (!counted_already) ++failures_in_a_row_;
  if (failures_in_a_row_ > budget_)
    return give_up(fmt::format("gave up after {} failures in a row with no data from any connection",
                               failures_in_a_row_));
  if (retry_after && *retry_after > max_wait_ - waited_)
    return give_up(fmt::format("the server asks to retry after {} s, longer than the {:.0f} s of retry wait left",
                               retry_after->count(), seconds(max_wait_ - waited_)));
  Clock::duration delay{};
  if (!counted_already) delay = policy_.backoff(failures_in_a_row_, rng_);
  if (retry_after) delay = std::max<Clock::duration>(delay, *retry_after);
  const auto until = now + delay;
  // (A failure already counted adds no pause of its own: it waits out the current one.)
  if (delay > Clock::duration{} && until > paused_until_) {
    waited_ += until - std::max(now, paused_until_);
    if (paused_until_ < now) pause_began_ = now;
    paused_until_ = until;
  }
  if (waited_ > max_wait_)
    return give_up(fmt::format("waited {:.0f} s for retries in all, the limit is {:.0f} s", seconds(waited_),
                               seconds(max_wait_)));
  return std::max<Clock::duration>(paused_until_ - now, Clock::duration{});
}

}  // namespace modeld::hub
