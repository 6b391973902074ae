#pragma once
// GPU memory across a model switch (gpu-facts.md): the per-GPU baseline measured while no model
// server runs, persisted in state_dir/gpu-baseline.json so it survives a daemon restart; the
// wait in stopping_old until every GPU is back at it; the free-memory check before launching.

#include "deploy/phases.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>

namespace modeld::deploy {

/// Memory above the baseline that still counts as "back" (allocator noise, the driver's own
/// bookkeeping), in bytes.
inline constexpr std::uint64_t kGpuSlackBytes = 256ull << 20;

/// After the old model's service is gone (`compare`): waits until every GPU's used memory is back
/// at the recorded baseline (NVML polled on the disk pool every 500 ms; the baseline file read
/// and written there too, never on the event loop) until `deadline`; then,
/// and also when nothing was stopped (`compare` false), records a fresh baseline. Without NVML
/// (no GPU) it does nothing; without a recorded baseline it only records one. stop_timeout naming
/// each GPU still above its baseline and the processes holding it.
boost::asio::awaitable<Result<void>> wait_gpu_memory_back(Services& s, const Run& run,
                                                          std::chrono::steady_clock::time_point deadline, bool compare);

/// The same for a switch that stops only some services: `freed` the GPUs of the stopped ones
/// (nullopt: every GPU), `still_busy` those of the services that keep serving.
/// (Until the per-GPU wait lands this compares every GPU.)
inline boost::asio::awaitable<Result<void>> wait_gpu_memory_back(Services& s, const Run& run,
                                                                 std::chrono::steady_clock::time_point deadline,
                                                                 bool compare, const config::GpuSet& freed,
                                                                 const std::vector<config::GpuSet>& still_busy) {
  (void)freed;
  (void)still_busy;
  return wait_gpu_memory_back(s, run, deadline, compare);
}

/// Before launching: the first `serve.gpus` GPUs are visible and each has `serve.gpu_memory`
/// bytes free; unit_failed naming the GPUs short of memory and who holds it. Nothing to check
/// when `serve.gpus` is 0.
boost::asio::awaitable<Result<void>> check_gpus_for_launch(Services& s, const Run& run);

}  // namespace modeld::deploy
