#include "wire/switch_report.hpp"

#include "util/quantities.hpp"

#include <fmt/format.h>

namespace modeld::wire {

std::string describe_switch(double downtime_s, double stop_s, double launch_s, double load_s, double readiness_s) {
  return fmt::format("downtime {}: stop {}, launch {}, load {}, readiness {}", util::format_span(downtime_s),
                     util::format_span(stop_s), util::format_span(launch_s), util::format_span(load_s),
                     util::format_span(readiness_s));
}

}  // namespace modeld::wire
