#pragma once
// Which model services may serve side by side on one host (interface.md "Several models on one
// host"): a service's placement is its port and its GPU set; two conflict when they are the same
// model, their GPU sets overlap or their ports are equal. Decided on what each service was started
// with (StartedSettings), so a reload that changed gpu_ids or a port does not change what runs
// now. No I/O here.

#include "config/config.hpp"
#include "deploy/records.hpp"

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace modeld::deploy {

/// Where a model's server runs: its port and the GPUs it uses.
struct Placement {
  std::string model;
  std::uint16_t port = 0;  ///< 0: unknown (a service recorded before ports were kept, no longer configured)
  config::GpuSet gpu_ids;  ///< nullopt: every GPU
};

/// The placement of `m` as configured now.
Placement placement_of(const config::ModelConfig& m);

/// The placement of service `a` as it was started: its recorded settings' port and GPU ids, else
/// (settings recorded before they were kept) the configuration's `configured`, else port unknown
/// and every GPU, which conflicts with every GPU model: the safe side.
Placement placement_of(const ActiveRecord& a, const config::ModelConfig* configured);

/// Why `a` and `b` may not serve together ("the same model", "one of them uses every GPU", "both
/// use GPUs 2,3", "both use port 8000"), or nullopt when they may.
std::optional<std::string> conflict_between(const Placement& a, const Placement& b);

/// The GPUs of every placement in `ps` together: nullopt (every GPU) when one of them uses every GPU.
config::GpuSet gpus_of(const std::vector<Placement>& ps);

/// The services of `serving` (in service, in order) that conflict with `target`, in that order,
/// each with its placement looked up in `cfg`.
std::vector<ActiveRecord> conflicting(const std::vector<ActiveRecord>& serving, const Placement& target,
                                      const config::Config& cfg);

/// The models of `records`.
std::set<std::string> models_of(const std::vector<ActiveRecord>& records);

}  // namespace modeld::deploy
