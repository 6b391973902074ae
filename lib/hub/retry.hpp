#pragma once
// The one retry policy of every Hub request (hub-protocol.md "Retries"): what is worth
// retrying, the backoff with jitter, Retry-After honoured; tries of one request (Retrier: the
// revision, listing and metadata reads) and the budget and pause one download run shares
// (RetryBudget: lib/fetch).

#include "http/client.hpp"
#include "util/error.hpp"

#include <chrono>
#include <optional>
#include <random>

namespace modeld::hub {

/// Whether an answer with HTTP `status` is worth another try: 408, 429 and 5xx.
bool retryable_status(unsigned status);

/// Whether a failure with `code` is worth another try: network_error, timeout, hub_unavailable.
bool retryable(Errc code);

/// The answer's Retry-After (seconds or an HTTP-date, RFC 9110 10.2.3) in seconds from now, at
/// most 24 h; nullopt when absent or unreadable.
std::optional<std::chrono::seconds> retry_after(const http::ResponseHead& head);

/// How Hub requests are retried: at most max_tries tries of one request; before try n+1 a
/// backoff of backoff_base doubled per failure up to 8x (1, 2, 4, 8, 8 s by default) times a
/// jitter in [0.75, 1.25], or the server's Retry-After (capped at max_retry_after) when longer.
struct RetryPolicy {
  unsigned max_tries = 5;                                        ///< tries of one request (0 counts as 1)
  std::chrono::milliseconds backoff_base{1000};                  ///< the first backoff (tests shorten it)
  std::chrono::milliseconds max_retry_after{std::chrono::seconds(30)};  ///< longest Retry-After honoured by one request

  /// The backoff before the next try after `failures` (>= 1) failures in a row, jitter drawn
  /// from `rng`; does not block.
  std::chrono::nanoseconds backoff(unsigned failures, std::mt19937& rng) const;
};

/// The tries of one request under a RetryPolicy. Not thread-safe; does not block.
class Retrier {
 public:
  /// Starts with no try made; `policy` is copied.
  explicit Retrier(RetryPolicy policy);

  /// Records a failed try whose answer said `retry_after` (nullopt: none, or no answer); the
  /// pause before the next try (the longer of the backoff and Retry-After capped at
  /// max_retry_after), or nullopt when max_tries are spent.
  std::optional<std::chrono::milliseconds> failed(std::optional<std::chrono::seconds> retry_after);

  /// Tries failed so far.
  unsigned failures() const { return failures_; }

  /// The most tries the policy allows (at least 1).
  unsigned max_tries() const;

 private:
  RetryPolicy policy_;
  unsigned failures_ = 0;
  std::mt19937 rng_{std::random_device{}()};
};

/// Retries shared by every request of one run (a deployment's download, hub-protocol.md
/// "Retries"): failures in a row with no byte anywhere against `budget`, one pause for all
/// requests (a failure of a request sent before the current pause began counts once with it),
/// and at most `max_wait` paused in all, a Retry-After longer than what is left failing at once.
/// Not thread-safe (the event loop's); does not block.
class RetryBudget {
 public:
  using Clock = std::chrono::steady_clock;

  /// Backoff per `policy` (its max_tries and max_retry_after are not used here).
  RetryBudget(RetryPolicy policy, unsigned budget, std::chrono::milliseconds max_wait);

  /// Records retryable failure `e` of a request sent at `sent` whose answer said `retry_after`;
  /// the pause left before any request may be sent again, or `e` with why the run gives up.
  Result<Clock::duration> failed(const Error& e, Clock::time_point sent, std::optional<std::chrono::seconds> retry_after);

  /// A byte arrived: failures in a row start again from 0.
  void progressed() { failures_in_a_row_ = 0; }

  /// Until when every request waits (the past when there is no pause).
  Clock::time_point paused_until() const { return paused_until_; }

 private:
  RetryPolicy policy_;
  unsigned budget_;
  std::chrono::milliseconds max_wait_;
  unsigned failures_in_a_row_ = 0;
  Clock::time_point paused_until_{};
  Clock::time_point pause_began_{};
  Clock::duration waited_{};
  std::mt19937 rng_{std::random_device{}()};
};

}  // namespace modeld::hub
