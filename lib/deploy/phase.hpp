#pragma once
// What every phase of a deployment shares (one file each, with its header beside it: plan,
// free_disk, download, verify, warm, stop_old, launch, health_check for health_checking and
// benchmarking, cleanup, rollback). A phase reads the deployment through a const Run, does its work
// and returns what it decided or changed as a result value; the run of the record (record_run.hpp,
// through the phase table of phase_table.hpp) alone applies results to the record and the daemon's
// state, persists them and tells listeners. A decision that must be durable before the phase acts
// on it goes through the Decisions sink. No phase, and no header included here, sees the Deployer,
// the run of the record or the StateStore.

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
  /// A test seam replacing the switch strategies serve.switch may name (switch_strategy.hpp);
  /// empty (the daemon's case): the built-in ones.
  std::vector<const struct SwitchStrategy*> switch_strategies;
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
/// phase's progress. Implemented by the run of the record (RecordRun); tests give their own.
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

}  // namespace modeld::deploy
