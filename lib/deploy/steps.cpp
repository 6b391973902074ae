#include "deploy/steps.hpp"
#include "deploy/phase_table.hpp"
#include "deploy/switch_strategy.hpp"

namespace modeld::deploy {

Phase phase_of(Step s) noexcept { return row_of(s).phase; }

std::string_view to_string(Step s) noexcept { return row_of(s).name; }

std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first) {
  return plan_steps(kind, downtime_first, restart_switch());
}

std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first, const SwitchStrategy& strategy) {
  auto planned = [&](Step s) { return PlannedStep{s, row_of(s, strategy).touches_service}; };
  // A stop takes a model out of service: its one step stops the service and waits until nothing is left.
  if (kind == Kind::stop) return {planned(Step::stopping_old)};
  // A pull stages a revision ahead: it never stops, starts or probes a service.
  if (kind == Kind::pull)
    return {planned(Step::planning), planned(Step::freeing_disk), planned(Step::downloading), planned(Step::verifying)};
  // Planning, freeing_disk, downloading and verifying leave the model in service alone (a large
  // download takes hours while it keeps serving and being watched); so does cleanup, which spares
  // the revision in service; warming only reads the new revision's files into the page cache.
  // The switch's steps are its strategy's: with downtime_first, part of them right after planning.
  const auto own = strategy.steps(downtime_first);
  std::vector<PlannedStep> steps{planned(Step::planning)};
  for (Step s : own.after_planning) steps.push_back(planned(s));
  for (Step s : {Step::freeing_disk, Step::downloading, Step::verifying, Step::warming}) steps.push_back(planned(s));
  for (Step s : own.after_warming) steps.push_back(planned(s));
  for (Step s : {Step::cleanup, Step::benchmarking}) steps.push_back(planned(s));
  return steps;
}

}  // namespace modeld::deploy
