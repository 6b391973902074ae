#include "deploy/steps.hpp"

namespace modeld::deploy {

Phase phase_of(Step s) noexcept {
  switch (s) {
    case Step::planning: return Phase::planning;
    case Step::freeing_disk: return Phase::freeing_disk;
    case Step::downloading: return Phase::downloading;
    case Step::verifying: return Phase::verifying;
    case Step::warming: return Phase::warming;
    case Step::stopping_old: return Phase::stopping_old;
    case Step::launching: return Phase::launching;
    case Step::health_checking: return Phase::health_checking;
    case Step::cleanup: return Phase::health_checking;
    case Step::benchmarking: return Phase::benchmarking;
  }
  return Phase::planning;
}

std::string_view to_string(Step s) noexcept {
  return s == Step::cleanup ? std::string_view("cleanup") : to_string(phase_of(s));
}

std::vector<PlannedStep> plan_steps(Kind kind, bool downtime_first) {
  // A stop takes a model out of service: its one step stops the service and waits until nothing is left.
  if (kind == Kind::stop) return {{Step::stopping_old, true}};
  // A pull stages a revision ahead: it never stops, starts or probes a service.
  if (kind == Kind::pull)
    return {{Step::planning, false}, {Step::freeing_disk, false}, {Step::downloading, false}, {Step::verifying, false}};
  // Planning, freeing_disk, downloading and verifying leave the model in service alone (a large
  // download takes hours while it keeps serving and being watched); so does cleanup, which spares
  // the revision in service; warming only reads the new revision's files into the page cache.
  const PlannedStep stop{Step::stopping_old, true};
  std::vector<PlannedStep> steps{{Step::planning, false}};
  if (downtime_first) steps.push_back(stop);
  for (Step s : {Step::freeing_disk, Step::downloading, Step::verifying, Step::warming}) steps.push_back({s, false});
  if (!downtime_first) steps.push_back(stop);
  steps.insert(steps.end(), {{Step::launching, true},
                             {Step::health_checking, true},
                             {Step::cleanup, false},
                             {Step::benchmarking, true}});
  return steps;
}

}  // namespace modeld::deploy
