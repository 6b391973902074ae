#pragma once
// cleanup (cleanup.cpp, after health_checking and shown as it): older revisions deleted.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// What cleanup removed.
struct Cleaned {
  std::uint64_t bytes_freed = 0;  ///< bytes of older revisions deleted
};

/// cleanup (after health_checking, shown as that phase): on the disk pool, deletes the revisions
/// of the run's model other than `keep_commit` (the commit in service) and the one models_dir/NAME
/// links, and those pulled ahead (Run::pulled). Not cancellable; safe to run again. Errors:
/// io_error (the deployment still succeeds).
boost::asio::awaitable<Result<Cleaned>> run_cleanup(Services& s, const Run& run, const std::string& keep_commit);

}  // namespace modeld::deploy
