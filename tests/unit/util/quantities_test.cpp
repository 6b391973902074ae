#include "util/quantities.hpp"

#include <catch2/catch.hpp>

using namespace modeld::util;
using namespace std::chrono_literals;

TEST_CASE("sizes accept binary and decimal units as the contract writes them") {
  CHECK(parse_size("20GiB") == 20ull << 30);
  CHECK(parse_size("500MB") == 500'000'000ull);
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("1.5 TB") == 1'500'000'000'000ull);
  CHECK(parse_size("4096") == 4096u);
}

TEST_CASE("sizes with unknown units or no number are refused") {
  CHECK_FALSE(parse_size("20GB!"));
  CHECK_FALSE(parse_size("GiB"));
  CHECK_FALSE(parse_size("-5MB"));
  CHECK_FALSE(parse_size("20 parsecs"));
}

TEST_CASE("durations accept seconds, minutes, hours and combinations") {
  CHECK(parse_duration("90s") == 90s);
  CHECK(parse_duration("60m") == 60min);
  CHECK(parse_duration("2h") == 2h);
  CHECK(parse_duration("1h30m") == 90min);
  CHECK(parse_duration("250ms") == 250ms);
  CHECK(parse_duration("15") == 15s);
}

TEST_CASE("durations with unknown units are refused") {
  CHECK_FALSE(parse_duration("5 fortnights"));
  CHECK_FALSE(parse_duration(""));
  CHECK_FALSE(parse_duration("m"));
}

TEST_CASE("byte counts print with decimal units") {
  CHECK(format_bytes(12) == "12 B");
  CHECK(format_bytes(547'000'000'000ull) == "547 GB");
  CHECK(format_bytes(54'700'000'000ull) == "54.7 GB");
  CHECK(format_bytes(1'234'000'000ull) == "1.2 GB");
  CHECK(format_bytes(99'960'000ull) == "100 MB");
}

TEST_CASE("sizes from a listing are added without wrapping") {
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  CHECK(checked_add(40, 4) == 44u);
  CHECK(!checked_add(1ull << 63, 1ull << 63));
  CHECK(!checked_add(max, 1));
  CHECK(add_bytes(max, 1) == max);
  CHECK(add_bytes(1ull << 63, 1ull << 63) == max);
  struct F { std::uint64_t size; };
  CHECK(total_size(std::vector<F>{{1ull << 63}, {1ull << 63}, {44}}) == max);
  CHECK(total_size(std::vector<F>{{max}, {1}}) == max);
  CHECK(total_size(std::vector<F>{{20}, {24}}) == 44u);
}

TEST_CASE("durations beyond 100 years are refused: a nanosecond deadline would overflow") {
  CHECK(parse_duration("36500d") == std::chrono::milliseconds(36500LL * 86'400'000));
  CHECK(!parse_duration("200000d"));
  CHECK(!parse_duration("10000000d"));
}

TEST_CASE("format_span shows tenths under a minute, minutes and seconds under an hour") {
  CHECK(format_span(4.04) == "4.0 s");
  CHECK(format_span(-1) == "0.0 s");
  CHECK(format_span(132.4) == "2 min 12 s");
  CHECK(format_span(3725) == "1 h 2 min");
}
