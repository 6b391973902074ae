#pragma once
// freeing_disk (free_disk.cpp): eviction of least recently active models to make room, and its
// dry-run parts.

#include "deploy/phase.hpp"

#include "store/store.hpp"

namespace modeld::deploy {

/// What freeing_disk deleted.
struct Freed {
  std::vector<std::string> evicted;  ///< models removed from disk, in order
  bool active_evicted = false;       ///< one of them is the model that served (allow_downtime)
};

/// The eviction candidates of freeing_disk among `stored`: every model but the target, pinned
/// ones, those with a revision in `pulled` and those in service (`serving.models`; with
/// `may_evict_active`, those the deployment stops are candidates after all), with when it last
/// served (`last_active`, model -> RFC 3339). A model in service, when allowed, goes last
/// whatever its time says.
std::vector<store::EvictionCandidate> eviction_candidates(const std::vector<store::StoredModel>& stored,
                                                          const config::Config& config, const std::string& target,
                                                          const Serving& serving,
                                                          const std::map<std::string, std::string>& last_active,
                                                          bool may_evict_active, const Pulled& pulled = {});

/// New disk space a download of `missing` into revision `commit` of `model` still takes, in
/// bytes: the listed sizes minus the partial bytes already on disk (they resume). Blocks (a walk
/// of the revision's partial files): call it on the disk pool.
std::uint64_t bytes_still_needed(Services& s, const std::string& model, const std::string& commit,
                                 const std::vector<repo::RepoFile>& missing);

/// The disk side of freeing_disk without deleting anything: `need` bytes still to download
/// (partial bytes already deducted) against free space minus disk_reserve, with the models to
/// evict (never one with a revision in `pulled`). A plan that needs nothing fits and evicts
/// nothing. Errors: io_error (statvfs). Blocks (statvfs, a walk of the store): call it on the disk pool.
Result<store::DiskPlan> plan_freeing_disk(Services& s, std::uint64_t need, const std::string& target,
                                          const Serving& serving,
                                          const std::map<std::string, std::string>& last_active,
                                          bool may_evict_active, const Pulled& pulled = {});

/// freeing_disk: compare bytes still needed with free space minus disk_reserve, evict least
/// recently active models that are neither active (unless downtime_first), pinned nor the
/// target, or refuse (disk_full). Disk work on the disk pool.
boost::asio::awaitable<Result<Freed>> run_freeing_disk(Services& s, const Run& run);

}  // namespace modeld::deploy
