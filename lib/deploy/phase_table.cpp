// The phase table's rows of the preparation and the end of a deployment, and the table's lookups.
// Each row runs its phase (one file each) and applies what it returns to the run; the switch's
// rows come from its strategy (switch_strategy.hpp).
#include "deploy/phase_table.hpp"
#include "deploy/record_run.hpp"
#include "deploy/switch_strategy.hpp"

#include "deploy/cleanup.hpp"
#include "deploy/download.hpp"
#include "deploy/free_disk.hpp"
#include "deploy/health_check.hpp"
#include "deploy/plan.hpp"
#include "deploy/verify.hpp"
#include "deploy/warm.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"

#include <array>
#include <chrono>

namespace modeld::deploy {

namespace asio = boost::asio;

namespace {

// planning's result on the run and the record, with the plan it decided; persisted.
asio::awaitable<void> apply_planned(RecordRun& r, Planned& p) {
  auto& d = r.record();
  auto& run = r.run();
  run.missing = std::move(p.missing);
  run.fetched.insert(p.adopted.begin(), p.adopted.end());
  run.snapshot = std::move(p.snapshot);
  d.commit = run.snapshot->commit;
  d.progress.files_total = p.files_total;
  d.progress.bytes_total = p.bytes_total;
  d.downtime_first = p.downtime_first;
  // A pull of a commit already verified on disk changes nothing.
  if (d.kind == Kind::pull && p.already_verified) d.changed = false;
  // The plan is data from here on: computed once, from what the record keeps.
  r.replan();
  co_await r.persist();
  test_hooks::crash_point("order_decided");
}

asio::awaitable<Result<void>> planning(RecordRun& r) {
  auto body = run_planning(r.phase_services(), r.run(), r);
  auto p = co_await r.in_child(body);
  if (!p) co_return p.error();
  if (!r.record().cancel_requested) co_await apply_planned(r, *p);
  co_return Result<void>{};
}

// freeing_disk's evictions in the daemon's state (the active model may have gone), saved.
asio::awaitable<void> apply_freed(RecordRun& r, const Freed& freed) {
  if (!freed.active_evicted) co_return;
  auto& state = r.sink().state();
  for (const auto& name : freed.evicted) {
    if (!state.active.erase(name)) continue;
    sys::logf(sys::Level::warning, r.fields(), "model {} was evicted: it is out of service, {} serves in its place",
              name, r.record().model);
    state.last_active[name] = util::rfc3339(std::chrono::system_clock::now());
  }
  co_await r.save_state();
}

asio::awaitable<Result<void>> freeing_disk(RecordRun& r) {
  auto body = run_freeing_disk(r.phase_services(), r.run());
  auto f = co_await r.in_child(body);
  if (!f) co_return f.error();
  if (!r.record().cancel_requested) co_await apply_freed(r, *f);
  co_return Result<void>{};
}

asio::awaitable<Result<void>> downloading(RecordRun& r) {
  auto body = run_downloading(r.phase_services(), r.run(), r);
  auto got = co_await r.in_child(body);
  if (!got) co_return got.error();
  r.run().fetched.insert(got->fetched.begin(), got->fetched.end());
  co_return Result<void>{};
}

asio::awaitable<Result<void>> verifying(RecordRun& r) {
  auto body = run_verifying(r.phase_services(), r.run());
  co_return co_await r.in_child(body);
}

asio::awaitable<Result<void>> warming(RecordRun& r) {
  auto body = run_warming(r.phase_services(), r.run(), r);
  auto w = co_await r.in_child(body);
  if (!w) co_return w.error();
  if (w->report) {
    r.record().warm = w->report;
    co_await r.persist();
  }
  co_return Result<void>{};
}

asio::awaitable<Result<void>> cleanup(RecordRun& r) {
  // Recorded before it starts, so a restart finishes it; the API still shows health_checking.
  r.record().cleanup_begun = true;
  co_await r.persist();
  test_hooks::crash_point("cleanup_begun");
  // Not cancellable. A failure is logged; the model serves.
  auto body = run_cleanup(r.phase_services(), r.run(), *r.record().commit);
  auto c = co_await r.in_child(body, false);
  if (!c) sys::logf(sys::Level::warning, r.fields(), "cannot remove older revisions: {}", c.error().message);
  co_return Result<void>{};
}

asio::awaitable<Result<void>> benchmarking(RecordRun& r) {
  auto body = run_benchmarking(r.phase_services(), r.run());
  auto b = co_await r.in_child(body);
  if (!b) co_return b.error();
  r.record().benchmark_ttft_s = b->ttft_s;
  r.record().benchmark_decode_tokens_per_s = b->decode_tokens_per_s;
  co_await r.persist();
  co_return Result<void>{};
}

// A record always continues from planning when no later step claims it: planning re-reads
// what the later steps need (the record keeps the commit).
bool always(const Deployment&) { return true; }

// Cleanup began after the health check: the new model serves, only the cleanup (done again if it
// had finished: it removes what is left) and the benchmark are left. Also from benchmarking, which
// comes after the cleanup: going back to stopping_old would stop the model that serves.
bool cleanup_begun(const Deployment& d) {
  return d.kind != Kind::stop && d.cleanup_begun &&
         (d.phase == Phase::health_checking || d.phase == Phase::benchmarking);
}

constexpr std::array preparation_and_end{
    PhaseRow{Step::planning, Phase::planning, "planning", "planning", false, true, planning, always},
    PhaseRow{Step::freeing_disk, Phase::freeing_disk, "freeing_disk", "freeing disk for", false, true, freeing_disk,
             nullptr},
    PhaseRow{Step::downloading, Phase::downloading, "downloading", "downloading", false, true, downloading, nullptr},
    PhaseRow{Step::verifying, Phase::verifying, "verifying", "verifying", false, true, verifying, nullptr},
    PhaseRow{Step::warming, Phase::warming, "warming", "warming the page cache for", false, true, warming, nullptr},
    PhaseRow{Step::cleanup, Phase::health_checking, "cleanup", "", false, false, cleanup, cleanup_begun},
    PhaseRow{Step::benchmarking, Phase::benchmarking, "benchmarking", "benchmarking", true, true, benchmarking,
             nullptr},
};

// Calls `f` with each row, the preparation's and the end's, then every built-in strategy's, until
// it returns true.
template <class F>
const PhaseRow* find_row(F f) {
  for (const auto& row : preparation_and_end)
    if (f(row)) return &row;
  for (const auto* strategy : builtin_switches())
    for (const auto& row : strategy->rows())
      if (f(row)) return &row;
  return nullptr;
}

}  // namespace

const PhaseRow& row_of(Step s) {
  const auto* row = find_row([s](const PhaseRow& r) { return r.step == s; });
  return row ? *row : preparation_and_end.front();  // every Step has a row (phase_table_test)
}

std::string_view verb_of(Phase p) {
  const auto* row = find_row([p](const PhaseRow& r) { return r.phase == p && r.shows_own_phase; });
  return row ? row->verb : std::string_view();
}

Step resume_step(const Deployment& d) { return resume_step(d, restart_switch()); }

}  // namespace modeld::deploy
