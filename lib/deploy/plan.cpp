// planning: revision -> commit, file listing, filters, what is still missing.
#include "deploy/phases.hpp"

#include "store/store.hpp"
#include "util/text.hpp"
#include "util/units.hpp"
#include "verify/verify.hpp"

#include <fmt/format.h>

namespace modeld::deploy {

boost::asio::awaitable<Result<void>> run_planning(Services& s, Run& run) {
  auto& rec = run.record;
  // A resumed deployment keeps the commit it planned, so a push in between cannot mix versions.
  const std::string revision = rec.commit.value_or(run.model.revision);
  auto snap = co_await s.hub.snapshot(run.model.repo, revision);
  if (!snap) co_return snap.error();

  hub::Snapshot kept = *snap;
  kept.files.clear();
  for (const auto& f : snap->files)
    if (util::passes_filters(f.path, run.model.include, run.model.exclude)) kept.files.push_back(f);

  auto dropped = verify::needed_but_filtered(snap->files, kept.files);
  if (!dropped.empty()) {
    std::string list;
    for (const auto& d : dropped) list += (list.empty() ? "" : ", ") + d;
    co_return make_error(Errc::plan_invalid,
                         fmt::format("model {}: include/exclude filter out files the checkpoint needs: {} "
                                     "(set in {})",
                                     run.model.name, list, run.model.source_file.string()));
  }
  if (kept.files.empty())
    co_return make_error(Errc::plan_invalid, fmt::format("model {}: no file of {} at {} passes include/exclude",
                                                         run.model.name, run.model.repo, snap->commit));

  rec.commit = snap->commit;
  if (auto r = s.store.prepare_revision(run.model.name, snap->commit); !r) co_return r.error();

  std::uint64_t total = 0;
  for (const auto& f : kept.files) total += f.size;

  if (s.store.manifest_still_matches(run.model.name, snap->commit)) {
    run.missing.clear();
    sys::logf(sys::Level::info, run.fields(), "{} at {} ({}): {} files, {}, already on disk and verified",
              run.model.repo, revision, snap->commit.substr(0, 12), kept.files.size(), util::format_bytes(total));
  } else {
    auto missing = s.store.link_unchanged_and_list_missing(run.model.name, kept);
    if (!missing) co_return missing.error();
    run.missing = std::move(*missing);
    std::uint64_t need = 0;
    for (const auto& f : run.missing) need += f.size;
    sys::logf(sys::Level::info, run.fields(), "{} at {} is commit {}: {} files, {}; {} files, {} to download",
              run.model.repo, revision, snap->commit, kept.files.size(), util::format_bytes(total),
              run.missing.size(), util::format_bytes(need));
  }
  rec.progress.bytes_total = 0;
  rec.progress.files_total = static_cast<unsigned>(run.missing.size());
  for (const auto& f : run.missing) rec.progress.bytes_total += f.size;
  run.snapshot = std::move(kept);
  co_return Result<void>{};
}

}  // namespace modeld::deploy
