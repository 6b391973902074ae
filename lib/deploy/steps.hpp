#pragma once
// The plan of a deployment as data: its ordered steps, each with whether it touches the service in
// service. Computed from the record (its kind and the order planning decided), so a restarted
// daemon derives the same plan. What each step is (its phase, name, flags, how it runs) is its row
// of the phase table (phase_table.hpp). No I/O.

#include "deploy/deployment.hpp"

#include <vector>

namespace modeld::deploy {

/// The steps a record may run; rolling_back is not a step of any plan but its alternative.
enum class Step {
  planning, freeing_disk, downloading, verifying, warming, stopping_old, launching, health_checking, cleanup,
  benchmarking, rolling_back
};

/// One step of a plan.
struct PlannedStep {
  Step step;
  bool touches_service;  ///< stops, starts or probes the model service: the model watcher pauses for it
};

/// The phase the API shows while `s` runs (its row's): its own, and health_checking for cleanup (no new phase name).
Phase phase_of(Step s) noexcept;

/// A name for the journal (its row's), e.g. "cleanup".
std::string_view to_string(Step s) noexcept;

/// The ordered steps of a deployment switching by restart, each touching the service as its row
/// says, of kind `kind`; with `downtime_first` (allow_downtime and a disk plan that evicts the
/// active model) stopping_old comes right after planning, so warming (after verifying) runs while
/// nothing serves. A pull is planning, freeing_disk, downloading and verifying, none touching the
/// service; a stop is stopping_old. (plan_steps of switch_strategy.hpp for another strategy.)
std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first);

}  // namespace modeld::deploy
