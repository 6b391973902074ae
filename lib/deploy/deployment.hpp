#pragma once
// The deployment record as the daemon keeps it: the API's DEPLOYMENT (wire::Record, whose JSON
// the wire stage makes) and the bookkeeping that lets a restarted daemon continue or roll back.

#include "deploy/records.hpp"
#include "deploy/started.hpp"
#include "util/error.hpp"
#include "wire/record.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

namespace modeld::deploy {

// The API's words for a record, defined once in the wire stage (lib/wire/record.hpp).
using wire::FileProgress;
using wire::Kind;
using wire::Phase;
using wire::Progress;
using wire::State;
using wire::SwitchReport;
using wire::WarmReport;
using wire::kind_from_string;
using wire::phase_from_string;
using wire::state_from_string;
using wire::to_json;
using wire::to_string;

/// Wall-clock marks of a switch in ns since the epoch, 0 while not reached; internal, persisted
/// as each is reached, so a daemon restarted mid-switch still measures the whole outage.
struct SwitchMarks {
  std::int64_t stop_requested_ns = 0;   ///< just before StopUnit of the old service
  std::int64_t stop_done_ns = 0;        ///< nothing of the old service left (control group, ports)
  std::int64_t start_requested_ns = 0;  ///< just before StartUnit of the service that is to serve
  std::int64_t port_ns = 0;             ///< its readiness wait first saw the port accept a connection
  std::int64_t ready_ns = 0;            ///< its first token (or passing probe with health.completion = false)
};

/// The switch's outage from `m`, in seconds: from stop_requested (start_requested when nothing
/// was stopped) to ready, and its parts (negative spans read as 0). nullopt until a start and a
/// ready are marked.
std::optional<SwitchReport> switch_report_of(const SwitchMarks& m);

/// The current wall-clock time in ns since the epoch, as SwitchMarks holds it.
std::int64_t wall_clock_ns();

/// One deployment, running or ended: the fields the API shows (wire::Record) and the daemon's
/// own bookkeeping, persisted in state_dir (deploy/record_file.hpp) and never shown.
struct Deployment : wire::Record {
  // Internal bookkeeping that lets a restarted daemon continue or roll back (also persisted).
  /// The services in conflict with the model when it started (a stop: the one it stops), in the
  /// order they were put into service, each with the settings it was started with when
  /// recorded: stopping_old stops them, rolling_back starts them again with exactly those
  /// settings, not as today's configuration would render them. Every other service is left alone.
  std::vector<ActiveRecord> previous;
  /// `"restart": true` was asked for: restart the model even when it already serves that commit
  /// with the same settings.
  bool restart = false;
  bool old_stopped = false;                    ///< stopping_old began: a failure or cancel now rolls back
  /// allow_downtime and the disk plan must evict the active model: stopping_old runs right after
  /// planning, before freeing_disk (interface.md "Deployment phases and states").
  bool downtime_first = false;
  bool cancel_requested = false;
  /// Cleanup of the model's older revisions began (after health_checking, not cancellable): a
  /// restart that finds the deployment still in health_checking finishes it.
  bool cleanup_begun = false;
  SwitchMarks switch_marks;  ///< what switch_report is computed from
  /// The method of the switch strategy the run switches with (switch_strategy.hpp), chosen after
  /// planning and persisted before any of its steps; empty: restart (as in every record before).
  std::string switch_method;
  /// Why the run fell back to switch_method from another strategy mid-run; empty: it did not.
  std::string switch_fallback;
  /// The start time in ns since the epoch: orders deployments started in one second (ids and
  /// started_at have whole seconds) when the history is read back from state_dir; 0 in records
  /// written before it was kept.
  std::int64_t started_ns = 0;
  /// The record ended and its terminal journal line may not be written yet (state_dir only, never
  /// the API): the next start writes the line of a record modeld was killed before logging.
  bool end_unlogged = false;
};

}  // namespace modeld::deploy
