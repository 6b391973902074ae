// The phase table: every step has its row, the verbs STATUS= shows, and where an interrupted
// record continues (the rows' resume rules against the rule the driver had before the table).

#include "deploy/phase_table.hpp"

#include <catch2/catch.hpp>

#include <optional>
#include <set>

using namespace modeld::deploy;

namespace {

constexpr Step all_steps[] = {Step::planning,     Step::freeing_disk, Step::downloading,     Step::verifying,
                              Step::warming,      Step::stopping_old, Step::launching,       Step::health_checking,
                              Step::cleanup,      Step::benchmarking, Step::rolling_back};

constexpr Phase all_phases[] = {Phase::planning,     Phase::freeing_disk, Phase::downloading,     Phase::verifying,
                                Phase::warming,      Phase::stopping_old, Phase::launching,       Phase::health_checking,
                                Phase::benchmarking, Phase::rolling_back};

// The rule Deployer::resume_step had before the table (nullopt: it rolls back), with the kill
// sweep's fix: a record killed in benchmarking after its cleanup began continues from the cleanup.
std::optional<Step> rule_before(const Deployment& d) {
  if (d.kind == Kind::stop) return Step::stopping_old;
  if (d.phase == Phase::rolling_back) return std::nullopt;
  if (d.cleanup_begun && (d.phase == Phase::health_checking || d.phase == Phase::benchmarking)) return Step::cleanup;
  if (d.old_stopped && !d.downtime_first) return Step::stopping_old;
  return Step::planning;
}

}  // namespace

TEST_CASE("every step has its own row, with a run, and only rows that show their phase have a verb") {
  std::set<std::string_view> names;
  for (Step s : all_steps) {
    const auto& row = row_of(s);
    CHECK(row.step == s);
    CHECK(row.run != nullptr);
    CHECK(row.verb.empty() == !row.shows_own_phase);
    names.insert(row.name);
  }
  CHECK(names.size() == std::size(all_steps));
  CHECK(row_of(Step::cleanup).phase == Phase::health_checking);
  CHECK_FALSE(row_of(Step::cleanup).shows_own_phase);
}

TEST_CASE("STATUS= has a verb for every phase, the health check's for health_checking") {
  for (Phase p : all_phases) CHECK_FALSE(verb_of(p).empty());
  CHECK(verb_of(Phase::health_checking) == "waiting for readiness of");
  CHECK(verb_of(Phase::warming) == "warming the page cache for");
  CHECK(verb_of(Phase::rolling_back) == "rolling back");
}

TEST_CASE("an interrupted record continues where the rule before the table continued it") {
  for (Kind kind : {Kind::deploy, Kind::pull, Kind::stop})
    for (Phase phase : all_phases)
      for (int flags = 0; flags < 8; ++flags) {
        Deployment d;
        d.kind = kind;
        d.phase = phase;
        d.cleanup_begun = flags & 1;
        d.old_stopped = flags & 2;
        d.downtime_first = flags & 4;
        const auto before = rule_before(d);
        INFO(to_string(phase) << " kind " << static_cast<int>(kind) << " flags " << flags);
        CHECK(resume_step(d) == before.value_or(Step::rolling_back));
      }
}
