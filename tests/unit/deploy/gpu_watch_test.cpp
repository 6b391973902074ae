// GPU memory across a switch (gpu_watch.hpp) with NVML's snapshots scripted through the
// Services::gpu_snapshot seam: the wait after a stop ends when the GPUs it freed are back at their
// baseline (and only those), a GPU still held at the deadline fails the stop naming who holds it,
// and the baseline is measured only on GPUs no staying service uses.

#include "deploy/gpu_watch.hpp"

#include "gpu/nvml.hpp"
#include "http/client.hpp"
#include "store/store.hpp"
#include "util/files.hpp"
#include "util/json.hpp"

#include "unit/deploy/fake_units.hpp"
#include "unit/http/test_server.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t GiB = 1ull << 30;
constexpr std::uint64_t kTotal = 140ull * GiB;
constexpr std::uint64_t kIdle = 615 * MiB;  // the driver's own use on an idle GPU

// GPU `index` ("GPU-<index>") using `used` bytes, held by `procs`.
gpu::Gpu h200(unsigned index, std::uint64_t used, std::vector<gpu::GpuProcess> procs = {}) {
  gpu::Gpu g;
  g.index = index;
  g.uuid = "GPU-" + std::to_string(index);
  g.name = "NVIDIA H200";
  g.total_bytes = kTotal;
  g.used_bytes = used;
  g.free_bytes = kTotal - used;
  g.processes = std::move(procs);
  return g;
}

gpu::Snapshot two_gpus(std::uint64_t used0, std::uint64_t used1, std::vector<gpu::GpuProcess> procs0 = {}) {
  return gpu::Snapshot{{h200(0, used0, std::move(procs0)), h200(1, used1)}};
}

// A leftover worker of the stopped server, as NVML lists it.
const gpu::GpuProcess kWorker{4242, 20 * GiB, "VLLM::Worker"};

struct Fixture {
  asio::io_context ioc;
  asio::thread_pool pool{1};
  fs::path dir = fs::temp_directory_path() / ("gpu-watch-test-" + std::to_string(::getpid()));
  std::shared_ptr<config::Config> cfg = make_config(dir);
  store::Store store{cfg->daemon.models_dir};
  http::Client client{ioc.get_executor(), {}};
  hub::Hub hub{client, "http://127.0.0.1:1"};
  test::FakeUnits units;
  deploy::Services services{cfg, store, hub, client, client, units, pool};
  deploy::Deployment record;

  std::mutex mutex;                    // the seam runs on the disk pool
  std::vector<gpu::Snapshot> script;   // what the i-th snapshot answers (the last one from then on)
  std::atomic<int> snapshots = 0;      // snapshots taken

  Fixture() {
    record.model = "new";
    record.phase = deploy::Phase::stopping_old;
    services.gpu_snapshot = [this]() -> Result<std::optional<gpu::Snapshot>> {
      std::lock_guard lock(mutex);
      const auto i = static_cast<std::size_t>(snapshots++);
      return std::optional<gpu::Snapshot>(script.at(std::min(i, script.size() - 1)));
    };
  }
  ~Fixture() {
    pool.join();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  static std::shared_ptr<config::Config> make_config(const fs::path& dir) {
    fs::remove_all(dir);
    auto c = std::make_shared<config::Config>();
    c->daemon.models_dir = dir / "models";
    c->daemon.state_dir = dir / "state";
    fs::create_directories(c->daemon.models_dir);
    fs::create_directories(c->daemon.state_dir);
    config::ModelConfig m;
    m.name = "new";
    m.repo = "acme/new";
    c->models["new"] = m;
    return c;
  }

  // Runs `script` from its first snapshot on.
  void answer(std::vector<gpu::Snapshot> s) {
    std::lock_guard lock(mutex);
    script = std::move(s);
    snapshots = 0;
  }

  // wait_gpu_memory_back for a stop that freed `freed`, `still_busy` staying, until `deadline`.
  Result<void> wait_back(std::chrono::steady_clock::duration deadline, bool compare, const config::GpuSet& freed,
                         const std::vector<config::GpuSet>& still_busy = {}) {
    deploy::Run run{.record = record, .model = cfg->models.at("new")};
    return test::run(ioc,
                     deploy::wait_gpu_memory_back(services, run, std::chrono::steady_clock::now() + deadline, compare,
                                                  freed, still_busy),
                     std::chrono::milliseconds(60s));
  }

  // The baseline the wait recorded in state_dir/gpu-baseline.json.
  gpu::Baseline recorded() {
    auto text = util::read_file(cfg->daemon.state_dir / "gpu-baseline.json");
    REQUIRE(text);
    auto b = gpu::baseline_from_json(nlohmann::json::parse(*text));
    REQUIRE(b);
    return *b;
  }

  // The baseline of two idle GPUs recorded as stopping_old records it with nothing stopped.
  void record_idle_baseline() {
    answer({two_gpus(kIdle, kIdle)});
    REQUIRE(wait_back(0s, false, std::nullopt).has_value());
    REQUIRE(recorded() == gpu::Baseline{{{"GPU-0", kIdle}, {"GPU-1", kIdle}}});
  }
};

}  // namespace

TEST_CASE("with nothing stopped the baseline of every GPU no staying service uses is measured and kept") {
  Fixture fx;
  fx.record_idle_baseline();
  CHECK(fx.snapshots == 1);
  // GPU 1 now serves a model that stays: its recorded value is kept, GPU 0 measured again.
  fx.answer({two_gpus(kIdle + 10 * MiB, 30 * GiB)});
  REQUIRE(fx.wait_back(0s, false, std::nullopt, {std::vector<unsigned>{1}}).has_value());
  CHECK(fx.recorded() == gpu::Baseline{{{"GPU-0", kIdle + 10 * MiB}, {"GPU-1", kIdle}}});
}

namespace {

// GPU 0 is back at the third snapshot, GPU 1 holds another model's 30 GiB throughout: a wait for
// a stop that freed `freed`, `still_busy` staying, takes exactly those three snapshots.
void check_waits_for_gpu0_only(Fixture& fx, const config::GpuSet& freed, const std::vector<config::GpuSet>& still_busy) {
  fx.record_idle_baseline();
  const auto held = two_gpus(kIdle + 20 * GiB, kIdle + 30 * GiB, {kWorker});
  fx.answer({held, held, two_gpus(kIdle + 100 * MiB, kIdle + 30 * GiB)});  // 100 MiB: within the slack
  auto r = fx.wait_back(20s, true, freed, still_busy);
  INFO((r ? std::string("back") : r.error().message));
  REQUIRE(r.has_value());
  CHECK(fx.snapshots == 3);  // waited for GPU 0, and no longer
  CHECK(fx.recorded().used_bytes.at("GPU-0") == kIdle + 100 * MiB);
}

}  // namespace

TEST_CASE("after a stop the wait ends once the freed GPUs are back at their baseline, never waiting for others") {
  Fixture fx;
  SECTION("GPU 1 was not freed") {
    check_waits_for_gpu0_only(fx, std::vector<unsigned>{0}, {});
    CHECK(fx.recorded().used_bytes.at("GPU-1") == kIdle + 30 * GiB);  // no server of modeld's uses it now
  }
  SECTION("GPU 1 was freed too, but a service that stays uses it") {
    check_waits_for_gpu0_only(fx, std::nullopt, {std::vector<unsigned>{1}});
    CHECK(fx.recorded().used_bytes.at("GPU-1") == kIdle);  // never measured under a serving model
  }
}

TEST_CASE("a freed GPU still held at the deadline fails the stop naming the GPU and the process holding it") {
  Fixture fx;
  fx.record_idle_baseline();
  fx.answer({two_gpus(kIdle + 20 * GiB, kIdle, {kWorker})});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = fx.wait_back(1500ms, true, std::vector<unsigned>{0});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::stop_timeout);
  CHECK(r.error().message ==
        "GPU memory did not come back after the stop: GPU 0 (NVIDIA H200): 20.0 GiB above the baseline, held by pid "
        "4242 (VLLM::Worker); not starting model new on top of it");
  CHECK(std::chrono::steady_clock::now() - t0 >= 1500ms);  // it waited until the deadline
  CHECK(fx.snapshots >= 2);                                  // it looked again, not once only
  CHECK(fx.recorded() == gpu::Baseline{{{"GPU-0", kIdle}, {"GPU-1", kIdle}}});  // nothing re-measured
}

TEST_CASE("NVML failing during the wait after a stop ends the wait at once with NVML's error, measuring nothing") {
  Fixture fx;
  fx.record_idle_baseline();
  // GPU 0 still held at the first look; NVML fails at the second.
  const auto held = two_gpus(kIdle + 20 * GiB, kIdle, {kWorker});
  const std::string lost = "libnvidia-ml.so.1: nvmlDeviceGetMemoryInfo: GPU is lost";
  std::atomic<int> looks = 0;
  fx.services.gpu_snapshot = [&]() -> Result<std::optional<gpu::Snapshot>> {
    if (looks++ == 0) return std::optional<gpu::Snapshot>(held);
    return make_error(Errc::unit_failed, lost);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = fx.wait_back(20s, true, std::vector<unsigned>{0});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK(r.error().message == lost);  // NVML's own words, nothing added
  CHECK(looks == 2);                 // no look after the failed one
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // not waiting until the deadline
  CHECK(fx.recorded() == gpu::Baseline{{{"GPU-0", kIdle}, {"GPU-1", kIdle}}});  // nothing re-measured
}

TEST_CASE("a freed GPU without a recorded baseline is not waited for, and is measured then") {
  Fixture fx;
  const std::string only_gpu1 = util::dump_json(gpu::to_json(gpu::Baseline{{{"GPU-1", kIdle}}}), 1);
  REQUIRE(util::write_file_atomically(fx.cfg->daemon.state_dir / "gpu-baseline.json", only_gpu1).has_value());
  fx.answer({two_gpus(kIdle + 20 * GiB, kIdle, {kWorker})});
  REQUIRE(fx.wait_back(20s, true, std::nullopt).has_value());
  CHECK(fx.snapshots == 1);
  CHECK(fx.recorded() == gpu::Baseline{{{"GPU-0", kIdle + 20 * GiB}, {"GPU-1", kIdle}}});
}

TEST_CASE("a host without NVML waits for nothing and records no baseline") {
  Fixture fx;
  fx.services.gpu_snapshot = [] { return Result<std::optional<gpu::Snapshot>>(std::optional<gpu::Snapshot>()); };
  REQUIRE(fx.wait_back(20s, true, std::nullopt).has_value());
  CHECK_FALSE(fs::exists(fx.cfg->daemon.state_dir / "gpu-baseline.json"));
}

TEST_CASE("launching refuses a GPU of serve.gpu_ids short of memory, naming it and who holds it") {
  Fixture fx;
  auto& m = fx.cfg->models.at("new");
  m.serve.gpu_ids = std::vector<unsigned>{1};
  m.serve.gpu_memory = 130 * GiB;
  fx.answer({gpu::Snapshot{{h200(0, kIdle), h200(1, kIdle + 20 * GiB, {kWorker})}}});
  deploy::Run run{.record = fx.record, .model = m};
  auto r = test::run(fx.ioc, deploy::check_gpus_for_launch(fx.services, run));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unit_failed);
  CHECK_THAT(r.error().message, Catch::StartsWith("model new (serve.gpu_ids = [1]): ") &&
                                    Catch::Contains("GPU 1 (NVIDIA H200)") &&
                                    Catch::Contains("held by pid 4242 (VLLM::Worker)"));
  m.serve.gpu_memory = 100 * GiB;
  CHECK(test::run(fx.ioc, deploy::check_gpus_for_launch(fx.services, run)).has_value());
}
