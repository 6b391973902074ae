#pragma once
// Durable daemon state in state_dir: which model serves (state.json) and one JSON file per
// deployment (deployments/ID.json), each replaced atomically, so a restarted daemon knows the
// active model and any unfinished deployment.

#include "deploy/deployment.hpp"
#include "deploy/records.hpp"
#include "util/error.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// What state.json holds.
struct DaemonState {
  std::optional<ActiveRecord> active;
  std::map<std::string, std::string> last_active;  ///< model -> RFC 3339 of when it last served
};

/// Reads and writes state_dir.
class StateStore {
 public:
  explicit StateStore(std::filesystem::path state_dir);

  /// Creates state_dir and state_dir/deployments (0700); io_error naming the path.
  Result<void> init();

  /// Reads state.json; an absent file is an empty state; a corrupt one is io_error naming it
  /// (never silently replaced: an operator must look).
  Result<DaemonState> load() const;

  /// Replaces state.json atomically.
  Result<void> save(const DaemonState& state);

  /// Replaces deployments/ID.json atomically, and keeps at most `keep` deployment files
  /// (oldest deleted first).
  Result<void> save_deployment(const Deployment& d, std::size_t keep = 200);

  /// Deployments on disk, newest first, at most `limit`; unreadable files are skipped with a
  /// journal warning.
  std::vector<Deployment> load_history(std::size_t limit) const;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

}  // namespace modeld::deploy
