#pragma once
// The phases of a deployment, one file each (plan.cpp, free_disk.cpp, download.cpp, verify.cpp,
// stop_old.cpp, launch.cpp, health_check.cpp, benchmark.cpp, rollback.cpp). Each takes the
// long-lived services and the run it works on and returns a Result; the Deployer records each
// transition durably before the next phase starts.

#include "config/config.hpp"
#include "deploy/deployment.hpp"
#include "deploy/engine.hpp"
#include "store/store.hpp"
#include "deploy/state_store.hpp"
#include "hub/hub.hpp"
#include "sys/log.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace modeld::http { class Client; }
namespace modeld::units { class ServiceManager; }
namespace modeld::fetch { struct Progress; }
namespace modeld::health { struct Target; }

namespace modeld::deploy {

/// The daemon's long-lived parts that every phase may use.
struct Services {
  std::shared_ptr<const config::Config> config;
  store::Store& store;
  hub::Hub& hub;
  http::Client& hub_client;    ///< talks to the Hub and its CDN (carries the token)
  http::Client& local_client;  ///< talks to local inference servers (no token)
  units::ServiceManager& units;
  boost::asio::thread_pool& disk_pool;
  /// A test seam replacing the readiness wait of wait_model_ready; empty (the daemon's case): the real probes.
  std::function<boost::asio::awaitable<Result<void>>(const config::ModelConfig&, const sys::Fields&)> wait_ready;
};

/// One deployment in progress: its record and what the phases learn along the way.
struct Run {
  Deployment& record;
  const config::ModelConfig& model;
  std::optional<ActiveRecord> previous;  ///< the model that served when the run started
  std::map<std::string, std::string> last_active;  ///< model -> RFC 3339, for eviction order
  std::optional<repo::Snapshot> snapshot; ///< after planning, with files filtered
  std::vector<repo::RepoFile> missing;    ///< files still to download, after planning
  std::set<std::string> fetched;         ///< paths hashed by this run (downloaded, or adopted)
  std::function<void()> changed;         ///< persist the record and tell listeners
  std::function<void(const fetch::Progress&)> on_progress;  ///< from the download engine

  /// The journal fields of this run in its current phase.
  sys::Fields fields() const;
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

/// The eviction candidates of freeing_disk among `stored`: every model but the target, pinned
/// ones and (unless `may_evict_active`) the active one, with when it last served (`last_active`,
/// model -> RFC 3339). The active model, when allowed, goes last whatever its time says.
std::vector<store::EvictionCandidate> eviction_candidates(const std::vector<store::StoredModel>& stored,
                                                          const config::Config& config, const std::string& target,
                                                          const std::optional<std::string>& active,
                                                          const std::map<std::string, std::string>& last_active,
                                                          bool may_evict_active);

/// New disk space the run's download still takes, in bytes: the missing files' listed sizes
/// minus the partial bytes of this revision already on disk (they resume). After planning only.
std::uint64_t bytes_still_needed(Services& s, const Run& run);

/// The disk side of freeing_disk without deleting anything: `need` bytes still to download
/// (partial bytes already deducted) against free space minus disk_reserve, with the models to
/// evict. A plan that needs nothing fits and evicts nothing. Errors: io_error (statvfs).
Result<store::DiskPlan> plan_freeing_disk(Services& s, std::uint64_t need, const std::string& target,
                                          const std::optional<std::string>& active,
                                          const std::map<std::string, std::string>& last_active,
                                          bool may_evict_active);

/// The dry run behind `modelctl plan`: list_planned_files, the store's dry-run of linking
/// (Store::plan_missing), partial bytes and plan_freeing_disk, disk work on the disk pool;
/// changes nothing on disk. `active` is the model in service. Errors as list_planned_files, io_error.
boost::asio::awaitable<Result<PlanReport>> dry_run_plan(Services& s, const config::ModelConfig& model,
                                                               bool allow_downtime,
                                                               const std::optional<std::string>& active,
                                                               const std::map<std::string, std::string>& last_active);

/// `modelctl verify`: on the disk pool, re-hashes every file of the revision models_dir/NAME
/// points to (else the newest verified one) against its manifest and runs verify's structural
/// checks; a clean result rewrites the manifest with the files' current identities. Errors:
/// not_found when no verified revision of `name` is on disk; io_error (manifest unreadable or
/// not writable).
boost::asio::awaitable<Result<VerifyReport>> verify_on_disk(Services& s, const std::string& name);

/// Fast re-verification of revision `commit` of model `name` (at daemon start): a stat per file
/// against its manifest on the disk pool, logged with its time in ms under `fields`. When a file
/// changed and `rehash` is set, every file is re-hashed (verify_on_disk) and each problem logged.
/// Returns whether the files may be served: unchanged, or re-hashed clean.
boost::asio::awaitable<bool> files_still_trusted(Services& s, const std::string& name, const std::string& commit,
                                                 const sys::Fields& fields, bool rehash);

/// `modelctl rm`: on the disk pool, Store::remove_model (store folders and link, never through
/// a symlink out of models_dir). Errors as remove_model.
boost::asio::awaitable<Result<Removal>> remove_from_disk(Services& s, const std::string& name);

/// planning: resolve the revision to a commit, list and filter files, refuse needed files that
/// the filters drop, link unchanged files from older revisions, find what is still missing.
boost::asio::awaitable<Result<void>> run_planning(Services& s, Run& run);

/// freeing_disk: compare bytes still needed with free space minus disk_reserve, evict least
/// recently active models that are neither active, pinned nor the target, or refuse (disk_full).
boost::asio::awaitable<Result<void>> run_freeing_disk(Services& s, Run& run);

/// downloading: fetch the missing files (hashing inline), reporting progress.
boost::asio::awaitable<Result<void>> run_downloading(Services& s, Run& run);

/// verifying: hash files this run did not fetch, check structure (safetensors, index, config),
/// then write the revision's manifest.
boost::asio::awaitable<Result<void>> run_verifying(Services& s, Run& run);

/// Proves with a stat per file (on the disk pool) that the files of the run's revision are still
/// those its manifest recorded at verification; checkpoint_incomplete ending "...; `refusing`"
/// ("not launching") otherwise.
boost::asio::awaitable<Result<void>> check_still_verified(Services& s, const Run& run, std::string_view refusing);

/// stopping_old: check that the new revision's files are still the verified ones (unless
/// planning put stopping_old first), then stop the active model's unit and wait until nothing of
/// it is left.
boost::asio::awaitable<Result<void>> run_stopping_old(Services& s, Run& run);

/// launching: switch models_dir/NAME to the new revision, write the drop-in, reload, start.
boost::asio::awaitable<Result<void>> run_launching(Services& s, Run& run);

/// health_checking: wait for readiness within startup_timeout.
boost::asio::awaitable<Result<void>> run_health_checking(Services& s, Run& run);

/// Waits until the service of `model` is ready within its startup_timeout, logging each step (Services::wait_ready instead, when set).
boost::asio::awaitable<Result<void>> wait_model_ready(Services& s, const config::ModelConfig& model,
                                                      const sys::Fields& fields);

/// benchmarking: measure first-token latency and decode rate when enabled.
boost::asio::awaitable<Result<void>> run_benchmarking(Services& s, Run& run);

/// rolling_back: stop the new service, restore the previous model's link and service, wait for
/// its readiness. Returns rollback_failed when the old service cannot be restored.
boost::asio::awaitable<Result<void>> run_rolling_back(Services& s, Run& run);

/// How long to wait for a unit to become inactive after StopUnit: its stop_timeout (the
/// drop-in's TimeoutStopSec=, after which systemd sends SIGKILL to the whole cgroup) plus a
/// grace for that kill and the cgroup to empty, so modeld never gives up just before systemd acts.
std::chrono::milliseconds stop_wait(std::chrono::milliseconds stop_timeout);

/// Writes the drop-in of `model` (command, environment, working directory, timeouts) and
/// returns its text; exposed for tests. Values are quoted per systemd.syntax(7).
std::string render_dropin(const config::ModelConfig& model, const std::filesystem::path& model_dir);

/// Writes the model's drop-in into unit_dir and reloads systemd.
boost::asio::awaitable<Result<void>> install_dropin(Services& s, const config::ModelConfig& model);

/// What readiness and the watchdog probe for `model`: its port, health and models paths, served
/// name, whether a completion is needed, and the API key from api_key_file (io_error naming the
/// file, never its content).
Result<health::Target> target_of(const config::ModelConfig& model);

/// Reads the model's health API key from api_key_file (first line, trimmed) into `key`; leaves
/// it empty when no file is configured; io_error naming the file (never its content) otherwise.
Result<void> read_api_key(const config::ModelConfig& model, std::optional<std::string>& key);

}  // namespace modeld::deploy
