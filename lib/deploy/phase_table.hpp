#pragma once
// The phase table: one row per step a record may run, each naming its phase, its STATUS= verb,
// whether it touches the service in service, how it runs (its phase's run_* and the application
// of the result to the run, for RecordRun to call) and whether an interrupted record continues
// from it. The rows of the preparation and the end (planning, freeing_disk, downloading,
// verifying, warming, cleanup, benchmarking) are in phase_table.cpp; those of the switch come
// from its strategy (switch_strategy.hpp; restart_switch.cpp for stopping_old, launching,
// health_checking and rolling_back). The order of a plan is steps.cpp's and the strategy's.
// Private to lib/deploy; lookups never block.

#include "deploy/deployment.hpp"
#include "deploy/steps.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>

#include <span>
#include <string_view>

namespace modeld::deploy {

class RecordRun;

/// One step of the table.
struct PhaseRow {
  Step step;
  Phase phase;             ///< what the API shows while it runs
  std::string_view name;   ///< the journal's name of the step ("cleanup")
  std::string_view verb;   ///< STATUS= before the model ("warming the page cache for"); empty: its phase's row says it
  bool touches_service;    ///< stops, starts or probes a model service: the model watchers pause for it
  bool shows_own_phase;    ///< entering it records and announces its phase (cleanup shows health_checking's)
  /// Runs the step on `run` (entered already) and applies its result; an error ends the record
  /// or rolls it back.
  boost::asio::awaitable<Result<void>> (*run)(RecordRun& run);
  /// Whether an interrupted record `d` continues from this step (nullptr: never).
  bool (*resumes_here)(const Deployment& d);
};

/// The row of step `s` among the preparation's, the end's and every built-in strategy's (the
/// first that has it); every Step has one.
const PhaseRow& row_of(Step s);

/// The STATUS= verb of phase `p` (the row showing it as its own), e.g. "downloading".
std::string_view verb_of(Phase p);

/// The step an interrupted record `d` switching by restart continues from: rolling_back when its
/// row claims it, else the last step of a stop's plan (a stop) or a deploy's (a deploy or a pull)
/// whose row claims it; planning when none does. (resume_step of switch_strategy.hpp for another strategy.)
Step resume_step(const Deployment& d);

}  // namespace modeld::deploy
