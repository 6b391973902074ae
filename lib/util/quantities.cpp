#include "util/quantities.hpp"

#include "util/text.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace modeld::util {
namespace {

// Reads a non-negative decimal number (digits with an optional fraction) from the front of s.
std::optional<double> take_number(std::string_view& s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + i, v);
  if (ec != std::errc() || p != s.data() + i || !std::isfinite(v)) return std::nullopt;
  s.remove_prefix(i);
  return v;
}

}  // namespace

std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::string_view s = trim(text);
  auto num = take_number(s);
  if (!num) return std::nullopt;
  s = trim(s);
  struct Unit { std::string_view name; double factor; };
  static constexpr Unit units[] = {
      {"", 1}, {"b", 1},
      {"k", 1e3}, {"kb", 1e3}, {"m", 1e6}, {"mb", 1e6}, {"g", 1e9}, {"gb", 1e9}, {"t", 1e12}, {"tb", 1e12},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
  };
  for (const auto& u : units) {
    if (iequals(s, u.name)) {
      double bytes = *num * u.factor;
      if (bytes >= 18446744073709551615.0) return std::nullopt;
      return static_cast<std::uint64_t>(std::llround(bytes));
    }
  }
  return std::nullopt;
}

namespace {
constexpr double kMaxDurationMs = 100 * 365.25 * 86'400'000;
}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  std::string_view s = trim(text);
  if (s.empty()) return std::nullopt;
  double total_ms = 0;
  bool any = false;
  while (!s.empty()) {
    auto num = take_number(s);
    if (!num) return std::nullopt;
    std::size_t i = 0;
    while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
    std::string_view unit = s.substr(0, i);
    s.remove_prefix(i);
    s = trim(s);
    double factor;
    if (unit.empty() || unit == "s") factor = 1000;
    else if (unit == "ms") factor = 1;
    else if (unit == "m" || unit == "min") factor = 60'000;
    else if (unit == "h") factor = 3'600'000;
    else if (unit == "d") factor = 86'400'000;
    else return std::nullopt;
    if (unit.empty() && !s.empty()) return std::nullopt;  // "10 5m" is ambiguous
    total_ms += *num * factor;
    any = true;
  }
  // Timers count nanoseconds in 64 bits (292 years) from now: 100 years is the most that is safe.
  if (!any || total_ms > kMaxDurationMs) return std::nullopt;
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(total_ms)));
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* names[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1000 && i < 5) { v /= 1000; ++i; }
  if (i == 0) return fmt::format("{} B", bytes);
  // Three significant digits at most: "547 GB", "54.7 GB", "5.5 GB" (a trailing ".0" of a
  // 3-digit figure only makes status lines longer). Rounding may carry to 1000 ("999.96 MB"
  // reads "1000 MB"), which stays correct.
  if (v >= 99.95) return fmt::format("{:.0f} {}", v, names[i]);
  return fmt::format("{:.1f} {}", v, names[i]);
}

std::string format_rate(double bytes_per_s) {
  if (!(bytes_per_s > 0)) return "0 B/s";
  return format_bytes(static_cast<std::uint64_t>(bytes_per_s)) + "/s";
}

std::string format_duration(std::chrono::seconds d) {
  auto s = d.count();
  if (s < 0) s = 0;
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{} min", (s + 30) / 60);
  return fmt::format("{} h {} min", s / 3600, (s % 3600) / 60);
}

std::string format_seconds(std::chrono::milliseconds d) {
  return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
}

std::string format_span(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  if (seconds < 60) return format_seconds(std::chrono::milliseconds(std::llround(seconds * 1000)));
  const auto whole = std::llround(seconds);
  if (whole < 3600) return fmt::format("{} min {} s", whole / 60, whole % 60);
  return format_duration(std::chrono::seconds(whole));
}

std::string format_milliseconds(std::chrono::milliseconds d) { return fmt::format("{} ms", d.count()); }

}  // namespace modeld::util
