#include "util/throttle.hpp"

#include <catch2/catch.hpp>

using namespace modeld;
using namespace std::chrono_literals;

TEST_CASE("a log throttle lets one line through per period, with the count since the last") {
  util::LogThrottle t(10s);
  const auto t0 = util::LogThrottle::Clock::time_point{} + 1h;
  CHECK(t.count(t0) == std::optional<std::size_t>(1));
  CHECK_FALSE(t.count(t0 + 1s));
  CHECK_FALSE(t.count(t0 + 9s));
  CHECK(t.count(t0 + 10s) == std::optional<std::size_t>(3));
  CHECK_FALSE(t.count(t0 + 11s));
  CHECK(t.count(t0 + 60s) == std::optional<std::size_t>(2));
}
