// planning: revision -> commit, file listing, filters, what is still missing.
#include "deploy/plan.hpp"
#include "deploy/free_disk.hpp"

#include "deploy/preflight.hpp"
#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "verify/index.hpp"
#include "verify/verify.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <thread>

namespace modeld::deploy {

namespace {

// Reads every safetensors index the plan keeps (a few kB each) and checks, before any shard is
// downloaded, that each shard it names is in the repository's listing and passes the filters:
// otherwise a 600 GB download would end in verifying, or in the server's load, with a missing
// shard.
boost::asio::awaitable<Result<void>> check_index_shards(Services& s, const config::ModelConfig& model,
                                                        const repo::Snapshot& all, const repo::Snapshot& kept) {
  // Both listings are sorted by path: binary search, no copy of 100,000 names.
  auto has = [](const repo::Snapshot& s, const std::string& path) {
    auto it = std::lower_bound(s.files.begin(), s.files.end(), path,
                               [](const repo::RepoFile& f, const std::string& p) { return f.path < p; });
    return it != s.files.end() && it->path == path;
  };
  for (const auto& index : kept.files) {
    if (!index.path.ends_with(".safetensors.index.json")) continue;
    // Within hub.listing_timeout per try, and retried as listings are.
    auto body = co_await s.hub.read_metadata(all.repo, all.commit, index.path, 64u << 20);
    if (!body) co_return body.error();
    auto shards = verify::parse_safetensors_index(*body, index.path);
    if (!shards)
      co_return make_error(Errc::checkpoint_incomplete,
                           fmt::format("{} (read from {} at {})", shards.error().message, all.repo, all.commit),
                           std::vector<std::string>{index.path});
    std::set<std::string> absent, filtered;
    for (const auto& [path, tensors] : *shards) {
      if (!has(all, path)) absent.insert(path);
      else if (!has(kept, path)) filtered.insert(path);
    }
    auto join = [](const std::set<std::string>& v) { return fmt::format("{}", fmt::join(v, ", ")); };
    if (!absent.empty())
      co_return make_error(Errc::checkpoint_incomplete,
                           fmt::format("{} of {} at {} names shards the repository does not have: {}", index.path,
                                       all.repo, all.commit, join(absent)),
                           std::vector<std::string>(absent.begin(), absent.end()));
    if (!filtered.empty())
      co_return make_error(Errc::plan_invalid,
                           fmt::format("model {}: include/exclude filter out shards that {} names: {} (set in {})",
                                       model.name, index.path, join(filtered), model.source_file.string()),
                           std::vector<std::string>(filtered.begin(), filtered.end()));
  }
  co_return Result<void>{};
}

// Files still missing that a folder made outside modeld at models_dir/NAME holds (an
// `hf download --local-dir`, a copy by hand) are hashed against the listing and hard-linked into
// the revision at `commit`; they leave `missing` and join `adopted`, the rest is downloaded.
// Hashing a large checkpoint takes minutes, so the journal says first what is being hashed.
boost::asio::awaitable<Result<void>> adopt_foreign_folder(Services& s, const Run& run, const std::string& commit,
                                                          std::vector<repo::RepoFile>& missing,
                                                          std::set<std::string>& adopted_paths) {
  if (missing.empty()) co_return Result<void>{};
  // A stat and a scan of the folder: on the disk pool (by reference only: GCC 12).
  auto folder = co_await util::on_pool<std::optional<std::filesystem::path>>(
      s.disk_pool, [&] { return s.store.foreign_folder(run.model.name); });
  if (!folder) co_return Result<void>{};
  auto scan = co_await util::on_pool<Result<store::Adoption>>(
      s.disk_pool, [&] { return s.store.scan_adoption(run.model.name, commit, missing, *folder); });
  if (!scan) co_return scan.error();
  sys::logf(sys::Level::info, run.fields(),
            "{} is a folder made outside modeld{}: hashing {} of its files ({}) that have the listed size",
            folder->string(), scan->hf_metadata ? " (by hf download)" : "", scan->candidates.size(),
            util::format_bytes(scan->candidate_bytes));
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto adopted = co_await util::on_pool<Result<store::Adoption>>(
      s.disk_pool, [&] { return s.store.adopt(run.model.name, commit, missing, *folder, cores); });
  if (!adopted) co_return adopted.error();
  for (const auto& r : adopted->rejected) {
    sys::Fields f = run.fields();
    f.extra.emplace_back("MODELD_FILE", r.path);
    sys::logf(sys::Level::notice, f, "not adopted, to be downloaded: {}", r.reason);
  }
  std::set<std::string> taken(adopted->adopted.begin(), adopted->adopted.end());
  std::erase_if(missing, [&](const repo::RepoFile& f) { return taken.contains(f.path); });
  adopted_paths.insert(taken.begin(), taken.end());
  sys::logf(sys::Level::notice, run.fields(),
            "adopted {} files ({}) from {} after hashing them (hard links, no copy); {} files left to download",
            adopted->adopted.size(), util::format_bytes(adopted->adopted_bytes), folder->string(), missing.size());
  co_return Result<void>{};
}

// What the disk side of planning found: `missing` is nullopt when the revision is on disk and
// verified already, else the files still missing after hard-linking unchanged ones from older
// revisions, with the files that changed since the revision's verification among them (`changed`).
struct Linked {
  std::optional<std::vector<repo::RepoFile>> missing;
  std::vector<std::string> changed;
};

// The disk side of planning. Blocks.
Result<Linked> link_into_revision(store::Store& st, const std::string& name, const repo::Snapshot& kept) {
  if (auto r = st.prepare_revision(name, kept.commit); !r) return r.error();
  if (st.manifest_still_matches(name, kept.commit)) return Linked{};
  Linked out;
  auto missing = st.link_unchanged_and_list_missing(name, kept, &out.changed);
  if (!missing) return missing.error();
  out.missing = std::move(*missing);
  return out;
}

// Why no file system could hold `path` beside the other listed files (`dirs`: every folder the
// listing implies), or nullopt: a name longer than NAME_MAX, or a path both a file and a folder.
std::optional<std::string> unstorable(const std::string& path, const std::set<std::string, std::less<>>& dirs) {
  for (std::size_t begin = 0; begin <= path.size();) {
    const auto end = std::min(path.find('/', begin), path.size());
    if (end - begin > 255) return fmt::format("a name in it is {} bytes long, more than the 255 a file system allows", end - begin);
    begin = end + 1;
  }
  if (dirs.contains(path)) return std::string("it is listed both as a file and as a folder of other files");
  return std::nullopt;
}

std::set<std::string, std::less<>> folders_of(const std::vector<repo::RepoFile>& files) {
  std::set<std::string, std::less<>> dirs;
  for (const auto& f : files)
    for (auto slash = f.path.find('/'); slash != std::string::npos; slash = f.path.find('/', slash + 1))
      dirs.insert(f.path.substr(0, slash));
  return dirs;
}

}  // namespace

Result<void> check_listed_files(const config::ModelConfig& model, const repo::Snapshot& kept,
                                std::uint64_t max_file_size) {
  const auto where = [&] { return fmt::format("the listing of {} at {}", model.repo, kept.commit); };
  const auto dirs = folders_of(kept.files);
  std::uint64_t total = 0;
  for (const auto& f : kept.files) {
    if (auto why = unstorable(f.path, dirs))
      return make_error(Errc::hub_bad_response,
                        fmt::format("{} names '{}', which cannot be stored: {}; refusing the revision", where(), f.path,
                                    *why),
                        std::vector<std::string>{f.path});
    if (store::is_reserved_path(f.path))
      return make_error(Errc::hub_bad_response,
                        fmt::format("{} names '{}', but {}/ inside a revision is modeld's own (manifest, partial "
                                    "downloads): refusing the revision (if the repository really has it, add "
                                    "\"{}/*\" to exclude of model {} in {})",
                                    where(), f.path, store::metadata_dir, store::metadata_dir,
                                    model.name, model.source_file.string()),
                        std::vector<std::string>{f.path});
    if (f.size > max_file_size)
      return make_error(Errc::hub_bad_response,
                        fmt::format("{} says '{}' is {} bytes, more than hub.max_file_size ({} bytes): no real "
                                    "checkpoint file is that large; refusing the revision",
                                    where(), f.path, f.size, max_file_size),
                        std::vector<std::string>{f.path});
    auto sum = util::checked_add(total, f.size);
    if (!sum)
      return make_error(Errc::hub_bad_response,
                        fmt::format("{}: the sizes of its files add up to more than 2^64 bytes (at '{}')", where(),
                                    f.path),
                        std::vector<std::string>{f.path});
    total = *sum;
  }
  return {};
}

boost::asio::awaitable<Result<repo::Snapshot>> list_planned_files(Services& s, const config::ModelConfig& model,
                                                                 const std::string& revision) {
  // Shared with the Hub's cache and concurrent plans: only the filtered copy is this plan's.
  auto listed = co_await s.hub.listing(model.repo, revision);
  if (!listed) co_return listed.error();
  const repo::Snapshot* snap = listed->get();

  repo::Snapshot kept;
  kept.repo = snap->repo;
  kept.revision = revision;
  kept.commit = snap->commit;
  for (const auto& f : snap->files)
    if (util::passes_filters(f.path, model.include, model.exclude)) kept.files.push_back(f);
  if (auto r = check_listed_files(model, kept, s.config->hub.max_file_size); !r) {
    s.hub.forget_listing(model.repo, snap->commit);  // whatever sent it, ask again next time
    co_return r.error();
  }

  auto dropped = verify::needed_but_filtered(snap->files, kept.files);
  if (!dropped.empty()) {
    std::string list = fmt::format("{}", fmt::join(dropped, ", "));
    co_return make_error(Errc::plan_invalid,
                         fmt::format("model {}: include/exclude filter out files the checkpoint needs: {} "
                                     "(set in {})",
                                     model.name, list, model.source_file.string()),
                         std::move(dropped));
  }
  if (kept.files.empty())
    co_return make_error(Errc::plan_invalid, fmt::format("model {}: no file of {} at {} passes include/exclude",
                                                         model.name, model.repo, snap->commit));

  if (auto r = co_await check_index_shards(s, model, *snap, kept); !r) {
    if (r.error().code == Errc::checkpoint_incomplete) s.hub.forget_listing(model.repo, snap->commit);
    co_return r.error();
  }
  co_return kept;
}

namespace {

// Whether stopping_old must come before freeing_disk: allow_downtime, and only evicting models
// the deployment stops makes room for `need` bytes. Blocks (statvfs, a walk of the store).
Result<bool> downtime_first_needed(Services& s, const Run& run, std::uint64_t need) {
  auto without = plan_freeing_disk(s, need, run.model.name, run.serving, run.last_active, false, run.pulled);
  if (!without) return without.error();
  if (without->fits) return false;
  auto with = plan_freeing_disk(s, need, run.model.name, run.serving, run.last_active, true, run.pulled);
  if (!with) return with.error();
  const bool evicts_stopped = std::any_of(with->evict.begin(), with->evict.end(),
                                          [&](const auto& c) { return run.serving.stopped.contains(c.name); });
  return with->fits && evicts_stopped;
}

// The order planning decides: with allow_downtime, only when the download cannot fit otherwise
// does the active model go, and then it must be stopped before freeing_disk deletes its files.
// A resumed deployment keeps the order it decided. Disk work on the disk pool.
boost::asio::awaitable<Result<bool>> decide_order(Services& s, const Run& run, const Planned& p) {
  const auto& rec = run.record;
  if (rec.downtime_first || !rec.allow_downtime || run.record.previous.empty()) co_return rec.downtime_first;
  std::uint64_t need = 0;
  auto first = co_await util::on_pool<Result<bool>>(s.disk_pool, [&] {
    need = bytes_still_needed(s, run.model.name, p.snapshot.commit, p.missing);
    return downtime_first_needed(s, run, need);
  });
  if (first && *first)
    sys::logf(sys::Level::warning, run.fields(),
              "{} more are needed and only evicting {} makes room: allow_downtime is set, so {} stopped before "
              "freeing_disk and no rollback will be possible",
              util::format_bytes(need), fmt::join(run.serving.stopped, ", "),
              run.serving.stopped.size() == 1 ? "it is" : "they are");
  co_return first;
}

}  // namespace

boost::asio::awaitable<Result<Planned>> run_planning(Services& s, const Run& run, Decisions& decisions) {
  // Before the Hub and hours of download: what would make the new server fail after the stop.
  if (run.record.kind == Kind::deploy)
    if (auto r = co_await preflight_of_run(s, run, "not deploying"); !r) co_return r.error();
  // A resumed deployment keeps the commit it planned, so a push in between cannot mix versions.
  const std::string revision = run.record.commit.value_or(run.model.revision);
  auto listed = co_await list_planned_files(s, run.model, revision);
  if (!listed) co_return listed.error();
  Planned p;
  p.snapshot = std::move(*listed);
  const auto& kept = p.snapshot;
  // Durable before the revision folder exists: a restart finds the folder of the recorded commit.
  co_await decisions.commit_chosen(kept.commit);
  test_hooks::crash_point("commit_chosen");
  const std::uint64_t total = util::total_size(kept.files);

  // Stats and hard links of a store that may hold terabytes: on the disk pool. By reference only
  // (GCC 12 mis-copies class objects captured by value in a coroutine).
  auto linked = co_await util::on_pool<Result<Linked>>(s.disk_pool,
                                                      [&] { return link_into_revision(s.store, run.model.name, kept); });
  if (!linked) co_return linked.error();
  if (!linked->changed.empty())
    sys::logf(sys::Level::warning, run.fields(),
              "{} file{} of {} at {} changed since {} verified ({}): downloading {} again",
              linked->changed.size(), linked->changed.size() == 1 ? "" : "s", run.model.name,
              kept.commit.substr(0, 12), linked->changed.size() == 1 ? "it was" : "they were",
              fmt::join(linked->changed, ", "), linked->changed.size() == 1 ? "it" : "them");
  p.already_verified = !linked->missing;
  if (!linked->missing) {
    sys::logf(sys::Level::info, run.fields(), "{} at {} ({}): {} files, {}, already on disk and verified",
              run.model.repo, revision, kept.commit.substr(0, 12), kept.files.size(), util::format_bytes(total));
  } else {
    p.missing = std::move(*linked->missing);
    if (auto r = co_await adopt_foreign_folder(s, run, kept.commit, p.missing, p.adopted); !r) co_return r.error();
    sys::logf(sys::Level::info, run.fields(), "{} at {} is commit {}: {} files, {}; {} files, {} to download",
              run.model.repo, revision, kept.commit, kept.files.size(), util::format_bytes(total), p.missing.size(),
              util::format_bytes(util::total_size(p.missing)));
  }
  auto order = co_await decide_order(s, run, p);
  if (!order) co_return order.error();
  p.downtime_first = *order;
  p.files_total = static_cast<unsigned>(p.missing.size());
  p.bytes_total = util::total_size(p.missing);
  co_return p;
}

namespace {

// The disk side of the dry run: what is local, linkable and partial, and the eviction plan.
// Blocking (stats and tree walks): runs on the disk pool.
Result<PlanReport> plan_on_disk(Services& s, const config::ModelConfig& model, const repo::Snapshot& listed,
                                PlanReport p, const Serving& serving,
                                const std::map<std::string, std::string>& last_active, bool allow_downtime,
                                const Pulled& pulled) {
  std::vector<repo::RepoFile> missing;
  if (s.store.manifest_still_matches(model.name, p.commit)) {
    p.verified = true;
    p.bytes_local = p.bytes_total;
  } else {
    auto found = s.store.plan_missing(model.name, listed);
    if (!found) return found.error();
    missing = std::move(found->missing);
    p.bytes_linkable = found->linkable_bytes;
    // A folder made outside modeld supplies what it holds with the listed size (hashed later).
    if (auto folder = s.store.foreign_folder(model.name)) {
      auto scan = s.store.scan_adoption(model.name, p.commit, missing, *folder);
      if (!scan) return scan.error();
      p.adopt_from = folder->string();
      p.files_adoptable = scan->candidates.size();
      p.bytes_adoptable = scan->candidate_bytes;
      std::set<std::string> adoptable;
      for (const auto& f : scan->candidates) adoptable.insert(f.path);
      std::erase_if(missing, [&](const repo::RepoFile& f) { return adoptable.contains(f.path); });
    }
  }
  p.files_to_fetch = missing.size();
  p.bytes_to_fetch = util::total_size(missing);
  p.bytes_local = p.bytes_total - p.bytes_to_fetch;
  p.bytes_partial = missing.empty() ? 0 : s.store.partial_bytes(model.name, p.commit);
  p.bytes_needed = p.bytes_to_fetch > p.bytes_partial ? p.bytes_to_fetch - p.bytes_partial : 0;
  auto plan = plan_freeing_disk(s, p.bytes_needed, model.name, serving, last_active, allow_downtime, pulled);
  if (!plan) return plan.error();
  p.bytes_free = plan->bytes_free;
  p.fits = plan->fits;
  std::uint64_t evicted = 0;
  for (const auto& c : plan->evict) {
    PlannedEviction e;
    e.name = c.name;
    e.bytes = c.size_bytes;
    if (auto la = last_active.find(c.name); la != last_active.end()) e.last_active = la->second;
    e.active = serving.models.contains(c.name);
    if (e.active) p.rollback_possible = false;
    evicted += c.size_bytes;
    p.evictions.push_back(std::move(e));
  }
  if (model.serve.warm == "off") p.warming = "off";
  else if (!p.rollback_possible) p.warming = "in_outage";
  if (!p.fits && !allow_downtime && !serving.stopped.empty()) {
    auto with_active = plan_freeing_disk(s, p.bytes_needed, model.name, serving, last_active, true, pulled);
    p.fits_with_allow_downtime = with_active && with_active->fits;
  }
  if (!p.fits) {
    __extension__ using u128 = unsigned __int128;
    const u128 want = u128(p.bytes_needed) + p.disk_reserve, have = u128(p.bytes_free) + evicted;
    p.shortfall_bytes = want > have ? static_cast<std::uint64_t>(want - have) : 0;
  }
  return p;
}

}  // namespace

boost::asio::awaitable<Result<PlanReport>> dry_run_plan(Services& s, const config::ModelConfig& model,
                                                        const std::string& revision, bool allow_downtime, const Serving& serving,
                                                        const std::optional<std::string>& active,
                                                        const std::map<std::string, std::string>& last_active,
                                                        const Pulled& pulled) {
  auto listed = co_await list_planned_files(s, model, revision);
  if (!listed) co_return listed.error();
  PlanReport p;
  p.model = model.name;
  p.repo = model.repo;
  p.revision = revision;
  p.commit = listed->commit;
  p.allow_downtime = allow_downtime;
  p.active_model = active;
  p.stops.assign(serving.stopped.begin(), serving.stopped.end());
  p.disk_reserve = s.config->daemon.disk_reserve;
  p.files_total = listed->files.size();
  p.bytes_total = util::total_size(listed->files);

  // Stats and tree walks of a store that may hold terabytes: on the disk pool, as planning's
  // own disk work would be, and with the same functions, minus every change. The job captures
  // by reference only (GCC 12 mis-copies class objects captured by value in a coroutine).
  co_return co_await util::on_pool<Result<PlanReport>>(
      s.disk_pool, [&] { return plan_on_disk(s, model, *listed, p, serving, last_active, allow_downtime, pulled); });
}

}  // namespace modeld::deploy
