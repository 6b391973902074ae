// freeing_disk: make room within disk_reserve by evicting least recently active models.
#include "deploy/free_disk.hpp"

#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace modeld::deploy {

std::vector<store::EvictionCandidate> eviction_candidates(const std::vector<store::StoredModel>& stored,
                                                          const config::Config& cfg, const std::string& target,
                                                          const Serving& serving,
                                                          const std::map<std::string, std::string>& last_active,
                                                          bool may_evict_active, const Pulled& pulled) {
  std::vector<store::EvictionCandidate> candidates;
  std::vector<store::EvictionCandidate> serving_candidates;
  for (const auto& m : stored) {
    if (m.name == target) continue;
    if (const auto* mc = cfg.find_model(m.name); mc && mc->pinned) continue;
    // Eviction deletes a whole model: one holding a revision pulled ahead is kept.
    if (auto p = pulled.find(m.name); p != pulled.end() && !p->second.empty()) continue;
    auto la = last_active.find(m.name);
    store::EvictionCandidate c{m.name, m.size_bytes,
                               la == last_active.end() ? std::chrono::system_clock::time_point{}
                                                       : util::parse_rfc3339(la->second)};
    if (serving.models.contains(m.name)) {
      // A model that keeps serving is never evicted; evicting one the deployment stops costs its
      // rollback: only as the very last resort.
      if (may_evict_active && serving.stopped.contains(m.name)) serving_candidates.push_back(std::move(c));
      continue;
    }
    candidates.push_back(std::move(c));
  }
  for (auto& c : serving_candidates) {
    c.last_active = std::chrono::system_clock::time_point::max();
    candidates.push_back(std::move(c));
  }
  return candidates;
}

Result<store::DiskPlan> plan_freeing_disk(Services& s, std::uint64_t need, const std::string& target,
                                          const Serving& serving,
                                          const std::map<std::string, std::string>& last_active,
                                          bool may_evict_active, const Pulled& pulled) {
  const auto& cfg = *s.config;
  auto free = store::free_bytes(cfg.daemon.models_dir);
  if (!free) return free.error();
  if (need == 0) {
    store::DiskPlan plan;
    plan.bytes_free = *free;
    plan.reserve = cfg.daemon.disk_reserve;
    plan.fits = true;
    return plan;
  }
  return store::plan_disk(need, *free, cfg.daemon.disk_reserve,
                          eviction_candidates(s.store.list(), cfg, target, serving, last_active, may_evict_active,
                                              pulled));
}

std::uint64_t bytes_still_needed(Services& s, const std::string& model, const std::string& commit,
                                 const std::vector<repo::RepoFile>& missing) {
  const std::uint64_t need = util::total_size(missing);
  const std::uint64_t partial = need ? s.store.partial_bytes(model, commit) : 0;
  return need > partial ? need - partial : 0;
}

namespace {

// What freeing_disk must evict, from a statvfs and a walk of the store (blocking: on the disk
// pool): `need` bytes still to download, the plan, and whether evicting the active model
// would make room where the plan does not (`fits_with_active`).
struct DiskNeeds {
  std::uint64_t need = 0;
  Result<store::DiskPlan> plan = make_error(Errc::internal, "not planned");
  bool fits_with_active = false;
};

DiskNeeds disk_needs(Services& s, const Run& run) {
  DiskNeeds n;
  n.need = bytes_still_needed(s, run.model.name, *run.record.commit, run.missing);
  if (n.need == 0) return n;
  // A model the deployment stops is evicted only when planning put stopping_old first (allow_downtime).
  n.plan = plan_freeing_disk(s, n.need, run.model.name, run.serving, run.last_active, run.record.downtime_first,
                             run.pulled);
  if (n.plan && !n.plan->fits && !run.serving.stopped.empty() && !run.record.downtime_first) {
    auto with_active = plan_freeing_disk(s, n.need, run.model.name, run.serving, run.last_active, true, run.pulled);
    n.fits_with_active = with_active && with_active->fits;
  }
  return n;
}

// "the active model m" or "the models in service a, b" that the run stops.
std::string describe_stopped(const Run& run) {
  const auto& st = run.serving.stopped;
  return fmt::format("{} {}", st.size() == 1 ? "the active model" : "the models in service", fmt::join(st, ", "));
}

}  // namespace

boost::asio::awaitable<Result<Freed>> run_freeing_disk(Services& s, const Run& run) {
  const auto& cfg = *s.config;
  // By reference only (GCC 12 mis-copies class objects captured by value in a coroutine).
  auto needs = co_await util::on_pool<DiskNeeds>(s.disk_pool, [&] { return disk_needs(s, run); });
  const std::uint64_t need = needs.need;
  if (need == 0) {
    sys::logf(sys::Level::info, run.fields(), "nothing to free: no bytes left to download");
    co_return Freed{};
  }
  if (!needs.plan) co_return needs.plan.error();
  const auto& plan = *needs.plan;
  const std::uint64_t* free = &plan.bytes_free;
  if (!plan.fits) {
    std::uint64_t evictable = 0;
    for (const auto& c : plan.evict) evictable += c.size_bytes;
    // Say so when evicting the model in service would make room: the operator decides.
    std::string hint;
    if (needs.fits_with_active)
      hint = fmt::format("; it fits if {} {} evicted: deploy with --allow-downtime (no rollback "
                         "is possible then)",
                         describe_stopped(run), run.serving.stopped.size() == 1 ? "is" : "are");
    co_return make_error(
        Errc::disk_full,
        fmt::format("model {} needs {} more on {}, but only {} is available ({} free minus disk_reserve {}), "
                    "and evicting every other unpinned model not in service would free only {}{}",
                    run.model.name, util::format_bytes(need), cfg.daemon.models_dir.string(),
                    util::format_bytes(*free > cfg.daemon.disk_reserve ? *free - cfg.daemon.disk_reserve : 0),
                    util::format_bytes(*free), util::format_bytes(cfg.daemon.disk_reserve),
                    util::format_bytes(evictable), hint));
  }
  if (plan.evict.empty()) {
    sys::logf(sys::Level::info, run.fields(), "nothing to free: {} needed, {} free, {} reserved",
              util::format_bytes(need), util::format_bytes(*free), util::format_bytes(cfg.daemon.disk_reserve));
    co_return Freed{};
  }
  Freed freed_models;
  for (const auto& victim : plan.evict) {
    const auto& name = victim.name;
    auto freed = co_await util::on_pool<Result<std::uint64_t>>(s.disk_pool, [&] { return s.store.remove_model(name); });
    if (!freed) co_return freed.error();
    freed_models.evicted.push_back(name);
    if (run.serving.models.contains(name)) freed_models.active_evicted = true;
    sys::Fields f = run.fields();
    f.extra.emplace_back("MODELD_EVICTED", victim.name);
    sys::logf(sys::Level::notice, f, "evicted model {} ({}) to make room", victim.name, util::format_bytes(*freed));
  }
  co_return freed_models;
}

}  // namespace modeld::deploy
