#pragma once
// The settings a model service was started with (interface.md "Never restarting what serves"):
// what changes the server (command, environment, working directory, GPUs), not what only
// changes how it is stopped (stop_timeout) or the drop-in's comments. Recorded per service in
// state.json and in a deployment's record, so a redeploy can tell whether the server must
// restart and a rollback can start the old server as it ran. No I/O here.

#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace modeld::deploy {

/// What a model service was started with; rendered from the configuration by
/// deploy::started_settings, the code that writes the drop-in's ExecStart=, Environment= and
/// WorkingDirectory= lines.
struct StartedSettings {
  std::vector<std::string> command;               ///< ExecStart= argv, placeholders filled in
  /// Environment= as configured (a hand-written CUDA_VISIBLE_DEVICES included); not the
  /// CUDA_VISIBLE_DEVICES the drop-in renders from gpu_ids (UUIDs are rendered, not compared)
  std::map<std::string, std::string> environment;
  std::string working_directory;                   ///< WorkingDirectory=: models_dir/NAME
  unsigned gpus = 0;                               ///< serve.gpus
  /// serve.port; 0 in settings recorded before it was kept (the configuration's is used then).
  std::uint16_t port = 0;
  /// serve.gpu_ids (NVML indices, CUDA_VISIBLE_DEVICES rendered from them by UUID); nullopt: every
  /// GPU (also in settings recorded before it was kept).
  std::optional<std::vector<unsigned>> gpu_ids;

  friend bool operator==(const StartedSettings&, const StartedSettings&) = default;
};

/// What differs from `was` to `now`, one item per setting, for a journal line: "command changed",
/// "environment changed (NCCL_DEBUG, VLLM_X)" (names of variables added, removed or changed,
/// never their values: they may be secrets), "working directory changed", "GPUs changed (2 -> 4)";
/// empty when equal.
std::vector<std::string> settings_changed(const StartedSettings& was, const StartedSettings& now);

/// The JSON form kept in state.json and in deployment records.
nlohmann::json to_json(const StartedSettings& s);

/// Reads what to_json wrote; bad_request naming the field when malformed.
Result<StartedSettings> started_settings_from_json(const nlohmann::json& j);

}  // namespace modeld::deploy
