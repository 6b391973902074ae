#include "wire/switch_report.hpp"

#include <catch2/catch.hpp>

TEST_CASE("describe_switch names the outage and its parts in order") {
  CHECK(modeld::wire::describe_switch(132, 4, 1, 122, 5) ==
        "downtime 2 min 12 s: stop 4.0 s, launch 1.0 s, load 2 min 2 s, readiness 5.0 s");
}
