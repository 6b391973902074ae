#pragma once
// The switch as a seam. A switch strategy is one way of putting a deployment's new revision into
// service in place of what served: today's, restart_switch.cpp, stops the old service and starts
// the new one. A strategy supplies, as data:
// - whether it applies to a deployment and why (the journal after planning, and `plan`);
// - its steps, each a row of the phase table (the phase it shows, whether it touches the
//   service, so the model watchers pause for it, its resume rule and, in the row's code, its
//   crash points and its parts of the switch report);
// - its durable decision: from the moment `committed` holds, a failure, a cancel or a daemon
//   restart rolls back, and the run owns the services it touches;
// - its rollback step;
// - the strategy it falls back to, should it not apply, or should one of its rows give up in the
//   middle of a run (RecordRun::fall_back; the record keeps which one runs).
// serve.switch names the strategy to try. Private to lib/deploy; nothing here blocks or does I/O.

#include "config/config.hpp"
#include "deploy/deployment.hpp"
#include "deploy/phase_table.hpp"
#include "deploy/steps.hpp"

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

struct Services;

/// What a strategy reads to decide whether it applies: the record after planning (commit,
/// downtime_first, restart, the services it stops) and the model's configuration it started with.
struct SwitchQuery {
  const Deployment& record;
  const config::ModelConfig& model;
};

/// Whether a strategy applies, and why (or why not), in a sentence for the journal.
struct SwitchVerdict {
  bool applies = false;
  std::string why;
};

/// A strategy's steps in a deploy's plan: those that run right after planning (with
/// downtime_first) and those that run after warming; cleanup and benchmarking follow them.
struct SwitchSteps {
  std::vector<Step> after_planning;
  std::vector<Step> after_warming;
};

/// One way of switching; see the file's comment.
struct SwitchStrategy {
  std::string_view method;   ///< what the record and the journal call it ("restart")
  std::string_view setting;  ///< the serve.switch value that asks for it first ("restart")
  /// Whether it applies to the deployment `q` describes, and why.
  SwitchVerdict (*applies)(const SwitchQuery& q);
  /// Its steps, with or without downtime_first (a strategy that cannot run then does not apply).
  SwitchSteps (*steps)(bool downtime_first);
  /// The rows of its steps and of its rollback step.
  std::span<const PhaseRow> (*rows)();
  Step rollback;  ///< the step that brings back what served (its row is among rows())
  /// Whether record `d` has taken the strategy's durable decision (restart: old_stopped).
  bool (*committed)(const Deployment& d);
  /// The method of the strategy to run instead when it does not apply or gives up; empty: none.
  std::string_view fallback;
};

/// The restart strategy (restart_switch.cpp): stopping_old, launching, health_checking; rolling_back.
const SwitchStrategy& restart_switch();

/// Every strategy the daemon has, restart first.
std::span<const SwitchStrategy* const> builtin_switches();

/// The strategy of `method` among `services`' (Services::switch_strategies, else the built-in
/// ones); restart for an empty or unknown method (records written before strategies name none).
const SwitchStrategy& switch_named(const Services& services, std::string_view method);

/// The strategy chosen for a deployment and why.
struct SwitchChoice {
  const SwitchStrategy* strategy = nullptr;
  std::string why;
};

/// The strategy serve.switch asks for when it applies to `q`, else the first of its fallbacks
/// that does, with why the others did not; restart, which always applies, ends every chain.
SwitchChoice choose_switch(const Services& services, const SwitchQuery& q);

/// The row of step `s` for a run switching with `strategy`: the strategy's own, else the table's.
const PhaseRow& row_of(Step s, const SwitchStrategy& strategy);

/// The ordered steps of a deploy (or a pull, or a stop) switching with `strategy`; see plan_steps.
std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first, const SwitchStrategy& strategy);

/// The step an interrupted record `d` switching with `strategy` continues from; see resume_step.
Step resume_step(const Deployment& d, const SwitchStrategy& strategy);

}  // namespace modeld::deploy
