#pragma once
// The live part of the running deployment (Deployer::Running), shared by the driver's files:
// deployer.cpp (start, the steps, rollback, finish), boot.cpp (boot recovery and reload),
// store_requests.cpp (models, plan, verify, rm), queries.cpp (progress, STATUS=, deploy::Control's
// queries) and watching.cpp (model watchers, placement checks). Private to lib/deploy; no phase
// includes it.

#include "deploy/deployer.hpp"

#include <boost/asio/cancellation_signal.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

/// The live part of the running deployment.
struct Deployer::Running {
  explicit Running(Services s) : services(std::move(s)) {}
  /// The services with the configuration this deployment started with: a reload never changes
  /// what a running deployment does.
  Services services;
  Deployment record;
  std::unique_ptr<Run> run;                  ///< what the phases read; changed by the driver only
  std::unique_ptr<Decisions> decisions;      ///< the phases' sink (RunDecisions)
  std::vector<PlannedStep> steps;            ///< the plan, from the record (kind, downtime_first)
  std::optional<PlannedStep> step;           ///< the step that runs now; nullopt before the first
  bool rolling_back = false;                 ///< rolling_back runs (not a step of the plan)
  bool new_serves = false;                   ///< health_checking passed: this deployment's model serves
  bool interrupted = false;                  ///< a shutdown cut it short: left running for the next start
  /// A stop of a model no longer configured: the table its phase reads (name, port from its settings).
  std::optional<config::ModelConfig> own_model;
  std::set<std::string> not_restored;        ///< models a failed rollback could not bring back: not watched
  boost::asio::cancellation_signal cancel;  ///< bound to the phase that runs now
  std::chrono::steady_clock::time_point last_journal_progress{};
  std::chrono::steady_clock::time_point last_status{};
};

/// What the journal and refusals call a record of kind `k`: "deployment", "pull" or "stop".
std::string_view noun_of(Kind k);

}  // namespace modeld::deploy
