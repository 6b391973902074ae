#pragma once
// Parsing and printing of the sizes and durations used in the configuration and in messages.

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace modeld::util {

/// Parses a size such as "20GiB", "500MB", "1.5 TB", "4096" (bytes); binary units (KiB..TiB)
/// are powers of 1024, decimal ones (kB..TB) powers of 1000; returns nullopt on bad syntax or overflow.
std::optional<std::uint64_t> parse_size(std::string_view text);

/// Parses a duration such as "90s", "60m", "2h", "1h30m", "250ms", "2d"; a bare number is seconds;
/// returns nullopt on bad syntax, a negative value, or more than 100 years (a steady_clock
/// deadline in nanoseconds would overflow past about 292 years).
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

/// a + b in bytes, or nullopt when the sum does not fit in 64 bits (sizes from a listing are
/// untrusted: a wrapped sum once made 2^63 + 2^63 + 44 bytes plan as 44).
std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b);

/// a + b in bytes, saturating at UINT64_MAX instead of wrapping: a total that saturated never
/// fits a disk, so comparisons stay on the safe side.
constexpr std::uint64_t add_bytes(std::uint64_t a, std::uint64_t b) {
  return b > std::numeric_limits<std::uint64_t>::max() - a ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

/// The sum of the `size` members (bytes) of `items` (repository files, manifest entries),
/// saturating as add_bytes does.
template <class Range>
std::uint64_t total_size(const Range& items) {
  std::uint64_t total = 0;
  for (const auto& item : items) total = add_bytes(total, item.size);
  return total;
}

/// Formats a byte count for humans with decimal units as disk vendors do, three significant
/// digits at most: "547 GB", "54.7 GB", "12 B".
std::string format_bytes(std::uint64_t bytes);

/// Formats a rate in bytes per second for humans: "1.2 GB/s".
std::string format_rate(double bytes_per_s);

/// Formats a duration for humans: "4 min", "36 s", "2 h 5 min".
std::string format_duration(std::chrono::seconds d);

/// Formats a duration in seconds with one decimal, for short waits and measurements: "2.5 s".
std::string format_seconds(std::chrono::milliseconds d);

/// Formats a measured span in seconds for humans: "4.2 s" under a minute, "2 min 12 s" under an
/// hour, "1 h 5 min" beyond; a negative span reads as 0.
std::string format_span(double seconds);

/// Formats a duration as its exact milliseconds, as a setting holds it: "30000 ms".
std::string format_milliseconds(std::chrono::milliseconds d);

}  // namespace modeld::util
