#pragma once
// The phases of a deployment, one file each (plan.cpp, free_disk.cpp, download.cpp, verify.cpp,
// warm.cpp, stop_old.cpp, launch.cpp, health_check.cpp for health_checking and benchmarking, cleanup.cpp,
// rollback.cpp). A phase reads the deployment through a const Run, does its work and returns
// what it decided or changed as a result value; the driver (Deployer) alone applies results to
// the record and the daemon's state, persists them and tells listeners. A decision that must be
// durable before the phase acts on it goes through the driver's Decisions sink. No phase, and no
// header included here, sees the Deployer or the StateStore.

#include "config/config.hpp"
#include "deploy/deployment.hpp"
#include "deploy/control.hpp"
#include "store/store.hpp"
#include "deploy/placement.hpp"
#include "deploy/records.hpp"
#include "gpu/nvml.hpp"
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
  /// A test seam replacing NVML's snapshot in gpu_watch.hpp (called on the disk pool, as NVML is);
  /// empty (the daemon's case): the process's NVML.
  std::function<Result<std::optional<gpu::Snapshot>>()> gpu_snapshot;
};

/// What eviction knows of the services in service: their models are never evicted, except those
/// the deployment stops (`stopped`, in conflict with its model) when allow_downtime lets it, and
/// then only as the very last resort.
struct Serving {
  std::set<std::string> models;   ///< every model in service
  std::set<std::string> stopped;  ///< those of them the deployment stops
};

/// What a phase reads of the deployment it works on. The driver builds it (designated
/// initializers) and alone changes it, applying the phases' results; phases get it const.
struct Run {
  const Deployment& record;                ///< the driver's record (commit, flags, phase)
  const config::ModelConfig& model;        ///< the configuration the deployment started with
  Serving serving = {};                    ///< the services in service when the run started
  std::vector<Placement> staying = {};     ///< where the services it leaves serving run (their GPUs stay busy)
  std::map<std::string, std::string> last_active = {};  ///< model -> RFC 3339, for eviction order
  Pulled pulled = {};  ///< revisions pulled ahead: their models are not evicted, cleanup spares them
  std::optional<repo::Snapshot> snapshot = {};  ///< after planning, with files filtered
  std::vector<repo::RepoFile> missing = {};     ///< files still to download, after planning
  std::set<std::string> fetched = {};           ///< paths hashed by this run (downloaded, or adopted)

  /// The journal fields of this run in its current phase.
  sys::Fields fields() const;
};

/// The driver's side of the decisions a phase must make durable before acting on them, and the
/// phase's progress. Implemented by the Deployer; tests give their own.
class Decisions {
 public:
  virtual ~Decisions() = default;
  /// Planning chose `commit`: recorded and persisted (awaited, written on the disk pool) before
  /// the revision folder is prepared, so a restart plans the same commit.
  virtual boost::asio::awaitable<void> commit_chosen(const std::string& commit) = 0;
  /// stopping_old may send StopUnit next: `old_stopped` and the switch's stop-requested time (kept
  /// from before a restart) recorded and persisted (awaited) first, so any failure, cancel or
  /// restart from here on rolls back, and the outage is measured from here.
  virtual boost::asio::awaitable<void> stopping_old() = 0;
  /// Download progress (an observer): called on the event loop; must not block.
  virtual void progress(const fetch::Progress& p) = 0;
  /// Warming's figures so far (an observer): called on the event loop; must not block.
  virtual void warm_progress(const WarmReport&) {}
};

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

/// What freeing_disk deleted.
struct Freed {
  std::vector<std::string> evicted;  ///< models removed from disk, in order
  bool active_evicted = false;       ///< one of them is the model that served (allow_downtime)
};

/// What downloading fetched.
struct Downloaded {
  std::set<std::string> fetched;  ///< paths downloaded and hashed on arrival
};

/// When stopping_old found nothing of the old service left (ns since the epoch, a SwitchMarks
/// mark); 0 when no model was active, so nothing was stopped.
struct Stopped {
  std::int64_t stop_done_ns = 0;
};

/// What launching did: when it asked for the new service's start (ns since the epoch, just before
/// StartUnit) and the bytes of the new revision in the page cache right before (nullopt when it
/// could not measure).
struct Launched {
  std::int64_t start_requested_ns = 0;
  std::optional<std::uint64_t> bytes_resident_at_launch;
};

/// When a readiness wait saw the port accept a connection and the server ready (ns since the
/// epoch); with the Services::wait_ready seam both are the moment it returned.
struct Readiness {
  std::int64_t port_ns = 0;
  std::int64_t ready_ns = 0;
};

/// What rolling_back did: when it asked for the first old service's start and when the last one
/// was ready (0 when none came back), which came back, and which did not, with why.
struct Restored {
  Launched launched;
  Readiness readiness;
  std::vector<std::string> restored;                          ///< models serving again, in order
  std::vector<std::pair<std::string, std::string>> failed;   ///< model -> why it did not come back
};

/// What benchmarking measured; empty when disabled or failed (a failed benchmark is no failure).
struct Benchmarked {
  std::optional<double> ttft_s;               ///< first-token latency, seconds
  std::optional<double> decode_tokens_per_s;  ///< decode rate
};

/// What warming did: the figures for DEPLOYMENT.warm (nullopt with serve.warm = "off") and the
/// journal's closing line ("warmed 410 GB of 547 GB: RAM budget ...").
struct Warmed {
  std::optional<WarmReport> report;
  std::string note;
};

/// What cleanup removed.
struct Cleaned {
  std::uint64_t bytes_freed = 0;  ///< bytes of older revisions deleted
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

/// `modelctl rm --commit`: on the disk pool, Store::remove_revision (one revision, and the link
/// when it points there). Errors as remove_revision.
boost::asio::awaitable<Result<Removal>> remove_revision_from_disk(Services& s, const std::string& name,
                                                                  const std::string& commit);

/// planning: resolve the revision to a commit (the record's commit when it has one: a resumed
/// deployment keeps it), list and filter files, refuse needed files that the filters drop, record
/// the commit through `decisions`, link unchanged files from older revisions, adopt a foreign
/// folder, find what is still missing and decide the order. Disk work on the disk pool.
boost::asio::awaitable<Result<Planned>> run_planning(Services& s, const Run& run, Decisions& decisions);

/// freeing_disk: compare bytes still needed with free space minus disk_reserve, evict least
/// recently active models that are neither active (unless downtime_first), pinned nor the
/// target, or refuse (disk_full). Disk work on the disk pool.
boost::asio::awaitable<Result<Freed>> run_freeing_disk(Services& s, const Run& run);

/// downloading: fetch the missing files (hashing inline), reporting progress to `decisions`.
boost::asio::awaitable<Result<Downloaded>> run_downloading(Services& s, const Run& run, Decisions& decisions);

/// verifying: hash files this run did not fetch, check structure (safetensors, index, config),
/// then write the revision's manifest.
boost::asio::awaitable<Result<void>> run_verifying(Services& s, const Run& run);

/// Proves with a stat per file (on the disk pool) that the files of the run's revision are still
/// those its manifest recorded at verification; checkpoint_incomplete ending "...; `refusing`"
/// ("not launching") otherwise.
boost::asio::awaitable<Result<void>> check_still_verified(Services& s, const Run& run, std::string_view refusing);

/// stopping_old: check that the new revision's files are still the verified ones (unless
/// planning put stopping_old first), record through `decisions` that the old model may go, then
/// stop the active model's unit and wait until nothing of it is left (then, when it was stopped, its
/// GPU memory back); returns when nothing of it was left.
boost::asio::awaitable<Result<Stopped>> run_stopping_old(Services& s, const Run& run, Decisions& decisions);

/// warming: with serve.warm = "auto", warm_revision of the run's revision, cancellable, its
/// progress reported to `decisions`; with "off", one journal line and nothing else.
boost::asio::awaitable<Result<Warmed>> run_warming(Services& s, const Run& run, Decisions& decisions);

/// Warming's progress as the driver sees it (called on the event loop).
using WarmProgressFn = std::function<void(const WarmReport&)>;

/// Reads revision `commit` of `model` (its manifest's files: the safetensors index's shards
/// first, sorted, then the rest, sorted) into the page cache with warm::warm_files on threads of
/// its own, within MemAvailable minus daemon.warm_reserve (MODELD_TEST_WARM_BUDGET bytes instead,
/// and MODELD_TEST_WARM_RATE bytes/s at most, in builds with test hooks). Logs a start and a
/// closing line under `fields`; `progress` (may be empty) gets the figures on the loop. With
/// `cancellable`, a cancel of the awaiting coroutine stops the readers and returns cancelled.
/// Errors: the manifest's or /proc/meminfo's (io_error, checkpoint_incomplete), cancelled, and
/// io_error "cannot read FILE of MODEL at COMMIT12, at byte N: ..." (about FILE) for a read error.
boost::asio::awaitable<Result<Warmed>> warm_revision(Services& s, const config::ModelConfig& model,
                                                     const std::string& commit, const sys::Fields& fields,
                                                     const WarmProgressFn& progress, bool cancellable);

/// The order warming reads a revision's `paths` in: the shards (the index's `shards`, or every
/// *.safetensors when it is empty) sorted by name, as vLLM and transformers load them, then the
/// other files sorted. Does not block.
std::vector<std::string> warm_order(std::vector<std::string> paths, const std::set<std::string>& shards);

/// The reserve of MemAvailable warming leaves when daemon.warm_reserve is unset, in bytes:
/// max(8 GiB, 10% of `mem_total`).
std::uint64_t default_warm_reserve(std::uint64_t mem_total);

/// Bytes of the run's revision in the page cache now (mincore, on the disk pool); nullopt when
/// its manifest cannot be read or no file could be measured.
boost::asio::awaitable<std::optional<std::uint64_t>> resident_at_launch(Services& s, const Run& run);

/// launching: switch models_dir/NAME to the new revision, write the drop-in, reload, measure
/// what of the revision is in the page cache, start; returns when the start was asked for.
boost::asio::awaitable<Result<Launched>> run_launching(Services& s, const Run& run);

/// health_checking: wait for readiness within startup_timeout; returns when the port listened and
/// the server was ready.
boost::asio::awaitable<Result<Readiness>> run_health_checking(Services& s, const Run& run);

/// Waits until the service of `model` is ready within its startup_timeout, logging each step
/// (Services::wait_ready instead, when set); returns when the port listened and it was ready.
boost::asio::awaitable<Result<Readiness>> wait_model_ready(Services& s, const config::ModelConfig& model,
                                                      const sys::Fields& fields);

/// benchmarking: measure first-token latency and decode rate when enabled; never fails (a
/// failed measurement is logged and returns no numbers).
boost::asio::awaitable<Result<Benchmarked>> run_benchmarking(Services& s, const Run& run);

/// cleanup (after health_checking, shown as that phase): on the disk pool, deletes the revisions
/// of the run's model other than `keep_commit` (the commit in service) and the one models_dir/NAME
/// links, and those pulled ahead (Run::pulled). Not cancellable; safe to run again. Errors:
/// io_error (the deployment still succeeds).
boost::asio::awaitable<Result<Cleaned>> run_cleanup(Services& s, const Run& run, const std::string& keep_commit);

/// rolling_back: stop the new service, then restore every service the run stopped (its link, its
/// drop-in as it ran, warmed), started in the order they were put into service and then each
/// awaited ready. Returns which came back and which did not (Restored::failed); rollback_failed
/// only when the new service cannot be stopped or nothing served before.
boost::asio::awaitable<Result<Restored>> run_rolling_back(Services& s, const Run& run);

/// How long to wait for a unit to become inactive after StopUnit: its stop_timeout (the
/// drop-in's TimeoutStopSec=, after which systemd sends SIGKILL to the whole cgroup) plus a
/// grace for that kill and the cgroup to empty, so modeld never gives up just before systemd acts.
std::chrono::milliseconds stop_wait(std::chrono::milliseconds stop_timeout);

/// The text of the drop-in of `model` (command, environment, working directory, timeouts), as
/// started_settings(model, model_dir) renders it; exposed for tests. Values are quoted per
/// systemd.syntax(7). `gpu_uuids` as in the overload below.
std::string render_dropin(const config::ModelConfig& model, const std::filesystem::path& model_dir,
                          const std::vector<std::string>& gpu_uuids);

/// The drop-in of `model` with its ExecStart=, Environment= and WorkingDirectory= lines from
/// `started` (the rest, stop timeout and comments, from `model`). With `started.gpu_ids` set it
/// also writes CUDA_DEVICE_ORDER=PCI_BUS_ID before the configured environment (which may override
/// it) and CUDA_VISIBLE_DEVICES=`gpu_uuids` joined by commas after it (empty for an empty list:
/// the server sees no GPU); `gpu_uuids` must be the UUIDs of `started.gpu_ids` in their order
/// (gpu_uuids() in gpu_watch.hpp) and is ignored when `started.gpu_ids` is unset. Pure.
std::string render_dropin(const config::ModelConfig& model, const StartedSettings& started,
                          const std::vector<std::string>& gpu_uuids);

/// The settings a service of `model` started from the drop-in render_dropin(model, model_dir)
/// writes runs with: the drop-in's lines come from this value.
StartedSettings started_settings(const config::ModelConfig& model, const std::filesystem::path& model_dir);

/// started_settings for the model's folder models_dir/NAME.
StartedSettings started_settings(Services& s, const config::ModelConfig& model);

/// Writes the model's drop-in into unit_dir, with `started` when given (a rollback restores the
/// old server as it ran) else as today's configuration renders it, and reloads systemd; returns
/// the settings written (what the service runs with once (re)started). With GPU ids in the
/// settings, their UUIDs come from NVML (on the disk pool, remembered for the process). Errors:
/// unit_failed naming a GPU id that is not visible, or that no NVIDIA GPU is (nothing written);
/// the service manager's (io_error, ...).
boost::asio::awaitable<Result<StartedSettings>> install_dropin(Services& s, const config::ModelConfig& model,
                                                               const std::optional<StartedSettings>& started = {});

/// What readiness and the watchdog probe for `model`: its port, health and models paths, served
/// name, whether a completion is needed, and the API key from api_key_file (io_error naming the
/// file, never its content).
Result<health::Target> target_of(const config::ModelConfig& model);

/// Reads the model's health API key from api_key_file (first line, trimmed) into `key`; leaves
/// it empty when no file is configured; io_error naming the file (never its content) otherwise.
Result<void> read_api_key(const config::ModelConfig& model, std::optional<std::string>& key);

}  // namespace modeld::deploy
