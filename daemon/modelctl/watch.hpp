#pragma once
// modelctl watch: a live view of the daemon that follows GET /v1/events.

#include "modelctl/client.hpp"
#include "modelctl/format.hpp"

#include <string>

namespace modelctl {

/// What and how `modelctl watch` shows.
struct WatchOptions {
  std::string model;  ///< only deployments of this model; empty: every model
  bool json = false;  ///< one JSON object per line: the status first, then each event
  bool tty = false;   ///< stdout is a terminal: redraw one view in place
  Style style;
};

/// Follows the daemon's events until Ctrl-C (then exit_ok) or until the daemon goes away (then
/// the contract's one line on stderr and exit_unreachable). On a terminal the view (active
/// model, the running deployment's phase and per-file progress, or the last deployment's
/// result) is redrawn in place; otherwise one plain line per event, progress at most every
/// plain_progress_interval; with `json`, NDJSON: {"event": "status", "data": GET /v1/status},
/// then {"event": KIND, "data": EVENT DATA} for every event. exit_refused when `model` is not
/// a configured model.
int watch(Daemon& daemon, const WatchOptions& options);

}  // namespace modelctl
