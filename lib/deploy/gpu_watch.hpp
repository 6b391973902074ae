#pragma once
// GPU memory across a model switch (gpu-facts.md): the per-GPU baseline, each GPU measured while
// no model server uses it, persisted in state_dir/gpu-baseline.json so it survives a daemon
// restart; the wait in stopping_old until the GPUs just freed are back at it; the free-memory
// check before launching; the GPU UUIDs a drop-in's CUDA_VISIBLE_DEVICES names.

#include "deploy/phase.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace modeld::deploy {

/// Memory above the baseline that still counts as "back" (allocator noise, the driver's own
/// bookkeeping), in bytes.
inline constexpr std::uint64_t kGpuSlackBytes = 256ull << 20;

/// After services were stopped (`compare`): waits until every GPU in `freed` (the union of the
/// stopped services' GPU sets; nullopt: every GPU) that no set of `still_busy` (the GPU sets of
/// the services that keep serving) uses is back at its recorded baseline, NVML polled on the disk
/// pool every 500 ms until `deadline`; GPUs outside `freed` never delay it, and a freed GPU
/// without a recorded baseline is not waited for. Then, and also when nothing was stopped
/// (`compare` false), records a fresh baseline for the GPUs no set of `still_busy` uses, keeping
/// the recorded values of the others (a GPU a serving model uses is never re-measured). The
/// baseline file is read and written on the disk pool. Without NVML (no GPU) it does nothing.
/// Errors: stop_timeout naming each GPU still above its baseline and the processes holding it;
/// cancelled; NVML's (unit_failed).
boost::asio::awaitable<Result<void>> wait_gpu_memory_back(Services& s, const Run& run,
                                                          std::chrono::steady_clock::time_point deadline, bool compare,
                                                          const config::GpuSet& freed,
                                                          const std::vector<config::GpuSet>& still_busy);

/// Before launching: with `serve.gpu_ids` set, each of those GPUs is visible and has
/// `serve.gpu_memory` bytes free (nothing to check for an empty list); without it, the first
/// `serve.gpus` GPUs are visible and each has that much free (nothing to check when `serve.gpus`
/// is 0). NVML is read on the disk pool. unit_failed naming a GPU that is not visible, or the GPUs
/// short of memory and who holds it.
boost::asio::awaitable<Result<void>> check_gpus_for_launch(Services& s, const Run& run);

/// What NVML shows now of the GPUs a server with `serve` takes, memory aside (the pre-flight).
struct GpuVisibility {
  enum class Verdict { visible, not_visible, unknown };
  Verdict verdict = Verdict::visible;
  /// "GPU 0,1 visible", "GPU 5 is not visible: 2 GPUs", "needs 8 GPUs, 2 visible: ...", the
  /// "no NVIDIA GPU is visible" of a host without NVML, or NVML's error (unknown).
  std::string detail;
};

/// Whether every GPU of `serve.gpu_ids` (without it, the first `serve.gpus`) is visible to NVML
/// now (NVML read on the disk pool; nothing to check for `gpu_ids = []` or `gpus = 0`). A host
/// without NVML is not_visible when a GPU is needed (launching would refuse it the same way); an
/// NVML that fails (Driver Not Loaded, a device query) is unknown. Never an error.
boost::asio::awaitable<GpuVisibility> gpus_visible(Services& s, const config::ServeConfig& serve);

/// The UUIDs of the GPUs with NVML indices `ids`, in their order, for CUDA_VISIBLE_DEVICES;
/// remembered for the process (gpu::Nvml::uuids), NVML read on the disk pool when an index was not
/// seen before. unit_failed naming an index that is not visible, or that no NVIDIA GPU is.
boost::asio::awaitable<Result<std::vector<std::string>>> gpu_uuids(Services& s, const std::vector<unsigned>& ids);

}  // namespace modeld::deploy
