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
#include <string_view>
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

/// Where the state modeld starts from came from (StateStore::load_or_fall_back).
enum class StateSource {
  fresh,     ///< no state.json and no state.json.prev: a first start
  current,   ///< state.json
  previous,  ///< state.json did not read (or was missing); its copy state.json.prev did
  rebuilt,   ///< neither read: to be rebuilt from the units that run and the store
};

/// What load_or_fall_back found: the state, its source, and a sentence per file that did not read
/// ("PATH: why"), for the journal.
struct LoadedState {
  DaemonState state;
  StateSource source = StateSource::fresh;
  std::vector<std::string> problems;
};

/// "state.json", "state.json.prev", "rebuilt" or "fresh".
std::string_view to_string(StateSource source);

/// Reads one deployment record (deployments/ID.json); the error names the file and what is wrong
/// (unreadable, not JSON, a field missing or of the wrong type). Blocks.
Result<Deployment> read_deployment_file(const std::filesystem::path& path);

/// Reads and writes state_dir.
class StateStore {
 public:
  explicit StateStore(std::filesystem::path state_dir);

  /// Creates state_dir and state_dir/deployments (0700); io_error naming the path. Blocks.
  Result<void> init();

  /// Reads state.json strictly: an absent file is an empty state; one that cannot be read, is not
  /// JSON, is not an object with "services" (or, from before the list, "active") or holds a field
  /// of the wrong type is io_error naming the file and what is wrong. Reads the list of services
  /// (with the settings each was started with, "started", when recorded), or the single "active"
  /// object of a file written before it; a file without "pulled" has none. Blocks.
  Result<DaemonState> load() const;

  /// Reads `path` (state.json or state.json.prev) as load() does; io_error naming it. Blocks.
  static Result<DaemonState> read_state_file(const std::filesystem::path& path);

  /// What modeld starts from (state recovery rules, docs/hardening.md): state.json when it reads;
  /// else state.json.prev, the copy of it save() keeps beside it; else nothing, for the
  /// caller to rebuild from the units that run and the store. A state.json that does not read is
  /// copied to state.json.bad (for the operator) before anything replaces it; never fails, never
  /// throws: the reasons are in the result, for the journal. Blocks.
  LoadedState load_or_fall_back();

  /// Replaces state.json atomically ("services" and, for older readers, "active"), then its copy
  /// state.json.prev the same way, so a state.json damaged later (by hand, a disk, a tool) has a
  /// fallback; io_error naming the file. Blocks (two writes, each fsynced with its directory).
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
