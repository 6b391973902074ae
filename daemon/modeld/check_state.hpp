#pragma once
// `modeld --check-state`: reads the daemon state in state_dir as a start would and says what it
// found and what the next start will do (docs/hardening.md "State recovery"). Read-only.

#include <filesystem>

namespace modeld {

/// Prints, for state.json and state.json.prev in `state_dir`, whether each reads and which
/// services it holds, then which one the next start uses (or that it rebuilds from the units
/// that run) and the deployment records that do not read; returns 0 when state.json reads (or
/// neither file exists: a first start), 1 otherwise. Blocks (reads state_dir); prints to stdout.
int check_state(const std::filesystem::path& state_dir);

}  // namespace modeld
