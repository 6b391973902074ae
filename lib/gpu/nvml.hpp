#pragma once
// GPU awareness through NVIDIA's NVML, loaded at run time with dlopen("libnvidia-ml.so.1") so
// that a host without an NVIDIA driver runs unchanged (design.md: "absent GPU is a normal answer,
// not an error"). Functions are resolved by the versioned names NVIDIA's nvml.h maps its calls to
// (shared/docs/gpu-facts.md): nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
// nvmlDeviceGetMemoryInfo (v1: reserved memory counted as used) and _v2 when present,
// nvmlDeviceGetComputeRunningProcesses_v3.
//
// Every NVML call blocks (the driver may take a while, more on a busy or lost GPU): callers on
// the event loop run Nvml::snapshot() on the thread pool (util::on_pool) and keep the rest —
// pure functions of snapshots — on the loop.

#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace modeld::gpu {

/// A process holding memory on one GPU, as nvmlDeviceGetComputeRunningProcesses_v3 lists it.
struct GpuProcess {
  std::uint32_t pid = 0;                  ///< as NVML reports it (the host's PID namespace)
  std::optional<std::uint64_t> used_bytes;///< nullopt when NVML says "not available" (no permission)
  std::string name;                       ///< /proc/PID/comm, empty when that is not readable here
};

/// One GPU's state at the time of a snapshot; byte counts as NVML reports them.
struct Gpu {
  unsigned index = 0;          ///< NVML index (the CUDA order when CUDA_DEVICE_ORDER=PCI_BUS_ID)
  std::string uuid;            ///< "GPU-..." stable across reboots and daemon restarts
  std::string name;            ///< marketing name, "NVIDIA H200"
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;  ///< v1 memory info: includes the driver's reservation (~615 MiB on an idle H200)
  std::uint64_t free_bytes = 0;
  std::optional<std::uint64_t> reserved_bytes;  ///< from nvmlDeviceGetMemoryInfo_v2 when the driver has it
  std::vector<GpuProcess> processes;            ///< compute processes holding memory, in NVML's order
  std::string processes_error;  ///< why the process list is unknown (NVML error string); empty when it is known
};

/// All GPUs NVML sees, in index order.
struct Snapshot {
  std::vector<Gpu> gpus;
};

/// A set of GPUs by NVML index: nullopt means every GPU of the host, an empty list none (the
/// same type as config::GpuSet, which this stage cannot name).
using GpuIndices = std::optional<std::vector<unsigned>>;

/// Whether GPU `index` is in `set` (always when `set` is every GPU).
bool contains(const GpuIndices& set, unsigned index);

/// "0,1,2,3" (in the list's order), "all" (nullopt) or "none" (empty), for messages.
std::string describe_indices(const GpuIndices& set);

/// The NVML library, loaded on first use; thread-safe (one call at a time).
class Nvml {
 public:
  /// Uses $MODELD_NVML_LIBRARY when set and not empty (tests point it at a fake), else
  /// "libnvidia-ml.so.1" found by the dynamic loader's search path.
  Nvml();

  /// Uses `library`, a soname for the loader's search path or a file path.
  explicit Nvml(std::string library);

  /// Calls nvmlShutdown if nvmlInit succeeded, and unloads the library.
  ~Nvml();

  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  /// Reads every GPU's identity, memory and compute processes. Blocking: run it on a thread
  /// pool. nullopt when the library is not installed (no NVIDIA driver: a normal answer). Errors
  /// (unit_failed) name the library and the NVML function and error string: a library that
  /// loads but lacks a required symbol, nvmlInit_v2 failing ("Driver Not Loaded"), or a device
  /// query failing; nvmlInit is retried at the next call after a failure.
  Result<std::optional<Snapshot>> snapshot();

  /// The UUIDs ("GPU-...") of the GPUs with NVML indices `ids`, in the order of `ids`, for
  /// CUDA_VISIBLE_DEVICES. Remembered for the life of this instance (a GPU's UUID does not change
  /// while the host runs), so only an index not seen before takes a snapshot(). Blocking when it
  /// does: run it on a thread pool. Errors: unit_failed naming the first index that is not
  /// visible ("GPU 5 is not visible: 4 GPUs") or, without NVML, that no NVIDIA GPU is visible;
  /// snapshot()'s errors. An empty `ids` is an empty answer, NVML untouched.
  Result<std::vector<std::string>> uuids(const std::vector<unsigned>& ids);

  /// The library name or path this instance loads.
  const std::string& library() const { return library_; }

 private:
  struct Api;
  Result<bool> load_locked();  // false: the library is absent

  std::string library_;
  std::mutex mutex_;
  std::unique_ptr<Api> api_;
  bool initialized_ = false;
  std::mutex uuids_mutex_;
  std::map<unsigned, std::string> uuids_;  // index -> UUID, as snapshots showed them
};

/// "20.0 GiB", "615 MiB", "12 KiB", "0 B": binary units as nvidia-smi reports GPU memory.
std::string format_gib(std::uint64_t bytes);

/// One entry per GPU with a listed compute process, joined by "; ":
/// "GPU 0 (NVIDIA H200): 20.0 GiB held by pid 1234 (python3), pid 1240 (VLLM::Worker)"; a GPU whose
/// process list NVML refused says so ("GPU 1 (...): processes unknown: Insufficient Permissions").
/// Limited to the GPUs whose index is in `only` when it is not empty; "" when nothing is listed.
std::string describe_holders(const Snapshot& snap, const std::vector<unsigned>& only = {});

/// Each GPU's used memory (Gpu::used_bytes) keyed by UUID, measured while no model server runs,
/// so that "the memory came back" compares against the driver's own use, never against zero.
/// Persisted in the deploy stage's state file, so it survives a daemon restart.
struct Baseline {
  std::map<std::string, std::uint64_t> used_bytes;  ///< UUID -> bytes

  bool operator==(const Baseline&) const = default;
};

/// The baseline of `snap`: every GPU's used bytes now.
Baseline baseline_of(const Snapshot& snap);

/// `recorded` with the GPUs of `snap` in `remeasure` (every GPU when nullopt) set to their used
/// bytes now; every other GPU keeps its recorded value (or stays unrecorded), so a GPU that a
/// serving model uses is never re-measured under it.
Baseline baseline_updated(const Baseline& recorded, const Snapshot& snap, const GpuIndices& remeasure);

/// {"used_bytes": {"GPU-...": 648019968, ...}}.
nlohmann::json to_json(const Baseline& b);

/// Parses to_json()'s output; io_error naming the bad key or value (the caller adds the file).
Result<Baseline> baseline_from_json(const nlohmann::json& j);

/// One GPU whose memory is still above its baseline.
struct Excess {
  unsigned index = 0;
  std::string uuid;
  std::string name;
  std::uint64_t above_bytes = 0;       ///< used now minus used at the baseline
  std::vector<GpuProcess> processes;   ///< who holds memory on it now
};

/// The GPUs of `now` in `only` (every GPU when nullopt, none when empty) whose used memory
/// exceeds `before` by more than `slack_bytes`; empty when each of them is back. GPUs not in the
/// baseline (by UUID) are not compared.
std::vector<Excess> memory_back_to(const Snapshot& now, const Baseline& before, std::uint64_t slack_bytes,
                                   const GpuIndices& only = std::nullopt);

/// "GPU 0 (NVIDIA H200): 20.0 GiB above the baseline, held by pid 1234 (python3)", joined by "; ".
std::string describe_excess(const std::vector<Excess>& excess);

/// Whether the first `gpus_needed` GPUs (inference servers take the first N visible devices) each
/// have at least `bytes_per_gpu` free. unit_failed when fewer GPUs are visible ("needs 8 GPUs,
/// 1 visible") or naming each GPU short of memory, its free bytes and who holds its memory.
Result<void> check_free(const Snapshot& snap, unsigned gpus_needed, std::uint64_t bytes_per_gpu);

/// As check_free() above; `snap` is Nvml::snapshot()'s answer: no NVML (nullopt) and
/// `gpus_needed` > 0 is unit_failed ("no NVIDIA GPU visible").
Result<void> check_free(const std::optional<Snapshot>& snap, unsigned gpus_needed, std::uint64_t bytes_per_gpu);

/// Whether each GPU of `ids` (NVML indices, as serve.gpu_ids lists them) is visible and has at
/// least `bytes_per_gpu` free. unit_failed naming the first index not visible ("GPU 5 is not
/// visible: 4 GPUs"), else each GPU short of memory, its free bytes and who holds its memory.
/// An empty `ids` needs nothing.
Result<void> check_free_on(const Snapshot& snap, const std::vector<unsigned>& ids, std::uint64_t bytes_per_gpu);

/// As check_free_on() above; `snap` is Nvml::snapshot()'s answer: no NVML (nullopt) with a
/// non-empty `ids` is unit_failed ("GPU 0 is not visible: no NVIDIA GPU ...").
Result<void> check_free_on(const std::optional<Snapshot>& snap, const std::vector<unsigned>& ids,
                           std::uint64_t bytes_per_gpu);

/// The UUIDs of the GPUs with NVML indices `ids`, in the order of `ids`; unit_failed naming the
/// first index that `snap` does not show ("GPU 5 is not visible: 4 GPUs").
Result<std::vector<std::string>> uuids_of(const Snapshot& snap, const std::vector<unsigned>& ids);

/// A snapshot as JSON, for logs and the device probe: {"gpus": [{"index", "uuid", "name",
/// "total_bytes", "used_bytes", "free_bytes", "reserved_bytes"?, "processes": [{"pid",
/// "used_bytes"?, "name"}], "processes_error"?}]}.
nlohmann::json to_json(const Snapshot& snap);

}  // namespace modeld::gpu
