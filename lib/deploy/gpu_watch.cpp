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

#include <algorithm>

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
  co_return co_await util::on_pool<Result<std::optional<gpu::Snapshot>>>(
      s.disk_pool, [&s] { return s.gpu_snapshot ? s.gpu_snapshot() : nvml().snapshot(); });
}

bool used_by_any(const std::vector<config::GpuSet>& sets, unsigned index) {
  return std::any_of(sets.begin(), sets.end(), [&](const auto& set) { return gpu::contains(set, index); });
}

// The GPUs of `snap` in `freed` that no set of `still_busy` uses: those a stop waits for.
std::vector<unsigned> freed_and_unused(const gpu::Snapshot& snap, const config::GpuSet& freed,
                                       const std::vector<config::GpuSet>& still_busy) {
  std::vector<unsigned> out;
  for (const auto& g : snap.gpus)
    if (gpu::contains(freed, g.index) && !used_by_any(still_busy, g.index)) out.push_back(g.index);
  return out;
}

// The GPUs of `snap` that no set of `still_busy` uses: those the baseline may re-measure.
std::vector<unsigned> unused(const gpu::Snapshot& snap, const std::vector<config::GpuSet>& still_busy) {
  std::vector<unsigned> out;
  for (const auto& g : snap.gpus)
    if (!used_by_any(still_busy, g.index)) out.push_back(g.index);
  return out;
}

// Polls until the GPUs `watched` are back at `before` (`snap`: the first snapshot, replaced by
// each later one); stop_timeout at `deadline` naming the GPUs above it.
asio::awaitable<Result<void>> wait_back(Services& s, const Run& run, std::chrono::steady_clock::time_point deadline,
                                        const gpu::Baseline& before, const std::vector<unsigned>& watched,
                                        Result<std::optional<gpu::Snapshot>>& snap) {
  // The first note after 2 s (memory of a killed process is back within a fraction of a second:
  // gpu-facts.md), then every 10 s.
  auto last_note = std::chrono::steady_clock::now() - std::chrono::seconds(8);
  std::vector<gpu::Excess> excess;
  bool first = true;
  auto end = co_await util::poll_until(deadline, std::chrono::milliseconds(500), [&]() -> asio::awaitable<bool> {
    if (!std::exchange(first, false)) snap = co_await snapshot(s);
    if (!snap || !*snap) co_return true;
    excess = gpu::memory_back_to(**snap, before, kGpuSlackBytes, watched);
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
  if (end == util::PollEnd::deadline && *snap)
    co_return make_error(Errc::stop_timeout,
                         fmt::format("GPU memory did not come back after the stop: {}; not starting model {} on "
                                     "top of it",
                                     gpu::describe_excess(excess), run.model.name));
  co_return Result<void>{};
}

// The freed GPUs `watched` that `before` has no value for, logged: they cannot be waited for.
void note_unmeasured(const Run& run, const gpu::Snapshot& snap, const gpu::Baseline& before,
                     const std::vector<unsigned>& watched) {
  std::vector<unsigned> unmeasured;
  for (const auto& g : snap.gpus)
    if (gpu::contains(watched, g.index) && !before.used_bytes.contains(g.uuid)) unmeasured.push_back(g.index);
  if (!unmeasured.empty())
    sys::logf(sys::Level::info, run.fields(), "no GPU baseline recorded for GPU {}: not waiting for its memory",
              gpu::describe_indices(unmeasured));
}

}  // namespace

asio::awaitable<Result<void>> wait_gpu_memory_back(Services& s, const Run& run,
                                                   std::chrono::steady_clock::time_point deadline, bool compare,
                                                   const config::GpuSet& freed,
                                                   const std::vector<config::GpuSet>& still_busy) {
  auto snap = co_await snapshot(s);
  if (!snap) co_return snap.error();
  if (!*snap) co_return Result<void>{};  // no NVIDIA driver: nothing to wait for
  auto before = co_await util::on_pool<std::optional<gpu::Baseline>>(s.disk_pool, [&] { return read_baseline(s, run); });
  if (compare && before) {
    const auto watched = freed_and_unused(**snap, freed, still_busy);
    note_unmeasured(run, **snap, *before, watched);
    if (auto r = co_await wait_back(s, run, deadline, *before, watched, snap); !r) co_return r.error();
    if (!*snap) co_return Result<void>{};
    sys::logf(sys::Level::info, run.fields(), "GPU memory is back at its baseline on GPU {}",
              gpu::describe_indices(watched));
  }
  // No model server uses these GPUs now: this is what "back" means after the next stop there.
  const auto remeasure = unused(**snap, still_busy);
  if (!before || !compare)
    sys::logf(sys::Level::info, run.fields(), "measuring the GPU baseline of GPU {} with no model server on them",
              gpu::describe_indices(remeasure));
  const auto updated = gpu::baseline_updated(before.value_or(gpu::Baseline{}), **snap, remeasure);
  const std::string text = util::dump_json(gpu::to_json(updated), 1);
  if (auto w = co_await util::on_pool<Result<void>>(
          s.disk_pool, [&] { return util::write_file_atomically(baseline_path(s), text); });
      !w)
    sys::logf(sys::Level::warning, run.fields(), "cannot record the GPU baseline: {}", w.error().message);
  co_return Result<void>{};
}

asio::awaitable<Result<void>> check_gpus_for_launch(Services& s, const Run& run) {
  const auto& serve = run.model.serve;
  if (serve.gpu_ids) {
    if (serve.gpu_ids->empty()) co_return Result<void>{};
    auto snap = co_await snapshot(s);
    if (!snap) co_return snap.error();
    if (auto r = gpu::check_free_on(*snap, *serve.gpu_ids, serve.gpu_memory); !r)
      co_return make_error(r.error().code, fmt::format("model {} (serve.gpu_ids = [{}]): {}", run.model.name,
                                                       gpu::describe_indices(serve.gpu_ids), r.error().message));
    sys::logf(sys::Level::info, run.fields(), "GPU {} visible with {} free each as model {} needs",
              gpu::describe_indices(serve.gpu_ids), gpu::format_gib(serve.gpu_memory), run.model.name);
    co_return Result<void>{};
  }
  if (serve.gpus == 0) co_return Result<void>{};
  auto snap = co_await snapshot(s);
  if (!snap) co_return snap.error();
  if (auto r = gpu::check_free(*snap, serve.gpus, serve.gpu_memory); !r)
    co_return make_error(r.error().code, fmt::format("model {}: {}", run.model.name, r.error().message));
  sys::logf(sys::Level::info, run.fields(), "{} GPU(s) visible with {} free each as model {} needs", serve.gpus,
            gpu::format_gib(serve.gpu_memory), run.model.name);
  co_return Result<void>{};
}

asio::awaitable<GpuVisibility> gpus_visible(Services& s, const config::ServeConfig& serve) {
  using V = GpuVisibility::Verdict;
  if (serve.gpu_ids ? serve.gpu_ids->empty() : serve.gpus == 0)
    co_return GpuVisibility{V::visible, "no GPU needed"};
  auto snap = co_await snapshot(s);
  if (!snap) co_return GpuVisibility{V::unknown, snap.error().message};
  auto r = serve.gpu_ids ? gpu::check_free_on(*snap, *serve.gpu_ids, 0) : gpu::check_free(*snap, serve.gpus, 0);
  if (!r) co_return GpuVisibility{V::not_visible, r.error().message};
  co_return GpuVisibility{V::visible, serve.gpu_ids ? fmt::format("GPU {} visible", gpu::describe_indices(serve.gpu_ids))
                                                    : fmt::format("{} GPU(s) visible", (*snap)->gpus.size())};
}

asio::awaitable<Result<std::vector<std::string>>> gpu_uuids(Services& s, const std::vector<unsigned>& ids) {
  if (ids.empty()) co_return std::vector<std::string>{};
  co_return co_await util::on_pool<Result<std::vector<std::string>>>(s.disk_pool, [&] { return nvml().uuids(ids); });
}

}  // namespace modeld::deploy
