#pragma once
// The wire contract's words for a deployment's switch (interface.md "The switch's outage"), the
// one text the daemon's journal line and modelctl both print. The first piece of the stage that
// holds the API's own types and texts; it depends only on util.

#include <string>

namespace modeld::wire {

/// The outage of a switch for humans, its parts in seconds and in the order they happen, each
/// as util::format_span writes it: "downtime 2 min 12 s: stop 4.0 s, launch 1.0 s, load 2 min 2 s,
/// readiness 5.0 s". Pure; never fails.
std::string describe_switch(double downtime_s, double stop_s, double launch_s, double load_s, double readiness_s);

}  // namespace modeld::wire
