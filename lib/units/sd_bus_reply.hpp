#pragma once
// The parts of the systemd backend (systemd.cpp) that read systemd's answers, apart from the bus
// calls that fetch them, so that they are tested on messages built without a bus daemon.

#include "units/service_manager.hpp"

#include <systemd/sd-bus.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::units::detail {

/// unit_failed "UNIT: WHAT: why", why being the bus error's message or else strerror(-r).
Error bus_error(const std::string& unit, std::string_view what, int r, const sd_bus_error& e);

/// What a Manager call on `unit` answered (`r`, `e`): success for r >= 0, and for systemd's
/// NoSuchUnit when `not_loaded_ok` (nothing to stop or reset); else bus_error() naming `method`.
Result<void> manager_call_result(const std::string& unit, const char* method, int r, const sd_bus_error& e,
                                 bool not_loaded_ok);

/// The PIDs of GetUnitProcesses' reply (a(sus): control group, PID, command line), in its order;
/// unit_failed "UNIT: GetUnitProcesses reply: ..." when the reply is not of that type.
Result<std::vector<std::uint32_t>> read_unit_processes(sd_bus_message* reply, const std::string& unit);

/// The names of the units in ListUnitsByPatterns' reply (a(ssssssouso): name, description, load,
/// active and sub state, followed unit, object path, job id, type and path) whose active state
/// is up (is_up), in its order; unit_failed "WHAT: ListUnitsByPatterns reply: ..." when the reply
/// is not of that type.
Result<std::vector<std::string>> read_units_up(sd_bus_message* reply, const std::string& what);

/// The InvocationID property's reply (ay) as 32 lowercase hex digits; "" for the null ID (a unit
/// that never ran) and for a reply that is not 16 bytes.
std::string read_invocation_id(sd_bus_message* reply);

/// The object path of LoadUnit's reply (o); unit_failed "UNIT: LoadUnit reply: why" when the
/// reply is not one.
Result<std::string> read_unit_path(sd_bus_message* reply, const std::string& unit);

/// Fetches property `name` of interface `iface` of the unit's object (a Properties.Get call):
/// r >= 0 with its reply (the value in a variant) in `*reply`, which the caller then owns; else
/// r < 0 (an errno) with `*error` set when the bus said why.
using PropertyGetter =
    std::function<int(const char* iface, const char* name, sd_bus_error* error, sd_bus_message** reply)>;

/// The status of `unit` from its properties, fetched with `get` one at a time in this order:
/// LoadState, ActiveState, SubState (org.freedesktop.systemd1.Unit); for a loaded ".service",
/// ExecMainPID (u), ExecMainStatus (i) and Result (s) of org.freedesktop.systemd1.Service; for a
/// loaded unit, InvocationID (ay), best effort ("" when it cannot be read). A unit without a unit
/// file reads as not loaded. unit_failed "UNIT: PROPERTY: why" for the first property that cannot
/// be fetched or whose value is of another type (nothing after it is fetched). Blocks as `get` does.
Result<UnitStatus> read_unit_status(const std::string& unit, const PropertyGetter& get);

}  // namespace modeld::units::detail
