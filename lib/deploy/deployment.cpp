#include "deploy/deployment.hpp"

#include <chrono>

namespace modeld::deploy {
namespace {

// Seconds from `from` to `to` (ns since the epoch); 0 when negative.
double span_s(std::int64_t from, std::int64_t to) { return to > from ? static_cast<double>(to - from) / 1e9 : 0.0; }

}  // namespace

std::int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<SwitchReport> switch_report_of(const SwitchMarks& m) {
  if (m.start_requested_ns == 0 || m.ready_ns == 0) return std::nullopt;
  const bool stopped = m.stop_requested_ns != 0;
  const auto begin = stopped ? m.stop_requested_ns : m.start_requested_ns;
  // Without a stop-done mark (the old service was found stopped after a restart), the stop ends
  // where the launch would begin: the whole gap is the stop's.
  const auto stop_done = !stopped ? m.start_requested_ns : m.stop_done_ns ? m.stop_done_ns : m.start_requested_ns;
  const auto port = m.port_ns ? m.port_ns : m.ready_ns;
  SwitchReport r;
  r.downtime_s = span_s(begin, m.ready_ns);
  r.stop_s = span_s(begin, stop_done);
  r.launch_s = span_s(stop_done, m.start_requested_ns);
  r.start_to_port_s = span_s(m.start_requested_ns, port);
  r.port_to_ready_s = span_s(port, m.ready_ns);
  return r;
}

}  // namespace modeld::deploy
