#pragma once
// The narrow interface through which the control plane reads and drives deployments
// (design.md: "control reads deployment state through one narrow interface").

#include "deploy/deployment.hpp"
#include "util/error.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// The model in service now.
struct Active {
  std::string model;
  std::string commit;
  std::string unit;
  std::uint16_t port = 0;
  std::string since;  ///< RFC 3339
};

/// One configured model and what is on disk for it (GET /v1/models).
struct ModelInfo {
  std::string name, repo, revision;
  std::optional<std::string> commit;  ///< the verified commit on disk, if any
  std::string state;                  ///< "absent", "partial", "verified", "corrupt"
  std::uint64_t size_bytes = 0;
  bool active = false;
  bool pinned = false;
  std::optional<std::string> last_active;  ///< RFC 3339
};

/// An event for the SSE stream: kind is "phase", "progress" or "state"; data holds at least
/// id, model and the new phase, progress or state.
struct Event {
  std::string kind;
  std::string data_json;
};

/// What the control plane may ask of the deployment engine. All calls happen on the
/// io_context thread.
class Engine {
 public:
  virtual ~Engine() = default;
  /// The model in service, if any.
  virtual std::optional<Active> active() const = 0;
  /// The running deployment, else the most recent one, else nullopt.
  virtual std::optional<Deployment> current() const = 0;
  /// Deployments newest first, at most `limit`.
  virtual std::vector<Deployment> history(std::size_t limit) const = 0;
  /// One deployment by id; not_found when unknown.
  virtual Result<Deployment> get(const std::string& id) const = 0;
  /// Starts a deployment of `model`; unknown_model, deployment_running.
  virtual Result<Deployment> start(const std::string& model, bool allow_downtime) = 0;
  /// Requests cancellation; not_found, deployment_ended.
  virtual Result<Deployment> cancel(const std::string& id) = 0;
  /// Configured models with their on-disk state.
  virtual std::vector<ModelInfo> models() const = 0;
  /// Registers a listener for events; returns a token for unsubscribe().
  virtual std::uint64_t subscribe(std::function<void(const Event&)> listener) = 0;
  /// Removes a listener.
  virtual void unsubscribe(std::uint64_t token) = 0;
  /// Seconds since the daemon started.
  virtual double uptime_s() const = 0;
};

}  // namespace modeld::deploy
