#pragma once
// Never restarting what serves (interface.md "Never restarting what serves"): after planning has
// resolved the revision to a commit, whether the deployment would only restart the model that
// already serves that commit with the same started settings (a no-op), must restart it (its
// settings changed, or a restart was asked for), or replaces something else.

#include "deploy/deployment.hpp"
#include "deploy/phase.hpp"
#include "deploy/records.hpp"
#include "deploy/started.hpp"

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <optional>
#include <string>

namespace modeld::deploy {

/// What a deployment is to the model in service.
enum class Redeploy {
  noop,               ///< that model serves that commit with the same settings: nothing to do if it is ready
  settings_changed,   ///< that model serves that commit, started with other settings (or unknown ones)
  restart_requested,  ///< that model serves that commit; "restart": true asks for a restart anyway
  not_serving         ///< another model, another commit, or nothing serves
};

/// A Redeploy with its reason for the journal: "environment changed (VLLM_X)", "restart requested".
struct RedeployCheck {
  Redeploy verdict = Redeploy::not_serving;
  std::string why;
};

/// Compares planned deployment `d` (its model, commit and restart flag) with the model in
/// service `active` and the settings its service would start with now (`now`). Pure.
RedeployCheck compare_with_serving(const Deployment& d, const std::optional<ActiveRecord>& active,
                                   const StartedSettings& now);

/// One cheap probe of a serving model (the model watcher's): errors say why it failed.
using ServingProbe = std::function<boost::asio::awaitable<Result<void>>(const config::ModelConfig&)>;

/// One readiness check of the run's model, which serves the run's commit: its unit is active,
/// its files still match their manifest (a stat per file, on the disk pool) and `probe` passes.
/// Returns nullopt when it is ready, else why not ("modeld-serve@m.service is failed"). Never fails.
boost::asio::awaitable<std::optional<std::string>> not_ready_reason(Services& s, const Run& run,
                                                                   const ServingProbe& probe);

}  // namespace modeld::deploy
