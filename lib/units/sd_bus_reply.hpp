#pragma once
// The parts of the systemd backend (systemd.cpp) that read systemd's answers, apart from the bus
// calls that fetch them, so that they are tested on messages built without a bus daemon.

#include "units/service_manager.hpp"

#include <systemd/sd-bus.h>

#include <cstdint>
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

/// The InvocationID property's reply (ay) as 32 lowercase hex digits; "" for the null ID (a unit
/// that never ran) and for a reply that is not 16 bytes.
std::string read_invocation_id(sd_bus_message* reply);

}  // namespace modeld::units::detail
