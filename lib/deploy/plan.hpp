#pragma once
// planning (plan.cpp): the commit, its filtered listing, what is missing, the order; and the dry
// run behind `modelctl plan`.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// What planning found: the commit's filtered listing, what is still missing, what adoption
/// hashed, and whether stopping_old must come before freeing_disk.
struct Planned {
  repo::Snapshot snapshot;               ///< filtered by include/exclude, at the chosen commit
  std::vector<repo::RepoFile> missing;   ///< still to download
  std::set<std::string> adopted;         ///< paths hashed while adopting a foreign folder
  std::uint64_t bytes_total = 0;         ///< listed bytes of `missing`
  unsigned files_total = 0;              ///< files in `missing`
  bool downtime_first = false;           ///< allow_downtime and only evicting the active model makes room
  bool already_verified = false;         ///< the commit was on disk and verified: nothing to fetch
};

/// Refuses a listing (already filtered by include/exclude) that a Hub could not honestly send:
/// a name no file system can store (a component over 255 bytes, a path listed both as a file
/// and as a folder), a file under the revision's `.modeld/` (store::is_reserved_path), a file
/// larger than `max_file_size` bytes (hub.max_file_size), or sizes whose sum does not fit in 64 bits.
/// Errors: hub_bad_response naming the file (Error::files) and the model's config file.
Result<void> check_listed_files(const config::ModelConfig& model, const repo::Snapshot& kept,
                                std::uint64_t max_file_size);

/// What planning finds out before it touches the disk: the listing filtered by include/exclude,
/// checked by check_listed_files and against what the checkpoint needs (filters, safetensors index).
/// Errors: the Hub's, hub_bad_response, plan_invalid, checkpoint_incomplete.
boost::asio::awaitable<Result<repo::Snapshot>> list_planned_files(Services& s, const config::ModelConfig& model,
                                                                 const std::string& revision);

/// The dry run behind `modelctl plan` at `revision` (a branch, tag or commit; the configured one,
/// or `plan --commit`): list_planned_files, the store's dry-run of linking
/// (Store::plan_missing), partial bytes and plan_freeing_disk, disk work on the disk pool;
/// changes nothing on disk. `serving` are the services in service and those the deployment
/// would stop (PlanReport::stops); `active` the one put into service last; models with a revision
/// in `pulled` are not evicted. Errors as list_planned_files, io_error.
boost::asio::awaitable<Result<PlanReport>> dry_run_plan(Services& s, const config::ModelConfig& model,
                                                               const std::string& revision, bool allow_downtime, const Serving& serving,
                                                               const std::optional<std::string>& active,
                                                               const std::map<std::string, std::string>& last_active,
                                                               const Pulled& pulled = {});

/// planning: resolve the revision to a commit (the record's commit when it has one: a resumed
/// deployment keeps it), list and filter files, refuse needed files that the filters drop, record
/// the commit through `decisions`, link unchanged files from older revisions, adopt a foreign
/// folder, find what is still missing and decide the order. Disk work on the disk pool.
boost::asio::awaitable<Result<Planned>> run_planning(Services& s, const Run& run, Decisions& decisions);

}  // namespace modeld::deploy
