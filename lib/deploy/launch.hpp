#pragma once
// launching (launch.cpp): the link switched, the drop-in written, the new service started.

#include "deploy/phase.hpp"

#include <filesystem>

namespace modeld::deploy {

/// What launching did: when it asked for the new service's start (ns since the epoch, just before
/// StartUnit) and the bytes of the new revision in the page cache right before (nullopt when it
/// could not measure).
struct Launched {
  std::int64_t start_requested_ns = 0;
  std::optional<std::uint64_t> bytes_resident_at_launch;
};

/// Proves with a stat per file (on the disk pool) that the files of the run's revision are still
/// those its manifest recorded at verification; checkpoint_incomplete ending "...; `refusing`"
/// ("not launching") otherwise.
boost::asio::awaitable<Result<void>> check_still_verified(Services& s, const Run& run, std::string_view refusing);

/// launching: switch models_dir/NAME to the new revision, write the drop-in, reload, measure
/// what of the revision is in the page cache, start; returns when the start was asked for.
boost::asio::awaitable<Result<Launched>> run_launching(Services& s, const Run& run);

/// The text of the drop-in of `model` (command, environment, working directory, timeouts), as
/// started_settings(model, model_dir) renders it; exposed for tests. Values are quoted per
/// systemd.syntax(7). `gpu_uuids` as in the overload below.
std::string render_dropin(const config::ModelConfig& model, const std::filesystem::path& model_dir,
                          const std::vector<std::string>& gpu_uuids);

/// The drop-in of `model` with its ExecStart=, Environment= and WorkingDirectory= lines from
/// `started` (the rest, stop timeout and comments, from `model`). With `started.gpu_ids` set it
/// also writes CUDA_DEVICE_ORDER=PCI_BUS_ID before the configured environment (which may override
/// it) and CUDA_VISIBLE_DEVICES=`gpu_uuids` joined by commas after it (empty for an empty list:
/// the server sees no GPU); `gpu_uuids` must be the UUIDs of `started.gpu_ids` in their order
/// (gpu_uuids() in gpu_watch.hpp) and is ignored when `started.gpu_ids` is unset. Pure.
std::string render_dropin(const config::ModelConfig& model, const StartedSettings& started,
                          const std::vector<std::string>& gpu_uuids);

/// The settings a service of `model` started from the drop-in render_dropin(model, model_dir)
/// writes runs with: the drop-in's lines come from this value.
StartedSettings started_settings(const config::ModelConfig& model, const std::filesystem::path& model_dir);

/// started_settings for the model's folder models_dir/NAME.
StartedSettings started_settings(Services& s, const config::ModelConfig& model);

/// Writes the model's drop-in into unit_dir, with `started` when given (a rollback restores the
/// old server as it ran) else as today's configuration renders it, and reloads systemd; returns
/// the settings written (what the service runs with once (re)started). With GPU ids in the
/// settings, their UUIDs come from NVML (on the disk pool, remembered for the process). Errors:
/// unit_failed naming a GPU id that is not visible, or that no NVIDIA GPU is (nothing written);
/// the service manager's (io_error, ...).
boost::asio::awaitable<Result<StartedSettings>> install_dropin(Services& s, const config::ModelConfig& model,
                                                               const std::optional<StartedSettings>& started = {});

}  // namespace modeld::deploy
