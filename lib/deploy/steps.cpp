#include "deploy/steps.hpp"
#include "deploy/phase_table.hpp"

namespace modeld::deploy {

Phase phase_of(Step s) noexcept { return row_of(s).phase; }

std::string_view to_string(Step s) noexcept { return row_of(s).name; }

namespace {

PlannedStep planned(Step s) { return {s, row_of(s).touches_service}; }

}  // namespace

std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first) {
  // A stop takes a model out of service: its one step stops the service and waits until nothing is left.
  if (kind == Kind::stop) return {planned(Step::stopping_old)};
  // A pull stages a revision ahead: it never stops, starts or probes a service.
  if (kind == Kind::pull)
    return {planned(Step::planning), planned(Step::freeing_disk), planned(Step::downloading), planned(Step::verifying)};
  // Planning, freeing_disk, downloading and verifying leave the model in service alone (a large
  // download takes hours while it keeps serving and being watched); so does cleanup, which spares
  // the revision in service; warming only reads the new revision's files into the page cache.
  std::vector<PlannedStep> steps{planned(Step::planning)};
  if (downtime_first) steps.push_back(planned(Step::stopping_old));
  for (Step s : {Step::freeing_disk, Step::downloading, Step::verifying, Step::warming}) steps.push_back(planned(s));
  if (!downtime_first) steps.push_back(planned(Step::stopping_old));
  for (Step s : {Step::launching, Step::health_checking, Step::cleanup, Step::benchmarking}) steps.push_back(planned(s));
  return steps;
}

}  // namespace modeld::deploy
