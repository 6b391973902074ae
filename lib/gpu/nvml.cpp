#include "gpu/nvml.hpp"

#include "util/files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <cstdlib>

namespace modeld::gpu {

namespace {

// The few NVML declarations modeld uses, as NVIDIA's nvml.h has them (Debian 12 main ships no
// nvml.h). Layouts must match the versioned functions resolved below: the _v3 process call
// fills 24-byte entries (pid, usedGpuMemory, gpuInstanceId, computeInstanceId), twice the v1
// entry's 16 bytes; reading one layout as the other misreads every PID after the first.
extern "C" {
using nvmlReturn_t = int;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlProcessInfo_v3_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
}
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlMemory_v2_t) == 40);
static_assert(sizeof(nvmlProcessInfo_v3_t) == 24);

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kInsufficientSize = 7;                      // NVML_ERROR_INSUFFICIENT_SIZE
constexpr unsigned long long kValueNotAvailable = ~0ULL;           // NVML_VALUE_NOT_AVAILABLE
constexpr unsigned kMemoryV2Version = sizeof(nvmlMemory_v2_t) | (2u << 24);  // NVML_STRUCT_VERSION(Memory, 2)
constexpr unsigned kNameBuffer = 96;                               // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidBuffer = 96;                               // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr std::size_t kMaxProcesses = 4096;  // a bound on what one GPU's list may make us allocate

constexpr Errc kGpuErrc = Errc::unit_failed;

std::string gpu_label(const Gpu& g) { return fmt::format("GPU {} ({})", g.index, g.name); }

std::string pid_list(const std::vector<GpuProcess>& procs) {
  std::vector<std::string> items;
  for (const auto& p : procs)
    items.push_back(p.name.empty() ? fmt::format("pid {}", p.pid) : fmt::format("pid {} ({})", p.pid, p.name));
  return fmt::format("{}", fmt::join(items, ", "));
}

// "20.0 GiB held by pid 1 (a), pid 2 (b)"; "" when no process is listed and the list is known.
std::string holders_text(const Gpu& g) {
  if (g.processes.empty()) {
    return g.processes_error.empty() ? std::string() : "processes unknown: " + g.processes_error;
  }
  std::uint64_t sum = 0;
  bool known = false;
  for (const auto& p : g.processes) {
    if (p.used_bytes) {
      sum += *p.used_bytes;
      known = true;
    }
  }
  return (known ? format_gib(sum) + " held by " : std::string("held by ")) + pid_list(g.processes);
}

// The GPU of `snap` with NVML index `index`, or nullptr.
const Gpu* find_gpu(const Snapshot& snap, unsigned index) {
  for (const auto& g : snap.gpus)
    if (g.index == index) return &g;
  return nullptr;
}

Error not_visible(unsigned index, std::size_t visible) {
  return make_error(kGpuErrc, fmt::format("GPU {} is not visible: {} GPU{}", index, visible, visible == 1 ? "" : "s"));
}

Error no_nvml(unsigned index, const std::string& library) {
  return make_error(kGpuErrc, fmt::format("GPU {} is not visible: no NVIDIA GPU ({} not found)", index, library));
}

// "GPU 1 (NVIDIA H200): 20.4 GiB free of 140.4 GiB, 119.0 GiB held by pid 7"
std::string short_of_text(const Gpu& g) {
  std::string holders = holders_text(g);
  return fmt::format("{}: {} free of {}, {}", gpu_label(g), format_gib(g.free_bytes), format_gib(g.total_bytes),
                     holders.empty() ? fmt::format("{} used, no process listed", format_gib(g.used_bytes)) : holders);
}

}  // namespace

bool contains(const GpuIndices& set, unsigned index) {
  return !set || std::find(set->begin(), set->end(), index) != set->end();
}

std::string describe_indices(const GpuIndices& set) {
  if (!set) return "all";
  if (set->empty()) return "none";
  return fmt::format("{}", fmt::join(*set, ","));
}

// The resolved entry points. Optional ones are null when the library lacks them.
struct Nvml::Api {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*device_count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*memory_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;  // optional
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v3_t*) = nullptr;

  std::string describe(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? fmt::format("{} (NVML error {})", s, r) : fmt::format("NVML error {}", r);
  }
};

namespace {
std::string default_library() {
  const char* env = std::getenv("MODELD_NVML_LIBRARY");
  return env && *env ? std::string(env) : std::string("libnvidia-ml.so.1");
}
}  // namespace

Nvml::Nvml() : Nvml(default_library()) {}

Nvml::Nvml(std::string library) : library_(std::move(library)) {}

Nvml::~Nvml() {
  // The library itself stays mapped: unloading a driver library that may have left threads or
  // exit handlers behind risks a crash at exit, and one mapping per process costs nothing.
  if (api_ && initialized_) api_->shutdown();
}

Result<bool> Nvml::load_locked() {
  if (api_) return true;
  dlerror();
  void* h = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    // A soname the loader does not find is a host without the NVIDIA driver. A path that exists
    // but does not load (wrong architecture, missing dependency) is a broken installation.
    std::error_code ec;
    if (library_.find('/') != std::string::npos && std::filesystem::exists(library_, ec)) {
      return make_error(kGpuErrc, fmt::format("{}: cannot load: {}", library_, why ? why : "dlopen failed"));
    }
    return false;
  }
  auto api = std::make_unique<Api>();
  api->handle = h;
  std::vector<std::string_view> missing;
  auto resolve = [&](auto& fn, const char* sym, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, sym));
    if (!fn && required) missing.push_back(sym);
  };
  resolve(api->init, "nvmlInit_v2", true);
  resolve(api->shutdown, "nvmlShutdown", true);
  resolve(api->error_string, "nvmlErrorString", true);
  resolve(api->device_count, "nvmlDeviceGetCount_v2", true);
  resolve(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2", true);
  resolve(api->uuid, "nvmlDeviceGetUUID", true);
  resolve(api->name, "nvmlDeviceGetName", true);
  resolve(api->memory, "nvmlDeviceGetMemoryInfo", true);
  resolve(api->memory_v2, "nvmlDeviceGetMemoryInfo_v2", false);
  resolve(api->processes, "nvmlDeviceGetComputeRunningProcesses_v3", true);
  if (!missing.empty()) {
    // Too old a driver (the _v3 process call came with R510); refuse rather than guess layouts.
    return make_error(kGpuErrc, fmt::format("{}: lacks {} (NVIDIA driver too old?)", library_, fmt::join(missing, ", ")));
  }
  api_ = std::move(api);
  return true;
}

Result<std::optional<Snapshot>> Nvml::snapshot() {
  std::lock_guard lock(mutex_);
  auto loaded = load_locked();
  if (!loaded) return loaded.error();
  if (!*loaded) return std::optional<Snapshot>{};
  const Api& api = *api_;
  auto fail = [&](std::string what, nvmlReturn_t r) {
    return make_error(kGpuErrc, fmt::format("{}: {}: {}", library_, what, api.describe(r)));
  };

  if (!initialized_) {
    if (nvmlReturn_t r = api.init(); r != kSuccess) return fail("nvmlInit_v2", r);
    initialized_ = true;
  }

  unsigned count = 0;
  if (nvmlReturn_t r = api.device_count(&count); r != kSuccess) return fail("nvmlDeviceGetCount_v2", r);

  Snapshot snap;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = api.handle_by_index(i, &dev); r != kSuccess) {
      return fail(fmt::format("nvmlDeviceGetHandleByIndex_v2({})", i), r);
    }
    Gpu g;
    g.index = i;
    char buf[std::max(kNameBuffer, kUuidBuffer) + 1] = {};
    if (nvmlReturn_t r = api.uuid(dev, buf, kUuidBuffer); r != kSuccess) {
      return fail(fmt::format("nvmlDeviceGetUUID(GPU {})", i), r);
    }
    g.uuid = buf;
    std::fill(std::begin(buf), std::end(buf), '\0');
    if (nvmlReturn_t r = api.name(dev, buf, kNameBuffer); r != kSuccess) {
      return fail(fmt::format("nvmlDeviceGetName(GPU {})", i), r);
    }
    g.name = buf;

    nvmlMemory_t mem{};
    if (nvmlReturn_t r = api.memory(dev, &mem); r != kSuccess) {
      return fail(fmt::format("nvmlDeviceGetMemoryInfo(GPU {})", i), r);
    }
    g.total_bytes = mem.total;
    g.used_bytes = mem.used;
    g.free_bytes = mem.free;
    if (api.memory_v2) {
      nvmlMemory_v2_t m2{};
      m2.version = kMemoryV2Version;
      // Optional detail: a driver that refuses v2 still gave us v1's numbers.
      if (api.memory_v2(dev, &m2) == kSuccess) g.reserved_bytes = m2.reserved;
    }

    // The list may grow between the sizing answer and the next call: retry a few times.
    std::vector<nvmlProcessInfo_v3_t> infos(32);
    nvmlReturn_t r = kSuccess;
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned n = static_cast<unsigned>(infos.size());
      r = api.processes(dev, &n, infos.data());
      if (r == kSuccess) {
        infos.resize(std::min<std::size_t>(n, infos.size()));
        break;
      }
      if (r != kInsufficientSize) break;
      infos.resize(std::min(kMaxProcesses, std::max<std::size_t>(n + 8, infos.size() * 2)));
    }
    if (r == kSuccess) {
      for (const auto& info : infos) {
        GpuProcess p;
        p.pid = info.pid;
        if (info.usedGpuMemory != kValueNotAvailable) p.used_bytes = info.usedGpuMemory;
        p.name = util::process_name(p.pid);
        g.processes.push_back(std::move(p));
      }
    } else {
      // Memory numbers are still right; only who holds them is unknown (e.g. no permission).
      g.processes_error = api.describe(r);
    }
    snap.gpus.push_back(std::move(g));
  }
  return std::optional<Snapshot>(std::move(snap));
}

Result<std::vector<std::string>> Nvml::uuids(const std::vector<unsigned>& ids) {
  std::lock_guard lock(uuids_mutex_);
  const bool known = std::all_of(ids.begin(), ids.end(), [&](unsigned i) { return uuids_.contains(i); });
  if (!known) {
    auto snap = snapshot();
    if (!snap) return snap.error();
    if (!*snap) return no_nvml(ids.front(), library_);
    auto found = uuids_of(**snap, ids);
    if (!found) return found.error();
    for (const auto& g : (*snap)->gpus) uuids_[g.index] = g.uuid;
  }
  std::vector<std::string> out;
  for (unsigned i : ids) out.push_back(uuids_.at(i));
  return out;
}

std::string format_gib(std::uint64_t bytes) {
  constexpr double kib = 1024.0, mib = kib * 1024, gib = mib * 1024;
  if (bytes >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / gib);
  if (bytes >= (1ull << 20)) return fmt::format("{:.0f} MiB", static_cast<double>(bytes) / mib);
  if (bytes >= (1ull << 10)) return fmt::format("{:.0f} KiB", static_cast<double>(bytes) / kib);
  return fmt::format("{} B", bytes);
}

std::string describe_holders(const Snapshot& snap, const std::vector<unsigned>& only) {
  std::vector<std::string> items;
  for (const auto& g : snap.gpus) {
    if (!only.empty() && std::find(only.begin(), only.end(), g.index) == only.end()) continue;
    std::string text = holders_text(g);
    if (!text.empty()) items.push_back(gpu_label(g) + ": " + text);
  }
  return fmt::format("{}", fmt::join(items, "; "));
}

Baseline baseline_of(const Snapshot& snap) {
  Baseline b;
  for (const auto& g : snap.gpus) b.used_bytes[g.uuid] = g.used_bytes;
  return b;
}

Baseline baseline_updated(const Baseline& recorded, const Snapshot& snap, const GpuIndices& remeasure) {
  Baseline b = recorded;
  for (const auto& g : snap.gpus)
    if (contains(remeasure, g.index)) b.used_bytes[g.uuid] = g.used_bytes;
  return b;
}

nlohmann::json to_json(const Baseline& b) {
  nlohmann::json used = nlohmann::json::object();
  for (const auto& [uuid, bytes] : b.used_bytes) used[uuid] = bytes;
  return nlohmann::json{{"used_bytes", std::move(used)}};
}

Result<Baseline> baseline_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("used_bytes") || !j["used_bytes"].is_object()) {
    return make_error(Errc::io_error, "GPU baseline: \"used_bytes\" is missing or not an object");
  }
  Baseline b;
  for (const auto& [uuid, bytes] : j["used_bytes"].items()) {
    if (!bytes.is_number_unsigned()) {
      return make_error(Errc::io_error, fmt::format("GPU baseline: used_bytes of {} is not a byte count", uuid));
    }
    b.used_bytes[uuid] = bytes.get<std::uint64_t>();
  }
  return b;
}

std::vector<Excess> memory_back_to(const Snapshot& now, const Baseline& before, std::uint64_t slack_bytes,
                                   const GpuIndices& only) {
  std::vector<Excess> out;
  for (const auto& g : now.gpus) {
    if (!contains(only, g.index)) continue;
    auto it = before.used_bytes.find(g.uuid);
    if (it == before.used_bytes.end()) continue;
    if (g.used_bytes <= it->second || g.used_bytes - it->second <= slack_bytes) continue;
    out.push_back(Excess{g.index, g.uuid, g.name, g.used_bytes - it->second, g.processes});
  }
  return out;
}

std::string describe_excess(const std::vector<Excess>& excess) {
  std::vector<std::string> items;
  for (const auto& e : excess)
    items.push_back(fmt::format("GPU {} ({}): {} above the baseline, {}", e.index, e.name, format_gib(e.above_bytes),
                                e.processes.empty() ? std::string("no process listed")
                                                    : "held by " + pid_list(e.processes)));
  return fmt::format("{}", fmt::join(items, "; "));
}

Result<void> check_free(const Snapshot& snap, unsigned gpus_needed, std::uint64_t bytes_per_gpu) {
  if (snap.gpus.size() < gpus_needed) {
    std::vector<std::string> seen;
    for (const auto& g : snap.gpus) seen.push_back(gpu_label(g));
    return make_error(kGpuErrc, fmt::format("needs {} GPU{}, {} visible{}{}", gpus_needed, gpus_needed == 1 ? "" : "s",
                                            snap.gpus.size(), seen.empty() ? "" : ": ", fmt::join(seen, ", ")));
  }
  std::vector<std::string> short_of;
  for (unsigned i = 0; i < gpus_needed; ++i) {
    const Gpu& g = snap.gpus[i];
    if (g.free_bytes < bytes_per_gpu) short_of.push_back(short_of_text(g));
  }
  if (short_of.empty()) return {};
  std::string where = gpus_needed == 1 ? std::string("on the first GPU")
                                        : fmt::format("on each of the first {} GPUs", gpus_needed);
  return make_error(kGpuErrc, fmt::format("not enough free GPU memory: {} needed {}; {}", format_gib(bytes_per_gpu),
                                          where, fmt::join(short_of, "; ")));
}

Result<void> check_free(const std::optional<Snapshot>& snap, unsigned gpus_needed, std::uint64_t bytes_per_gpu) {
  if (!snap) {
    if (gpus_needed == 0) return {};
    return make_error(kGpuErrc, fmt::format("needs {} GPU{}, but no NVIDIA GPU is visible (libnvidia-ml.so.1 not found)",
                                            gpus_needed, gpus_needed == 1 ? "" : "s"));
  }
  return check_free(*snap, gpus_needed, bytes_per_gpu);
}

Result<void> check_free_on(const Snapshot& snap, const std::vector<unsigned>& ids, std::uint64_t bytes_per_gpu) {
  std::vector<std::string> short_of;
  for (unsigned i : ids) {
    const Gpu* g = find_gpu(snap, i);
    if (!g) return not_visible(i, snap.gpus.size());
    if (g->free_bytes < bytes_per_gpu) short_of.push_back(short_of_text(*g));
  }
  if (short_of.empty()) return {};
  std::string where = ids.size() == 1 ? fmt::format("on GPU {}", ids.front())
                                      : fmt::format("on each of GPUs {}", fmt::join(ids, ","));
  return make_error(kGpuErrc, fmt::format("not enough free GPU memory: {} needed {}; {}", format_gib(bytes_per_gpu),
                                          where, fmt::join(short_of, "; ")));
}

Result<void> check_free_on(const std::optional<Snapshot>& snap, const std::vector<unsigned>& ids,
                           std::uint64_t bytes_per_gpu) {
  if (!snap) {
    if (ids.empty()) return {};
    return no_nvml(ids.front(), "libnvidia-ml.so.1");
  }
  return check_free_on(*snap, ids, bytes_per_gpu);
}

Result<std::vector<std::string>> uuids_of(const Snapshot& snap, const std::vector<unsigned>& ids) {
  std::vector<std::string> out;
  for (unsigned i : ids) {
    const Gpu* g = find_gpu(snap, i);
    if (!g) return not_visible(i, snap.gpus.size());
    out.push_back(g->uuid);
  }
  return out;
}

nlohmann::json to_json(const Snapshot& snap) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& g : snap.gpus) {
    nlohmann::json procs = nlohmann::json::array();
    for (const auto& p : g.processes) {
      nlohmann::json jp{{"pid", p.pid}, {"name", p.name}};
      if (p.used_bytes) jp["used_bytes"] = *p.used_bytes;
      procs.push_back(std::move(jp));
    }
    nlohmann::json jg{{"index", g.index},           {"uuid", g.uuid},
                      {"name", g.name},             {"total_bytes", g.total_bytes},
                      {"used_bytes", g.used_bytes}, {"free_bytes", g.free_bytes},
                      {"processes", std::move(procs)}};
    if (g.reserved_bytes) jg["reserved_bytes"] = *g.reserved_bytes;
    if (!g.processes_error.empty()) jg["processes_error"] = g.processes_error;
    gpus.push_back(std::move(jg));
  }
  return nlohmann::json{{"gpus", std::move(gpus)}};
}

}  // namespace modeld::gpu
