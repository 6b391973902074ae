#pragma once
// The narrow interface through which the control plane reads and drives deployments
// (design.md: "control reads deployment state through one narrow interface").

#include "deploy/deployment.hpp"
#include "util/error.hpp"
#include "wire/event.hpp"
#include "wire/models.hpp"
#include "wire/request.hpp"
#include "wire/status.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::deploy {

// The API's answers, events and requests, defined once in the wire stage (lib/wire).
using wire::Active;
using wire::DeployRequest;
using wire::Event;
using wire::EventKind;
using wire::ModelInfo;
using wire::PlannedEviction;
using wire::PlanReport;
using wire::PreflightCheck;
using wire::Removal;
using wire::RevisionInfo;
using wire::ServiceInfo;
using wire::VerifyProblem;
using wire::VerifyReport;
using wire::WatchdogStatus;
using wire::to_json;    // again: the overloads of the headers above join record.hpp's
using wire::to_string;

/// The event `kind` of deployment `d`, its fields copied from the record; pure.
Event deployment_event(EventKind kind, const Deployment& d);

/// What the control plane may ask of the Deployer; all calls happen on the io_context thread
/// (named Control, not Engine: in modeld "engine" means the inference server, vLLM or SGLang).
class Control {
 public:
  virtual ~Control() = default;
  /// The model in service, if any: of several, the one put into service last.
  virtual std::optional<Active> active() const = 0;
  /// Every service in service, in the order they were put into service (the last is active()).
  virtual std::vector<ServiceInfo> services() const = 0;
  /// The running deployment, else the most recent one, else nullopt.
  virtual std::optional<Deployment> current() const = 0;
  /// Deployments newest first, at most `limit`.
  virtual std::vector<Deployment> history(std::size_t limit) const = 0;
  /// One deployment by id; not_found when unknown.
  virtual Result<Deployment> get(const std::string& id) const = 0;
  /// Starts a deployment as `request` asks; unknown_model, deployment_running.
  virtual Result<Deployment> start(const DeployRequest& request) = 0;
  /// Takes `model` out of service (`modelctl stop`, POST /v1/models/{name}/stop): starts a
  /// record of kind stop whose one phase, stopping_old, stops its service and waits until nothing
  /// of it is left; from then on it is neither watched nor started at boot, and its files stay.
  /// A model that is not in service gives a record that ends succeeded at once, changed false.
  /// Errors: unknown_model; deployment_running as start().
  virtual Result<Deployment> stop(const std::string& model) = 0;
  /// Requests cancellation; not_found, deployment_ended.
  virtual Result<Deployment> cancel(const std::string& id) = 0;
  /// Configured models with their on-disk state; the store walk runs off the event loop (an
  /// Deployer answers without waiting behind its own disk work: see Deployer::models).
  virtual boost::asio::awaitable<std::vector<ModelInfo>> models() = 0;
  /// Dry run of planning and freeing_disk for `model` at `commit` (nullopt: its configured
  /// revision): lists the Hub, changes nothing on disk, and says whether deploying it would change
  /// nothing (PlanReport::already_serving: the no-op rule, with one probe of the serving model).
  /// Errors: unknown_model; the Hub's (hub_not_found, hub_unavailable, network_error, ...,
  /// messages naming the repository); plan_invalid for filters that drop needed files; io_error.
  virtual boost::asio::awaitable<Result<PlanReport>> plan(std::string model, bool allow_downtime,
                                                          std::optional<std::string> commit) = 0;
  /// Re-hashes and re-checks the on-disk revision of `model` (the one models_dir/NAME points to,
  /// else the newest verified one) on the disk pool; problems are a value, not an error. A clean
  /// result refreshes the manifest's file identities. Errors: unknown_model; not_found when no
  /// verified revision is on disk; deployment_running while a deployment runs, or another
  /// verify or rm is in progress; io_error when the manifest cannot be read or written.
  virtual boost::asio::awaitable<Result<VerifyReport>> verify(std::string model) = 0;
  /// Deletes the store folders and the link of `model` on the disk pool, never following a
  /// symlink out of models_dir. Errors: unknown_model (neither configured nor on disk);
  /// deployment_running when `model` is the active model (the message says so; the API answers
  /// it as 409 model_active), when a running deployment deploys or replaces it, or while a
  /// verify or rm is in progress; io_error (also when models_dir/NAME is a real folder, left alone).
  virtual boost::asio::awaitable<Result<Removal>> remove(std::string model) = 0;
  /// Deletes revision `commit` of `model` on the disk pool (and models_dir/NAME when it links
  /// there), and its pulled mark. Errors: unknown_model; model_active when it is the commit in
  /// service; not_found when that revision is not on disk; deployment_running as remove();
  /// bad_request for a commit that is not 40 hex digits; io_error.
  virtual boost::asio::awaitable<Result<Removal>> remove_revision(std::string model, std::string commit) = 0;
  /// Registers a listener for events; returns a token for unsubscribe().
  virtual std::uint64_t subscribe(std::function<void(const Event&)> listener) = 0;
  /// Removes a listener.
  virtual void unsubscribe(std::uint64_t token) = 0;
  /// Seconds since the daemon started.
  virtual double uptime_s() const = 0;
  /// The watchdog's records: the model watched now (or last) first, then every other model
  /// watched since the daemon started; empty when nothing was watched. Not pure, so engines
  /// without a watchdog (test fakes) need not implement it.
  virtual std::vector<WatchdogStatus> watchdogs() const { return {}; }
};

}  // namespace modeld::deploy
