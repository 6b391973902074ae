// freeing_disk: make room within disk_reserve by evicting least recently active models.
#include "deploy/phases.hpp"

#include "store/store.hpp"
#include "util/text.hpp"
#include "util/units.hpp"

#include <fmt/format.h>

namespace modeld::deploy {

boost::asio::awaitable<Result<void>> run_freeing_disk(Services& s, Run& run) {
  const auto& cfg = *s.config;
  std::uint64_t need = 0;
  for (const auto& f : run.missing) need += f.size;
  const std::uint64_t partial = s.store.partial_bytes(run.model.name, *run.record.commit);
  need = need > partial ? need - partial : 0;

  auto free = store::free_bytes(cfg.daemon.models_dir);
  if (!free) co_return free.error();

  std::vector<store::EvictionCandidate> candidates;
  for (const auto& m : s.store.list()) {
    if (m.name == run.model.name) continue;                              // the target
    if (run.previous && run.previous->model == m.name) continue;         // the active model
    if (const auto* mc = cfg.find_model(m.name); mc && mc->pinned) continue;
    auto la = run.last_active.find(m.name);
    candidates.push_back({m.name, m.size_bytes,
                          la == run.last_active.end() ? std::chrono::system_clock::time_point{}
                                                      : util::parse_rfc3339(la->second)});
  }
  auto plan = store::plan_disk(need, *free, cfg.daemon.disk_reserve, std::move(candidates));

  if (need == 0) {
    sys::logf(sys::Level::info, run.fields(), "nothing to free: no bytes left to download");
    co_return Result<void>{};
  }
  if (!plan.fits) {
    std::uint64_t evictable = 0;
    for (const auto& c : plan.evict) evictable += c.size_bytes;
    co_return make_error(
        Errc::disk_full,
        fmt::format("model {} needs {} more on {}, but only {} is available ({} free minus disk_reserve {}), "
                    "and evicting every other unpinned, inactive model would free only {}",
                    run.model.name, util::format_bytes(need), cfg.daemon.models_dir.string(),
                    util::format_bytes(*free > cfg.daemon.disk_reserve ? *free - cfg.daemon.disk_reserve : 0),
                    util::format_bytes(*free), util::format_bytes(cfg.daemon.disk_reserve),
                    util::format_bytes(evictable)));
  }
  if (plan.evict.empty()) {
    sys::logf(sys::Level::info, run.fields(), "nothing to free: {} needed, {} free, {} reserved",
              util::format_bytes(need), util::format_bytes(*free), util::format_bytes(cfg.daemon.disk_reserve));
    co_return Result<void>{};
  }
  for (const auto& victim : plan.evict) {
    auto freed = s.store.remove_model(victim.name);
    if (!freed) co_return freed.error();
    sys::Fields f = run.fields();
    f.extra.emplace_back("MODELD_EVICTED", victim.name);
    sys::logf(sys::Level::notice, f, "evicted model {} ({}) to make room", victim.name, util::format_bytes(*freed));
  }
  co_return Result<void>{};
}

}  // namespace modeld::deploy
