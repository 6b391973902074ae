// GPU memory across a model switch: baseline, wait for it after a stop, check before a launch.
#include "deploy/gpu_watch.hpp"

#include "gpu/nvml.hpp"
#include "util/files.hpp"
#include "util/json.hpp"
#include "util/on_pool.hpp"
#include "util/poll.hpp"
#include "util/quantities.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace modeld::deploy {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// One NVML for the process: the library keeps global state of its own.
gpu::Nvml& nvml() {
  static gpu::Nvml instance;
  return instance;
}

fs::path baseline_path(const Services& s) { return s.config->daemon.state_dir / "gpu-baseline.json"; }

std::optional<gpu::Baseline> read_baseline(const Services& s, const Run& run) {
  auto text = util::read_file(baseline_path(s), 1u << 20);
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  auto b = j.is_discarded() ? Result<gpu::Baseline>(make_error(Errc::io_error, "not JSON")) : gpu::baseline_from_json(j);
  if (!b) {
    sys::logf(sys::Level::warning, run.fields(), "{}: {}; measuring a new GPU baseline", baseline_path(s).string(),
              b.error().message);
    return std::nullopt;
  }
  return *b;
}

asio::awaitable<Result<std::optional<gpu::Snapshot>>> snapshot(Services& s) {
  co_return co_await util::on_pool<Result<std::optional<gpu::Snapshot>>>(s.disk_pool, [] { return nvml().snapshot(); });
}

}  // namespace

asio::awaitable<Result<void>> wait_gpu_memory_back(Services& s, const Run& run,
                                                   std::chrono::steady_clock::time_point deadline, bool compare) {
  auto snap = co_await snapshot(s);
  if (!snap) co_return snap.error();
  if (!*snap) co_return Result<void>{};  // no NVIDIA driver: nothing to wait for
  std::optional<gpu::Baseline> before;
  if (compare)
    before = co_await util::on_pool<std::optional<gpu::Baseline>>(s.disk_pool, [&] { return read_baseline(s, run); });
  if (before) {
    auto last_note = std::chrono::steady_clock::now();
    std::vector<gpu::Excess> excess;
    bool first = true;
    auto end = co_await util::poll_until(deadline, std::chrono::milliseconds(500), [&]() -> asio::awaitable<bool> {
      if (!std::exchange(first, false)) snap = co_await snapshot(s);
      if (!snap || !*snap) co_return true;
      excess = gpu::memory_back_to(**snap, *before, kGpuSlackBytes);
      if (excess.empty()) co_return true;
      if (const auto now = std::chrono::steady_clock::now(); now - last_note >= std::chrono::seconds(10)) {
        sys::logf(sys::Level::notice, run.fields(), "waiting for GPU memory: {}", gpu::describe_excess(excess));
        last_note = now;
      }
      co_return false;
    });
    if (end == util::PollEnd::cancelled)
      co_return make_error(Errc::cancelled, "cancelled while waiting for GPU memory to come back");
    if (!snap) co_return snap.error();
    if (!*snap) co_return Result<void>{};
    if (end == util::PollEnd::deadline)
      co_return make_error(Errc::stop_timeout,
                           fmt::format("GPU memory did not come back after the stop: {}; not starting model {} on "
                                       "top of it",
                                       gpu::describe_excess(excess), run.model.name));
    sys::logf(sys::Level::info, run.fields(), "GPU memory is back at its baseline on {} GPU(s)", (*snap)->gpus.size());
  } else {
    sys::logf(sys::Level::info, run.fields(), "measuring the GPU baseline with no model server running ({} GPU(s))",
              (*snap)->gpus.size());
  }
  // No model server runs now: this is what "back" means after the next stop.
  const std::string baseline = util::dump_json(gpu::to_json(gpu::baseline_of(**snap)), 1);
  if (auto w = co_await util::on_pool<Result<void>>(
          s.disk_pool, [&] { return util::write_file_atomically(baseline_path(s), baseline); });
      !w)
    sys::logf(sys::Level::warning, run.fields(), "cannot record the GPU baseline: {}", w.error().message);
  co_return Result<void>{};
}

asio::awaitable<Result<void>> check_gpus_for_launch(Services& s, const Run& run) {
  const auto& serve = run.model.serve;
  if (serve.gpus == 0) co_return Result<void>{};
  auto snap = co_await snapshot(s);
  if (!snap) co_return snap.error();
  if (auto r = gpu::check_free(*snap, serve.gpus, serve.gpu_memory); !r)
    co_return make_error(r.error().code, fmt::format("model {}: {}", run.model.name, r.error().message));
  sys::logf(sys::Level::info, run.fields(), "{} GPU(s) visible with {} free each as model {} needs", serve.gpus,
            gpu::format_gib(serve.gpu_memory), run.model.name);
  co_return Result<void>{};
}

}  // namespace modeld::deploy
