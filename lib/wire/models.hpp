#pragma once
// The answers about models on disk as the API shows them (docs/interface.md "Added by this
// project"): GET /v1/models, GET /v1/models/{name}/plan, POST /v1/models/{name}/verify and
// DELETE /v1/models/{name}; their JSON both ways.

#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace modeld::wire {

/// One revision of a model on disk (GET /v1/models "revisions").
struct RevisionInfo {
  std::string commit;
  std::string state;        ///< "partial", "verified" or "corrupt"
  bool pulled = false;      ///< pulled ahead and not deployed or removed since
  bool in_service = false;  ///< the commit of the model in service
};

/// One configured model and what is on disk for it (GET /v1/models).
struct ModelInfo {
  std::string name, repo, revision;
  std::optional<std::string> commit;  ///< the verified commit on disk, if any
  std::string state;                  ///< "absent", "partial", "verified", "corrupt"
  std::uint64_t size_bytes = 0;
  bool active = false;
  bool pinned = false;
  std::optional<std::string> last_active;  ///< RFC 3339
  std::vector<RevisionInfo> revisions;     ///< every revision on disk, by commit
};

/// A model that a plan would delete to make room, in the order it would go.
struct PlannedEviction {
  std::string name;
  std::uint64_t bytes = 0;                 ///< what deleting it frees
  std::optional<std::string> last_active;  ///< RFC 3339; nullopt when it never served
  bool active = false;                     ///< a model in service that the deployment stops (only with allow_downtime)
};

/// One check of the pre-flight (interface.md "Pre-flight"): what a deployment checks before it
/// stops anything.
struct PreflightCheck {
  std::string check;    ///< "command", "gpus" or "port"
  bool ok = true;       ///< passed, or could not be checked (the message says which)
  std::string message;  ///< a sentence; a failure names the key (models.NAME.serve.port) and its file
};

/// The outcome of a dry run of planning and freeing_disk (GET /v1/models/{name}/plan).
/// All sizes in bytes.
struct PlanReport {
  std::string model, repo, revision;
  std::string commit;                 ///< what the revision resolves to now
  bool verified = false;              ///< that commit is on disk and verified: nothing to do
  std::uint64_t files_total = 0;      ///< files that pass include/exclude
  std::uint64_t bytes_total = 0;
  std::uint64_t files_to_fetch = 0;   ///< not on disk, and not hard-linkable from an older revision
  std::uint64_t bytes_to_fetch = 0;
  std::uint64_t bytes_local = 0;      ///< bytes_total - bytes_to_fetch: present or linkable
  std::uint64_t bytes_linkable = 0;   ///< part of bytes_local: hard links from older verified revisions
  std::uint64_t bytes_partial = 0;    ///< of partial downloads already on disk (resumed, not fetched again)
  std::optional<std::string> adopt_from;  ///< a folder made outside modeld at models_dir/NAME, when there is one
  std::uint64_t files_adoptable = 0;  ///< files there with the listed size, not known to differ (hashed at deployment)
  std::uint64_t bytes_adoptable = 0;  ///< part of bytes_local
  std::uint64_t bytes_needed = 0;     ///< bytes_to_fetch - bytes_partial: new disk space the download takes
  std::uint64_t bytes_free = 0;       ///< statvfs f_bavail of models_dir
  std::uint64_t disk_reserve = 0;
  std::vector<PlannedEviction> evictions;
  bool fits = false;
  std::uint64_t shortfall_bytes = 0;  ///< when it does not fit: what is missing even after every eviction
  bool allow_downtime = false;
  std::optional<std::string> active_model;  ///< the model in service when planned (of several, the one put into service last)
  /// The services a deployment would stop: those in conflict with the model (same model, GPUs
  /// that overlap, or the same port); every other keeps serving.
  std::vector<std::string> stops;
  bool rollback_possible = true;      ///< false when the plan evicts a model it stops
  /// When warming would run: "before_stop" (while the old model serves), "in_outage" (after
  /// allow_downtime stopped the evicted active model: it adds to the outage) or "off" (serve.warm).
  std::string warming = "before_stop";
  /// Without allow_downtime and not fitting: whether evicting the active model would make it fit.
  bool fits_with_allow_downtime = false;
  /// A deployment of this commit would end succeeded with changed false: the model serves it with
  /// the same started settings, its unit is active, its files match and its probe passes.
  bool already_serving = false;
  /// The pre-flight a deployment runs in planning and before stopping_old, in order.
  std::vector<PreflightCheck> preflight;
};

/// One thing wrong with a model on disk (POST /v1/models/{name}/verify).
struct VerifyProblem {
  std::string code;     ///< Errc name: checksum_mismatch, size_mismatch, checkpoint_incomplete, ...
  std::string file;     ///< repository-relative path
  std::string tensor;   ///< empty when not about one tensor
  std::string message;  ///< sentence naming file and tensor
};

/// The outcome of re-hashing and re-checking one revision on disk.
struct VerifyReport {
  std::string model, commit;
  std::uint64_t files = 0;  ///< files checked
  std::uint64_t bytes = 0;  ///< bytes hashed (hard-linked files counted once per path)
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

/// What rm deleted (DELETE /v1/models/{name}).
struct Removal {
  std::string model;
  std::uint64_t bytes_freed = 0;
  std::vector<std::string> commits;  ///< revisions deleted
};

/// The body of GET /v1/models: {"models": [...]} in the order given; pure.
nlohmann::json models_json(const std::vector<ModelInfo>& models);
/// The body of GET /v1/models/{name}/plan; pure.
nlohmann::json to_json(const PlanReport& plan);
/// The body of POST /v1/models/{name}/verify ("ok" is report.ok()); pure.
nlohmann::json to_json(const VerifyReport& report);
/// The body of DELETE /v1/models/{name}; pure.
nlohmann::json to_json(const Removal& removal);

/// Reads the body of GET /v1/models; bad_request "models: ..." naming what is mistyped (a missing field keeps its default).
Result<std::vector<ModelInfo>> models_from_json(const nlohmann::json& j);
/// Reads the body of a plan; bad_request "plan: ..." naming what is mistyped (a missing field keeps its default).
Result<PlanReport> plan_from_json(const nlohmann::json& j);
/// Reads the body of a verify; bad_request "verify: ..." naming what is mistyped (a missing field keeps its default).
Result<VerifyReport> verify_from_json(const nlohmann::json& j);
/// Reads the body of an rm; bad_request "rm: ..." naming what is mistyped (a missing field keeps its default).
Result<Removal> removal_from_json(const nlohmann::json& j);

}  // namespace modeld::wire
