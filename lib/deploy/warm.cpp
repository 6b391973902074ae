// warming: read the new revision's files into the page cache (the loader's order, the safetensors
// shards first), within a RAM budget, before the old model stops; rolling back reuses it.
#include "deploy/warm.hpp"

#include "store/store.hpp"
#include "util/files.hpp"
#include "util/on_pool.hpp"
#include "util/quantities.hpp"
#include "util/test_hooks.hpp"
#include "verify/index.hpp"
#include "warm/warm.hpp"

#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace modeld::deploy {

namespace asio = boost::asio;

std::uint64_t default_warm_reserve(std::uint64_t mem_total) { return std::max<std::uint64_t>(8ull << 30, mem_total / 10); }

std::vector<std::string> warm_order(std::vector<std::string> paths, const std::set<std::string>& shards) {
  // vLLM and transformers read the index's shards in sorted order (every *.safetensors, sorted,
  // when there is no index); everything else (config, tokenizer) is small and comes after.
  const auto is_shard = [&](const std::string& p) {
    return shards.empty() ? p.ends_with(".safetensors") : shards.contains(p);
  };
  std::sort(paths.begin(), paths.end());
  std::stable_partition(paths.begin(), paths.end(), is_shard);
  return paths;
}

namespace {

// The files of a verified revision in the order to warm them, as absolute paths. Blocks (reads
// the manifest and the safetensors index).
Result<std::vector<std::filesystem::path>> revision_files(const store::Store& st, const std::string& model,
                                                          const std::string& commit) {
  auto manifest = st.read_manifest(model, commit);
  if (!manifest) return manifest.error();
  if (!*manifest) return make_error(Errc::checkpoint_incomplete, fmt::format("{} at {} has no manifest", model, commit));
  const auto dir = st.revision_dir(model, commit);
  std::vector<std::string> paths;
  std::set<std::string> shards;
  for (const auto& f : (*manifest)->files) {
    paths.push_back(f.path);
    if (!f.path.ends_with(".safetensors.index.json")) continue;
    auto text = util::read_file(dir / f.path);
    if (!text) continue;
    if (auto index = verify::parse_safetensors_index(*text, f.path))
      for (const auto& [shard, tensors] : *index) shards.insert(shard);
  }
  std::vector<std::filesystem::path> out;
  for (const auto& p : warm_order(std::move(paths), shards)) out.push_back(dir / p);
  return out;
}

// MemAvailable minus the reserve (MODELD_TEST_WARM_BUDGET instead, in builds with test hooks).
Result<std::uint64_t> warm_budget(const config::Config& config) {
  if (auto forced = test_hooks::number("MODELD_TEST_WARM_BUDGET")) return *forced;
  auto mem = warm::read_memory();
  if (!mem) return mem.error();
  const std::uint64_t reserve = config.daemon.warm_reserve.value_or(default_warm_reserve(mem->total));
  return mem->available > reserve ? mem->available - reserve : 0;
}

WarmReport report_of(const warm::Progress& p) {
  WarmReport w;
  w.bytes_total = p.bytes_total;
  w.bytes_resident_before = p.bytes_resident_before;
  w.bytes_warmed = p.bytes_warmed;
  return w;
}

// The journal's closing line of a warming run.
std::string closing_note(const warm::Report& r, std::uint64_t budget, std::chrono::milliseconds took) {
  const auto& t = r.totals;
  std::string note;
  if (r.budget_reached)
    note = fmt::format("warmed {} of {}: RAM budget ({} for warming)",
                       util::format_bytes(t.bytes_resident_before + t.bytes_warmed), util::format_bytes(t.bytes_total),
                       util::format_bytes(budget));
  else
    note = fmt::format("warmed {} in {}: {} read, {} already resident", util::format_bytes(t.bytes_total),
                       util::format_seconds(took), util::format_bytes(t.bytes_warmed),
                       util::format_bytes(t.bytes_resident_before));
  if (!r.skipped.empty())
    note += fmt::format("; {} file{} not warmed, from {} ({})", r.skipped.size(), r.skipped.size() == 1 ? "" : "s",
                        r.skipped.front().path.filename().string(), r.skipped.front().reason);
  return note;
}

// The io_error of a read that failed while warming `what` (MODEL at COMMIT12), about the file's
// repository path (under the revision's folder `dir`).
Error read_error(const warm::ReadFailure& f, const std::filesystem::path& dir, const std::string& what) {
  const std::string file = f.path.lexically_relative(dir).generic_string();
  return make_error(Errc::io_error,
                    fmt::format("cannot read {} of {}, at byte {}: {}", file, what, f.offset, std::strerror(f.err)),
                    {file});
}

// What one warming job found: the report, the budget, or why it could not start.
struct Job {
  Result<std::uint64_t> budget = std::uint64_t{0};
  warm::Report report;
};

}  // namespace

asio::awaitable<Result<Warmed>> warm_revision(Services& s, const config::ModelConfig& model, const std::string& commit,
                                              const sys::Fields& fields, const WarmProgressFn& progress,
                                              bool cancellable) {
  auto stop = std::make_shared<warm::Stop>();
  auto cs = co_await asio::this_coro::cancellation_state;
  if (cancellable && cs.cancelled() != asio::cancellation_type::none) co_return make_error(Errc::cancelled, "cancelled");
  if (cancellable && cs.slot().is_connected()) cs.slot().assign([stop](asio::cancellation_type) { stop->request(); });
  const auto ex = co_await asio::this_coro::executor;
  auto alive = std::make_shared<bool>(true);
  auto started = std::make_shared<bool>(false);
  // Called on a reader thread: the figures travel to the loop, where the first is the start line.
  const std::string what = fmt::format("{} at {}", model.name, commit.substr(0, 12));
  warm::ProgressFn on_progress = [ex, alive, started, what, fields, progress](const warm::Progress& p) {
    asio::post(ex, [alive, started, what, fields, progress, p] {
      if (!*alive) return;
      if (!*started) {
        *started = true;
        sys::logf(sys::Level::info, fields, "warming {}: {}, {} already resident", what,
                  util::format_bytes(p.bytes_total), util::format_bytes(p.bytes_resident_before));
      }
      if (progress) progress(report_of(p));
    });
  };
  const auto config = s.config;
  const auto t0 = std::chrono::steady_clock::now();
  // Its own thread (the readers are the warmer's own too): the disk pool stays free for others.
  asio::thread_pool own(1);
  auto job = co_await util::on_pool<Job>(own, [&] {
    Job j;
    j.budget = warm_budget(*config);
    auto files = revision_files(s.store, model.name, commit);
    if (!j.budget || !files) {
      if (j.budget) j.budget = files.error();
      return j;
    }
    warm::Options o;
    o.budget = *j.budget;
    o.max_bytes_per_s = test_hooks::number("MODELD_TEST_WARM_RATE").value_or(0);
    j.report = warm::warm_files(*files, o, on_progress, *stop);
    return j;
  });
  if (cancellable && cs.slot().is_connected()) cs.slot().clear();
  *alive = false;
  if (!job.budget) co_return job.budget.error();
  if (job.report.stopped) co_return make_error(Errc::cancelled, "cancelled while warming");
  if (job.report.read_failure)
    co_return read_error(*job.report.read_failure, s.store.revision_dir(model.name, commit), what);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  Warmed w{report_of(job.report.totals), closing_note(job.report, *job.budget, took)};
  sys::log(sys::Level::notice, fields, w.note);
  co_return w;
}

asio::awaitable<Result<Warmed>> run_warming(Services& s, const Run& run, Decisions& decisions) {
  const auto& commit = *run.record.commit;
  if (run.model.serve.warm == "off") {
    sys::log(sys::Level::info, run.fields(), "warming off for this model");
    co_return Warmed{std::nullopt, "warming off for this model"};
  }
  const sys::Fields fields = run.fields();
  const WarmProgressFn progress = [&decisions](const WarmReport& p) { decisions.warm_progress(p); };
  auto w = co_await warm_revision(s, run.model, commit, fields, progress, true);
  if (!w) co_return w.error();
  co_return std::move(*w);
}

asio::awaitable<std::optional<std::uint64_t>> resident_at_launch(Services& s, const Run& run) {
  auto& st = s.store;
  const auto& name = run.model.name;
  const auto& commit = *run.record.commit;
  co_return co_await util::on_pool<std::optional<std::uint64_t>>(s.disk_pool, [&]() -> std::optional<std::uint64_t> {
    auto files = revision_files(st, name, commit);
    if (!files) return std::nullopt;
    std::uint64_t total = 0;
    bool measured = false;  // a report of 0 must mean nothing resident, not nothing measurable
    for (const auto& f : *files)
      if (auto r = warm::resident_bytes(f)) {
        total += *r;
        measured = true;
      }
    if (!measured && !files->empty()) return std::nullopt;
    return total;
  });
}

}  // namespace modeld::deploy
