// gpu_probe: lib/gpu against the real libnvidia-ml.so.1 on a GPU host, for tests/device/gpu_check.py.
// Each command prints one JSON object a line on stdout; exit status 0 when the condition held,
// 1 when it did not (timeout, check failed), 2 on usage or NVML errors.
//   gpu_probe snapshot                          the snapshot (or {"gpus": null} without NVML)
//   gpu_probe baseline                          Baseline JSON of the current snapshot
//   gpu_probe wait-listed PID TIMEOUT_S         poll until PID holds memory on some GPU
//   gpu_probe wait-back BASELINE_FILE SLACK_BYTES TIMEOUT_S
//                                               poll until memory_back_to() is empty
//   gpu_probe check-free GPUS BYTES             check_free()'s answer
// Polls every 10 ms (a probe, not the daemon: the deploy stage picks its own interval).

#include "gpu/nvml.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

using namespace modeld;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void print(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

int usage() {
  std::cerr << "usage: gpu_probe snapshot | baseline | wait-listed PID TIMEOUT_S |"
               " wait-back BASELINE_FILE SLACK_BYTES TIMEOUT_S | check-free GPUS BYTES\n";
  return 2;
}

// One snapshot; prints the error and returns nullopt on an NVML error or without NVML.
std::optional<gpu::Snapshot> take(gpu::Nvml& nvml) {
  auto snap = nvml.snapshot();
  if (!snap) {
    print({{"error", snap.error().message}});
    return std::nullopt;
  }
  if (!*snap) {
    print({{"gpus", nullptr}, {"note", "no NVML library: " + nvml.library()}});
    return std::nullopt;
  }
  return std::move(**snap);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string cmd = argv[1];
  gpu::Nvml nvml;

  if (cmd == "snapshot" && argc == 2) {
    auto t0 = Clock::now();
    auto snap = take(nvml);
    if (!snap) return 2;
    auto j = gpu::to_json(*snap);
    j["snapshot_s"] = seconds_since(t0);
    j["holders"] = gpu::describe_holders(*snap);
    print(j);
    return 0;
  }
  if (cmd == "baseline" && argc == 2) {
    auto snap = take(nvml);
    if (!snap) return 2;
    print(gpu::to_json(gpu::baseline_of(*snap)));
    return 0;
  }
  if (cmd == "wait-listed" && argc == 4) {
    auto pid = static_cast<std::uint32_t>(std::stoul(argv[2]));
    auto timeout = std::stod(argv[3]);
    auto t0 = Clock::now();
    for (;;) {
      auto snap = take(nvml);
      if (!snap) return 2;
      for (const auto& g : snap->gpus) {
        for (const auto& p : g.processes) {
          if (p.pid != pid) continue;
          auto j = gpu::to_json(*snap);
          j["listed_after_s"] = seconds_since(t0);
          j["holders"] = gpu::describe_holders(*snap);
          print(j);
          return 0;
        }
      }
      if (seconds_since(t0) > timeout) {
        auto j = gpu::to_json(*snap);
        j["timeout"] = fmt::format("pid {} not listed within {} s", pid, timeout);
        print(j);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (cmd == "wait-back" && argc == 5) {
    std::ifstream in(argv[2]);
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = nlohmann::json::parse(text.str(), nullptr, false);
    auto base = gpu::baseline_from_json(parsed);
    if (!base) {
      print({{"error", std::string(argv[2]) + ": " + base.error().message}});
      return 2;
    }
    auto slack = std::stoull(argv[3]);
    auto timeout = std::stod(argv[4]);
    auto t0 = Clock::now();
    std::string first_excess;
    int polls = 0;
    for (;;) {
      auto snap = take(nvml);
      if (!snap) return 2;
      ++polls;
      auto excess = gpu::memory_back_to(*snap, *base, slack);
      if (polls == 1) first_excess = gpu::describe_excess(excess);
      if (excess.empty()) {
        auto j = gpu::to_json(*snap);
        j["back_after_s"] = seconds_since(t0);
        j["polls"] = polls;
        j["first_excess"] = first_excess;
        print(j);
        return 0;
      }
      if (seconds_since(t0) > timeout) {
        auto j = gpu::to_json(*snap);
        j["timeout"] = fmt::format("not back within {} s", timeout);
        j["excess"] = gpu::describe_excess(excess);
        print(j);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (cmd == "check-free" && argc == 4) {
    auto snap = nvml.snapshot();
    if (!snap) {
      print({{"error", snap.error().message}});
      return 2;
    }
    auto r = gpu::check_free(*snap, static_cast<unsigned>(std::stoul(argv[2])), std::stoull(argv[3]));
    print(r ? nlohmann::json{{"ok", true}} : nlohmann::json{{"ok", false}, {"error", r.error().message}});
    return r ? 0 : 1;
  }
  return usage();
}
