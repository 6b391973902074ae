#include "deploy/placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace modeld::deploy {

Placement placement_of(const config::ModelConfig& m) { return Placement{m.name, m.serve.port, m.serve.gpu_ids}; }

Placement placement_of(const ActiveRecord& a, const config::ModelConfig* configured) {
  if (a.started && a.started->port) return Placement{a.model, a.started->port, a.started->gpu_ids};
  if (configured) return Placement{a.model, configured->serve.port, configured->serve.gpu_ids};
  return Placement{a.model, 0, std::nullopt};
}

std::optional<std::string> conflict_between(const Placement& a, const Placement& b) {
  if (a.model == b.model) return std::string("the same model");
  if (config::gpu_sets_overlap(a.gpu_ids, b.gpu_ids)) {
    if (!a.gpu_ids || !b.gpu_ids) return std::string("one of them uses every GPU");
    std::vector<unsigned> shared;
    for (unsigned g : *a.gpu_ids)
      if (std::find(b.gpu_ids->begin(), b.gpu_ids->end(), g) != b.gpu_ids->end()) shared.push_back(g);
    return fmt::format("both use GPU{} {}", shared.size() == 1 ? "" : "s", fmt::join(shared, ","));
  }
  if (a.port && a.port == b.port) return fmt::format("both use port {}", a.port);
  return std::nullopt;
}

config::GpuSet gpus_of(const std::vector<Placement>& ps) {
  std::vector<unsigned> all;
  for (const auto& p : ps) {
    if (!p.gpu_ids) return std::nullopt;
    for (unsigned g : *p.gpu_ids)
      if (std::find(all.begin(), all.end(), g) == all.end()) all.push_back(g);
  }
  std::sort(all.begin(), all.end());
  return all;
}

std::vector<ActiveRecord> conflicting(const std::vector<ActiveRecord>& serving, const Placement& target,
                                      const config::Config& cfg) {
  std::vector<ActiveRecord> out;
  for (const auto& a : serving)
    if (conflict_between(placement_of(a, cfg.find_model(a.model)), target)) out.push_back(a);
  return out;
}

std::set<std::string> models_of(const std::vector<ActiveRecord>& records) {
  std::set<std::string> out;
  for (const auto& r : records) out.insert(r.model);
  return out;
}

}  // namespace modeld::deploy
