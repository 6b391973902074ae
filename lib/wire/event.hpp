#pragma once
// The events of a deployment as fields, and the data of their SSE frames on GET /v1/events
// (interface.md "Control API", events).

#include "wire/record.hpp"
#include "wire/status.hpp"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace modeld::wire {

/// What an Event reports: a deployment entered a phase, made download progress or changed
/// state (the SSE stream's "phase", "progress" and "state"), or the model watcher's record of the
/// active model changed ("watcher": not sent on the SSE stream, which the contract fixes).
enum class EventKind { phase, progress, state, watcher };

/// The SSE event name of `k`: "phase", "progress", "state" or "watcher"; pure.
std::string_view to_string(EventKind k) noexcept;
/// The kind named `s` by to_string(); nullopt when unknown (a newer daemon's event).
std::optional<EventKind> event_kind_from_string(std::string_view s) noexcept;

/// One event of the Deployer, as fields; JSON is made only where it leaves the daemon (to_json).
struct Event {
  EventKind kind = EventKind::phase;
  std::string id;     ///< the deployment's id; empty for watcher events
  std::string model;  ///< the deployment's model, or the watched model
  /// phase: the phase begun; progress: the phase the progress belongs to; state: the phase the
  /// deployment is in (or ended in).
  Phase phase = Phase::planning;
  State state = State::running;           ///< state events: the new state
  std::optional<Error> error;             ///< state events: why it failed, was cancelled or rolled back
  Progress progress;                      ///< progress events: the download's progress
  std::optional<WarmReport> warm;         ///< progress events of the warming phase: its figures
  std::optional<WatchdogStatus> watcher;  ///< watcher events: the model watcher's record now
};

/// The SSE stream's data of a phase, progress or state event, as the contract fixes it:
/// {id, model, phase}, {id, model, progress} (plus "phase" and "warm" in the warming phase) or
/// {id, model, state, phase, error}; a watcher event gives {model, watchdog} (the record as GET
/// /v1/status's "watchdog" has it, never sent). Pure.
nlohmann::json to_json(const Event& e);
/// Reads the data of an event of kind `kind` as to_json() writes it (a progress event without
/// "phase" is the download's, read as Phase::downloading; a state event's "error" may be
/// missing); bad_request "event: ..." naming what is missing, mistyped or unknown.
Result<Event> event_from_json(EventKind kind, const nlohmann::json& j);

}  // namespace modeld::wire
