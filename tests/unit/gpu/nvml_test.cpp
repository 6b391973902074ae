#include "gpu/nvml.hpp"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

using namespace modeld;
using namespace modeld::gpu;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t GiB = 1ull << 30;
constexpr std::uint64_t MiB = 1ull << 20;

// A scratch folder with the fake NVML's state file; $FAKE_NVML_STATE points at it while it lives.
class FakeState {
 public:
  FakeState() {
    char tmpl[] = "/tmp/modeld-gpu-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ / "nvml-state";
    setenv("FAKE_NVML_STATE", path_.c_str(), 1);
  }
  ~FakeState() {
    unsetenv("FAKE_NVML_STATE");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Replaces the state file by rename, so a reader never sees half of it.
  void write(const std::string& text) const {
    auto tmp = dir_ / "nvml-state.tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, path_);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_, path_;
};

// Two H200s as an idle host shows them: ~615 MiB of driver reservation counted as used.
std::string two_gpus(std::uint64_t used0, std::uint64_t used1, const std::string& procs = "") {
  const std::uint64_t total = 143771ull * MiB;
  return "init 0\n"
         "gpu GPU-aaaa-0000 " + std::to_string(total) + " " + std::to_string(used0) + " " +
         std::to_string(total - used0) + " " + std::to_string(615 * MiB) + " NVIDIA H200\n" +
         "gpu GPU-bbbb-1111 " + std::to_string(total) + " " + std::to_string(used1) + " " +
         std::to_string(total - used1) + " " + std::to_string(615 * MiB) + " NVIDIA H200\n" + procs;
}

// A pid that no process has (above Linux's largest pid_max), so /proc has no name for it.
constexpr unsigned kGonePid = 4194304 + 17;

Snapshot take(Nvml& nvml) {
  auto r = nvml.snapshot();
  REQUIRE(r.has_value());
  REQUIRE(r->has_value());
  return **r;
}

}  // namespace

TEST_CASE("a host without libnvidia-ml.so.1 answers no snapshot, not an error") {
  Nvml by_path("/nonexistent/dir/libnvidia-ml.so.1");
  auto r = by_path.snapshot();
  REQUIRE(r.has_value());
  CHECK_FALSE(r->has_value());

  Nvml by_soname("libnvidia-ml-modeld-test-absent.so.1");
  auto r2 = by_soname.snapshot();
  REQUIRE(r2.has_value());
  CHECK_FALSE(r2->has_value());
}

TEST_CASE("MODELD_NVML_LIBRARY names the library to load") {
  FakeState state;
  state.write(two_gpus(615 * MiB, 615 * MiB));
  setenv("MODELD_NVML_LIBRARY", FAKE_NVML_PATH, 1);
  Nvml nvml;
  unsetenv("MODELD_NVML_LIBRARY");
  CHECK(nvml.library() == FAKE_NVML_PATH);
  CHECK(take(nvml).gpus.size() == 2);

  Nvml plain;
  CHECK(plain.library() == "libnvidia-ml.so.1");
}

TEST_CASE("a snapshot reports each GPU's identity, memory in bytes and the processes holding it") {
  FakeState state;
  const auto self = static_cast<unsigned>(getpid());
  state.write(two_gpus(20 * GiB + 615 * MiB, 615 * MiB,
                       "proc 0 " + std::to_string(self) + " " + std::to_string(20 * GiB) + "\n" +
                           "proc 0 " + std::to_string(kGonePid) + " na\n"));
  Nvml nvml(FAKE_NVML_PATH);
  auto snap = take(nvml);
  REQUIRE(snap.gpus.size() == 2);

  const Gpu& g0 = snap.gpus[0];
  CHECK(g0.index == 0);
  CHECK(g0.uuid == "GPU-aaaa-0000");
  CHECK(g0.name == "NVIDIA H200");
  CHECK(g0.total_bytes == 143771ull * MiB);
  CHECK(g0.used_bytes == 20 * GiB + 615 * MiB);
  CHECK(g0.free_bytes == 143771ull * MiB - g0.used_bytes);
  CHECK(g0.reserved_bytes == std::optional<std::uint64_t>(615 * MiB));
  REQUIRE(g0.processes.size() == 2);
  CHECK(g0.processes[0].pid == self);
  CHECK(g0.processes[0].used_bytes == std::optional<std::uint64_t>(20 * GiB));
  CHECK(g0.processes[0].name == "unit_gpu");  // /proc/self/comm
  CHECK(g0.processes[1].pid == kGonePid);
  CHECK_FALSE(g0.processes[1].used_bytes.has_value());  // NVML_VALUE_NOT_AVAILABLE
  CHECK(g0.processes[1].name.empty());
  CHECK(g0.processes_error.empty());

  const Gpu& g1 = snap.gpus[1];
  CHECK(g1.index == 1);
  CHECK(g1.uuid == "GPU-bbbb-1111");
  CHECK(g1.used_bytes == 615 * MiB);
  CHECK(g1.processes.empty());

  auto j = to_json(snap);
  CHECK(j["gpus"][0]["processes"][0]["pid"] == self);
  CHECK(j["gpus"][0]["processes"][0]["name"] == "unit_gpu");
  CHECK_FALSE(j["gpus"][0]["processes"][1].contains("used_bytes"));
  CHECK(j["gpus"][1]["used_bytes"] == 615 * MiB);
}

TEST_CASE("the v3 process list is read with its 24-byte layout, entry after entry") {
  FakeState state;
  // More processes than the first buffer holds (32), so the INSUFFICIENT_SIZE retry runs too.
  std::string procs;
  for (unsigned i = 0; i < 40; ++i) {
    procs += "proc 1 " + std::to_string(kGonePid + i) + " " + std::to_string((i + 1) * 3 * MiB + i) + "\n";
  }
  state.write(two_gpus(615 * MiB, 615 * MiB, procs));
  Nvml nvml(FAKE_NVML_PATH);
  auto snap = take(nvml);
  REQUIRE(snap.gpus.size() == 2);
  CHECK(snap.gpus[0].processes.empty());
  const auto& listed = snap.gpus[1].processes;
  REQUIRE(listed.size() == 40);
  for (unsigned i = 0; i < 40; ++i) {
    INFO("entry " << i);
    CHECK(listed[i].pid == kGonePid + i);
    CHECK(listed[i].used_bytes == std::optional<std::uint64_t>((i + 1) * 3 * MiB + i));
  }
}

TEST_CASE("nvmlInit failing is an error naming NVML's error string, and a later call retries it") {
  FakeState state;
  state.write("init 9\n");
  Nvml nvml(FAKE_NVML_PATH);
  auto r = nvml.snapshot();
  REQUIRE(r.has_error());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK_THAT(r.error().message, Catch::Contains("nvmlInit_v2") && Catch::Contains("Driver Not Loaded") &&
                                    Catch::Contains(FAKE_NVML_PATH));

  state.write(two_gpus(615 * MiB, 615 * MiB));
  CHECK(take(nvml).gpus.size() == 2);
}

TEST_CASE("a library without the versioned NVML symbols is an error naming what it lacks") {
  Nvml nvml("libm.so.6");
  auto r = nvml.snapshot();
  REQUIRE(r.has_error());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK_THAT(r.error().message, Catch::Contains("libm.so.6") && Catch::Contains("nvmlInit_v2") &&
                                    Catch::Contains("nvmlDeviceGetComputeRunningProcesses_v3"));
}

TEST_CASE("a library file that exists but does not load is an error, not an absent GPU") {
  FakeState state;
  auto bogus = state.dir() / "libnvidia-ml.so.1";
  std::ofstream(bogus) << "not an ELF file";
  Nvml nvml(bogus.string());
  auto r = nvml.snapshot();
  REQUIRE(r.has_error());
  CHECK_THAT(r.error().message, Catch::Contains(bogus.string()) && Catch::Contains("cannot load"));
}

TEST_CASE("a refused process list leaves memory known and says why holders are unknown") {
  FakeState state;
  state.write(two_gpus(30 * GiB, 615 * MiB, "proc_error 0 4\nmemv2 3\n"));
  Nvml nvml(FAKE_NVML_PATH);
  auto snap = take(nvml);
  CHECK(snap.gpus[0].used_bytes == 30 * GiB);
  CHECK(snap.gpus[0].processes.empty());
  CHECK_THAT(snap.gpus[0].processes_error, Catch::Contains("Insufficient Permissions"));
  CHECK_FALSE(snap.gpus[0].reserved_bytes.has_value());  // _v2 memory info refused: v1 numbers stand
  CHECK(describe_holders(snap) == "GPU 0 (NVIDIA H200): processes unknown: Insufficient Permissions (NVML error 4)");
}

TEST_CASE("memory comes back to the baseline as the processes holding it exit") {
  FakeState state;
  state.write(two_gpus(615 * MiB, 615 * MiB));
  Nvml nvml(FAKE_NVML_PATH);
  const Baseline before = baseline_of(take(nvml));
  CHECK(before.used_bytes.at("GPU-aaaa-0000") == 615 * MiB);

  // The server runs: its parent holds GPU 0, a worker GPU 1.
  state.write(two_gpus(40 * GiB, 30 * GiB,
                       "proc 0 " + std::to_string(kGonePid) + " " + std::to_string(39 * GiB) + "\n" +
                           "proc 1 " + std::to_string(kGonePid + 1) + " " + std::to_string(29 * GiB) + "\n"));
  auto excess = memory_back_to(take(nvml), before, 64 * MiB);
  REQUIRE(excess.size() == 2);
  CHECK(excess[0].uuid == "GPU-aaaa-0000");
  CHECK(excess[0].above_bytes == 40 * GiB - 615 * MiB);

  // The parent exited; its worker survives and keeps GPU 1's memory (vLLM's failure mode).
  state.write(two_gpus(615 * MiB, 30 * GiB,
                       "proc 1 " + std::to_string(kGonePid + 1) + " " + std::to_string(29 * GiB) + "\n"));
  excess = memory_back_to(take(nvml), before, 64 * MiB);
  REQUIRE(excess.size() == 1);
  CHECK(excess[0].index == 1);
  CHECK(excess[0].processes.size() == 1);
  CHECK(describe_excess(excess) ==
        "GPU 1 (NVIDIA H200): 29.4 GiB above the baseline, held by pid " + std::to_string(kGonePid + 1));

  // Everything exited; a few MiB of driver bookkeeping remain, within the slack.
  state.write(two_gpus(615 * MiB + 2 * MiB, 615 * MiB));
  CHECK(memory_back_to(take(nvml), before, 64 * MiB).empty());
  // ... but not within a slack smaller than that.
  excess = memory_back_to(take(nvml), before, 1 * MiB);
  REQUIRE(excess.size() == 1);
  CHECK(describe_excess(excess) == "GPU 0 (NVIDIA H200): 2 MiB above the baseline, no process listed");
}

TEST_CASE("the baseline is compared by UUID, so a renumbered or added GPU is not misread") {
  Snapshot now;
  now.gpus.push_back(Gpu{0, "GPU-new", "NVIDIA H200", 100 * GiB, 50 * GiB, 50 * GiB, {}, {}, {}});
  now.gpus.push_back(Gpu{1, "GPU-old", "NVIDIA H200", 100 * GiB, 1 * GiB, 99 * GiB, {}, {}, {}});
  Baseline before;
  before.used_bytes["GPU-old"] = 1 * GiB;
  CHECK(memory_back_to(now, before, 0).empty());
  before.used_bytes["GPU-new"] = 1 * GiB;
  auto excess = memory_back_to(now, before, 0);
  REQUIRE(excess.size() == 1);
  CHECK(excess[0].uuid == "GPU-new");
  CHECK(excess[0].above_bytes == 49 * GiB);
}

TEST_CASE("a baseline survives a JSON round trip and bad JSON is an error naming the key") {
  Baseline b;
  b.used_bytes["GPU-aaaa-0000"] = 615 * MiB;
  b.used_bytes["GPU-bbbb-1111"] = 644874240;
  auto j = to_json(b);
  CHECK(j.dump() == R"({"used_bytes":{"GPU-aaaa-0000":644874240,"GPU-bbbb-1111":644874240}})");
  auto back = baseline_from_json(nlohmann::json::parse(j.dump()));
  REQUIRE(back.has_value());
  CHECK(*back == b);

  auto empty = baseline_from_json(to_json(Baseline{}));
  REQUIRE(empty.has_value());
  CHECK(empty->used_bytes.empty());

  auto missing = baseline_from_json(nlohmann::json::object());
  REQUIRE(missing.has_error());
  CHECK(missing.error().code == Errc::io_error);
  CHECK_THAT(missing.error().message, Catch::Contains("used_bytes"));

  auto negative = baseline_from_json(nlohmann::json::parse(R"({"used_bytes":{"GPU-x":-5}})"));
  REQUIRE(negative.has_error());
  CHECK_THAT(negative.error().message, Catch::Contains("GPU-x"));
}

TEST_CASE("check_free names the GPUs short of memory and who holds it") {
  FakeState state;
  const auto self = static_cast<unsigned>(getpid());
  state.write(two_gpus(615 * MiB, 120 * GiB,
                       "proc 1 " + std::to_string(self) + " " + std::to_string(100 * GiB) + "\n" +
                           "proc 1 " + std::to_string(kGonePid) + " " + std::to_string(19 * GiB) + "\n"));
  Nvml nvml(FAKE_NVML_PATH);
  auto snap = take(nvml);

  CHECK(check_free(snap, 1, 100 * GiB).has_value());  // only GPU 0 needed, and it is free
  CHECK(check_free(snap, 2, 10 * GiB).has_value());

  auto r = check_free(snap, 2, 40 * GiB);
  REQUIRE(r.has_error());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK(r.error().message ==
        "not enough free GPU memory: 40.0 GiB needed on each of the first 2 GPUs; GPU 1 (NVIDIA H200): "
        "20.4 GiB free of 140.4 GiB, 119.0 GiB held by pid " + std::to_string(self) + " (unit_gpu), pid " +
        std::to_string(kGonePid));
  CHECK_THAT(r.error().message, !Catch::Contains("GPU 0"));

  CHECK(describe_holders(snap) == "GPU 1 (NVIDIA H200): 119.0 GiB held by pid " + std::to_string(self) +
                                      " (unit_gpu), pid " + std::to_string(kGonePid));
  CHECK(describe_holders(snap, {0}).empty());
}

TEST_CASE("check_free says how many GPUs are needed and which are visible") {
  Snapshot one;
  one.gpus.push_back(Gpu{0, "GPU-a", "NVIDIA H200", 140 * GiB, 1 * GiB, 139 * GiB, {}, {}, {}});
  auto r = check_free(one, 8, 1 * GiB);
  REQUIRE(r.has_error());
  CHECK(r.error().message == "needs 8 GPUs, 1 visible: GPU 0 (NVIDIA H200)");

  Snapshot busy = one;
  busy.gpus[0].used_bytes = 130 * GiB;
  busy.gpus[0].free_bytes = 10 * GiB;
  auto r2 = check_free(busy, 1, 20 * GiB);
  REQUIRE(r2.has_error());
  CHECK_THAT(r2.error().message, Catch::EndsWith("GPU 0 (NVIDIA H200): 10.0 GiB free of 140.0 GiB, "
                                                 "130.0 GiB used, no process listed"));

  std::optional<Snapshot> none;
  auto r3 = check_free(none, 1, 1 * GiB);
  REQUIRE(r3.has_error());
  CHECK_THAT(r3.error().message, Catch::Contains("no NVIDIA GPU is visible"));
  CHECK(check_free(none, 0, 1 * GiB).has_value());
}

TEST_CASE("GPU memory sizes are printed in binary units") {
  CHECK(format_gib(0) == "0 B");
  CHECK(format_gib(615 * MiB) == "615 MiB");
  CHECK(format_gib(20 * GiB + 512 * MiB) == "20.5 GiB");
  CHECK(format_gib(3 * 1024) == "3 KiB");
}

namespace {

constexpr std::uint64_t kGpuSlack = 256 * MiB;

// `n` idle H200s, GPU i with UUID "GPU-i", `used[i]` bytes used when given.
Snapshot idle_gpus(unsigned n, const std::map<unsigned, std::uint64_t>& used = {}) {
  Snapshot s;
  for (unsigned i = 0; i < n; ++i) {
    const std::uint64_t u = used.contains(i) ? used.at(i) : 615 * MiB;
    s.gpus.push_back(Gpu{i, "GPU-" + std::to_string(i), "NVIDIA H200", 140 * GiB, u, 140 * GiB - u, {}, {}, {}});
  }
  return s;
}

}  // namespace

TEST_CASE("memory_back_to compares only the GPUs it is given, all of them without a set") {
  const Baseline before = baseline_of(idle_gpus(8));
  // A model serves on GPUs 4-7; the one stopped on 0-3 left 30 GiB on GPU 2.
  const Snapshot now = idle_gpus(8, {{2, 30 * GiB}, {4, 100 * GiB}, {5, 100 * GiB}, {6, 100 * GiB}, {7, 100 * GiB}});
  auto excess = memory_back_to(now, before, kGpuSlack, std::vector<unsigned>{0, 1, 2, 3});
  REQUIRE(excess.size() == 1);
  CHECK(excess[0].index == 2);
  CHECK(memory_back_to(now, before, 0, std::vector<unsigned>{0, 1, 3}).empty());
  CHECK(memory_back_to(now, before, 0, std::vector<unsigned>{}).empty());
  CHECK(memory_back_to(now, before, 0).size() == 5);
  CHECK(memory_back_to(now, before, 0, std::nullopt).size() == 5);
}

TEST_CASE("a baseline update re-measures only the GPUs given and keeps the others' recorded values") {
  Baseline recorded = baseline_of(idle_gpus(4));
  recorded.used_bytes.erase("GPU-3");  // never measured: a model served there since the first start
  // GPUs 2 and 3 serve a model now (100 GiB); GPUs 0 and 1 idle with a little more driver memory.
  const Snapshot now = idle_gpus(4, {{0, 700 * MiB}, {1, 700 * MiB}, {2, 100 * GiB}, {3, 100 * GiB}});
  const Baseline b = baseline_updated(recorded, now, std::vector<unsigned>{0, 1});
  CHECK(b.used_bytes.at("GPU-0") == 700 * MiB);
  CHECK(b.used_bytes.at("GPU-1") == 700 * MiB);
  CHECK(b.used_bytes.at("GPU-2") == 615 * MiB);
  CHECK_FALSE(b.used_bytes.contains("GPU-3"));
  CHECK(baseline_updated(recorded, now, std::nullopt) == baseline_of(now));
  CHECK(baseline_updated(recorded, now, std::vector<unsigned>{}) == recorded);
}

TEST_CASE("check_free_on checks the GPUs of a gpu_ids list and names one that is not visible") {
  const Snapshot four = idle_gpus(4, {{1, 130 * GiB}});
  CHECK(check_free_on(four, {2, 3}, 100 * GiB).has_value());
  CHECK(check_free_on(four, {}, 1000 * GiB).has_value());

  auto missing = check_free_on(four, {2, 5, 6}, 1 * GiB);
  REQUIRE(missing.has_error());
  CHECK(missing.error().code == Errc::unit_failed);
  CHECK(missing.error().message == "GPU 5 is not visible: 4 GPUs");

  auto busy = check_free_on(four, {3, 1}, 20 * GiB);
  REQUIRE(busy.has_error());
  CHECK(busy.error().code == Errc::unit_failed);
  CHECK(busy.error().message ==
        "not enough free GPU memory: 20.0 GiB needed on each of GPUs 3,1; GPU 1 (NVIDIA H200): 10.0 GiB free of "
        "140.0 GiB, 130.0 GiB used, no process listed");
  auto one = check_free_on(four, {1}, 20 * GiB);
  REQUIRE(one.has_error());
  CHECK_THAT(one.error().message, Catch::StartsWith("not enough free GPU memory: 20.0 GiB needed on GPU 1; "));

  std::optional<Snapshot> none;
  auto absent = check_free_on(none, {0}, 0);
  REQUIRE(absent.has_error());
  CHECK_THAT(absent.error().message, Catch::StartsWith("GPU 0 is not visible: no NVIDIA GPU"));
  CHECK(check_free_on(none, {}, 1 * GiB).has_value());
}

TEST_CASE("uuids_of answers the UUIDs in the order of the indices and names a missing one") {
  const Snapshot four = idle_gpus(4);
  auto u = uuids_of(four, {3, 0, 2});
  REQUIRE(u.has_value());
  CHECK(*u == std::vector<std::string>{"GPU-3", "GPU-0", "GPU-2"});
  CHECK(uuids_of(four, {})->empty());
  auto missing = uuids_of(four, {0, 4});
  REQUIRE(missing.has_error());
  CHECK(missing.error().code == Errc::unit_failed);
  CHECK(missing.error().message == "GPU 4 is not visible: 4 GPUs");
  auto one = uuids_of(idle_gpus(1), {1});
  REQUIRE(one.has_error());
  CHECK(one.error().message == "GPU 1 is not visible: 1 GPU");
}

TEST_CASE("Nvml::uuids remembers each index's UUID and asks NVML only for indices it has not seen") {
  FakeState state;
  state.write(two_gpus(615 * MiB, 615 * MiB));
  Nvml nvml(FAKE_NVML_PATH);
  auto u = nvml.uuids({1, 0});
  REQUIRE(u.has_value());
  CHECK(*u == std::vector<std::string>{"GPU-bbbb-1111", "GPU-aaaa-0000"});

  // NVML would now answer other UUIDs: the remembered ones still answer, NVML is not asked.
  std::string renamed = two_gpus(615 * MiB, 615 * MiB);
  renamed.replace(renamed.find("GPU-aaaa"), 8, "GPU-cccc");
  state.write(renamed);
  auto again = nvml.uuids({0});
  REQUIRE(again.has_value());
  CHECK(*again == std::vector<std::string>{"GPU-aaaa-0000"});
  auto missing = nvml.uuids({0, 2});
  REQUIRE(missing.has_error());
  CHECK(missing.error().code == Errc::unit_failed);
  CHECK(missing.error().message == "GPU 2 is not visible: 2 GPUs");
  CHECK(nvml.uuids({})->empty());

  Nvml absent("/nonexistent/dir/libnvidia-ml.so.1");
  auto none = absent.uuids({3});
  REQUIRE(none.has_error());
  CHECK(none.error().code == Errc::unit_failed);
  CHECK_THAT(none.error().message, Catch::StartsWith("GPU 3 is not visible: no NVIDIA GPU") &&
                                       Catch::Contains("/nonexistent/dir/libnvidia-ml.so.1"));
  CHECK(absent.uuids({})->empty());
}

TEST_CASE("GPU sets are described as the journal writes them") {
  CHECK(describe_indices(std::nullopt) == "all");
  CHECK(describe_indices(std::vector<unsigned>{}) == "none");
  CHECK(describe_indices(std::vector<unsigned>{4, 5, 6}) == "4,5,6");
  CHECK(contains(std::nullopt, 7));
  CHECK_FALSE(contains(std::vector<unsigned>{}, 0));
  CHECK(contains(std::vector<unsigned>{1, 3}, 3));
}
