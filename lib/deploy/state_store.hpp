#pragma once
// Durable daemon state in state_dir: which models serve (state.json) and one JSON file per
// deployment (deployments/ID.json), each replaced atomically, so a restarted daemon knows the
// active model and any unfinished deployment. Every call blocks on the disk (reads, or a write
// with fsync of the file and its directory): the Deployer calls the writes on its disk pool,
// one at a time, and the reads only at start, before the loop serves anyone.

#include "deploy/deployment.hpp"
#include "deploy/records.hpp"
#include "util/error.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// The services in service, in the order they were put into service (several models serve side
/// by side when their GPU sets and ports do not conflict: placement.hpp).
class InService {
 public:
  std::vector<ActiveRecord> services;  ///< in the order they were put into service

  /// Whether any model serves.
  explicit operator bool() const noexcept { return !services.empty(); }
  /// The service of `model`, or nullptr.
  const ActiveRecord* find(const std::string& model) const;
  ActiveRecord* find(const std::string& model);
  /// The service put into service last (the API's "active"), or nullptr when none serves.
  const ActiveRecord* last() const { return services.empty() ? nullptr : &services.back(); }
  /// `r` is in service now, after every other: an earlier record of its model goes.
  void put(ActiveRecord r);
  /// `model` is no longer in service; returns whether it was.
  bool erase(const std::string& model);
};

/// What state.json holds.
struct DaemonState {
  InService active;  ///< the services in service ("services" in state.json, plus "active", the last, for older readers)
  std::map<std::string, std::string> last_active;  ///< model -> RFC 3339 of when it last served
  /// model -> commits pulled ahead (`modelctl pull`) and not deployed or removed since: spared
  /// from eviction and from the cleanup of older revisions ("pulled" in state.json).
  Pulled pulled;
};

/// Reads and writes state_dir.
class StateStore {
 public:
  explicit StateStore(std::filesystem::path state_dir);

  /// Creates state_dir and state_dir/deployments (0700); io_error naming the path. Blocks.
  Result<void> init();

  /// Reads state.json; an absent file is an empty state; a corrupt one is io_error naming it
  /// (never silently replaced: an operator must look). Reads the list of services (with the
  /// settings each was started with, "started", when recorded), or the single "active" object
  /// of a file written before it; a file without "pulled" has none. Blocks.
  Result<DaemonState> load() const;

  /// Replaces state.json atomically ("services" and, for older readers, "active"); io_error.
  /// Blocks (write, fsync of file and directory).
  Result<void> save(const DaemonState& state);

  /// Replaces deployments/ID.json atomically, and keeps at most `keep` deployment files
  /// (oldest deleted first); io_error naming the file. Blocks (write, fsync of file and directory).
  Result<void> save_deployment(const Deployment& d, std::size_t keep = 200);

  /// Deployments on disk, newest first, at most `limit`; unreadable files are skipped with a
  /// journal warning. Blocks (reads every record).
  std::vector<Deployment> load_history(std::size_t limit) const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace modeld::deploy
