// downloading: hand the missing files to the download engine.
#include "deploy/download.hpp"

#include "fetch/fetch.hpp"
#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>

namespace modeld::deploy {

boost::asio::awaitable<Result<Downloaded>> run_downloading(Services& s, const Run& run, Decisions& decisions) {
  if (run.missing.empty()) {
    sys::logf(sys::Level::info, run.fields(), "nothing to download: every file is on disk");
    co_return Downloaded{};
  }
  const auto& cfg = *s.config;
  fetch::Options opt;
  opt.repo = run.model.repo;
  opt.commit = *run.record.commit;
  opt.dest_dir = s.store.revision_dir(run.model.name, *run.record.commit);
  opt.parallel_files = cfg.hub.parallel_files;
  opt.max_bytes_per_s = cfg.hub.max_bytes_per_s;
  opt.disk_reserve = cfg.daemon.disk_reserve;
  const std::uint64_t total = util::total_size(run.missing);
  sys::logf(sys::Level::info, run.fields(), "downloading {} files ({}) from {}, {} at once", run.missing.size(),
            util::format_bytes(total), s.hub.endpoint(), opt.parallel_files);

  fetch::Fetcher fetcher(s.hub, s.hub_client, s.disk_pool, opt);
  std::uint64_t done = 0;
  auto got = co_await fetcher.run(run.missing, [&decisions, &done](const fetch::Progress& p) {
    done = p.bytes_done;
    decisions.progress(p);
  });
  if (!got) {
    Error e = got.error();
    // A listed file the Hub does not have: the listing may have been wrong, read it again next time.
    if (e.code == Errc::hub_not_found) s.hub.forget_listing(run.model.repo, *run.record.commit);
    if (e.code == Errc::disk_full) {
      // Another writer filled the disk after freeing_disk made room (or the listing's sizes were
      // wrong): say by how much it is short. The partial files stay for a resume once there is
      // room; nothing was promoted.
      // A statvfs (blocking: on the disk pool).
      auto free = co_await util::on_pool<Result<std::uint64_t>>(s.disk_pool, [&] { return store::free_bytes(opt.dest_dir); });
      const std::uint64_t left = total > done ? total - done : 0;
      const std::uint64_t want = util::add_bytes(left, opt.disk_reserve);
      e.message += fmt::format("; {} of the download is still to come, {} is free on that file system and "
                               "disk_reserve is {}{}; the partial files are kept, deploy again once there is room",
                               util::format_bytes(left), free ? util::format_bytes(*free) : std::string("an unknown amount"),
                               util::format_bytes(opt.disk_reserve),
                               free && *free < want ? " (short by " + util::format_bytes(want - *free) + ")" : "");
    }
    co_return e;
  }
  Downloaded out;
  for (const auto& f : *got) out.fetched.insert(f.path);
  sys::logf(sys::Level::info, run.fields(), "downloaded {} files, {}", got->size(), util::format_bytes(total));
  co_return out;
}

}  // namespace modeld::deploy
