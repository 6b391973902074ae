// The plan of a deployment as data: the order of its steps, which touch the service in service,
// and the phase the API shows for each (cleanup adds no phase name).

#include "deploy/steps.hpp"

#include <catch2/catch.hpp>

#include <set>
#include <string>

using namespace modeld::deploy;

namespace {

std::string names(const std::vector<PlannedStep>& steps, bool touching_only = false) {
  std::string out;
  for (const auto& s : steps)
    if (!touching_only || s.touches_service) out += std::string(out.empty() ? "" : " ") + std::string(to_string(s.step));
  return out;
}

}  // namespace

TEST_CASE("a deploy's steps: warming and stopping_old after verifying, cleanup between health_checking and benchmarking") {
  const auto steps = plan_steps(Kind::deploy, false);
  CHECK(names(steps) ==
        "planning freeing_disk downloading verifying warming stopping_old launching health_checking cleanup "
        "benchmarking");
  CHECK(names(steps, true) == "stopping_old launching health_checking benchmarking");
}

TEST_CASE("with downtime first, stopping_old comes right after planning, and warming while nothing serves") {
  CHECK(names(plan_steps(Kind::deploy, true)) ==
        "planning stopping_old freeing_disk downloading verifying warming launching health_checking cleanup "
        "benchmarking");
}

TEST_CASE("cleanup shows as health_checking, every other step as its own phase") {
  CHECK(phase_of(Step::cleanup) == Phase::health_checking);
  std::set<Phase> phases;
  std::size_t steps = 0;
  for (const auto& s : plan_steps(Kind::deploy, false)) {
    if (s.step == Step::cleanup) continue;
    CHECK(to_string(s.step) == to_string(phase_of(s.step)));
    phases.insert(phase_of(s.step));
    ++steps;
  }
  CHECK(phases.size() == steps);  // no two steps share a phase
  CHECK_FALSE(phases.contains(Phase::rolling_back));
}

TEST_CASE("a pull's steps are planning to verifying, none touching the service, whatever the order flag") {
  for (bool downtime_first : {false, true}) {
    const auto steps = plan_steps(Kind::pull, downtime_first);
    CHECK(names(steps) == "planning freeing_disk downloading verifying");
    CHECK(names(steps, true).empty());
  }
}
