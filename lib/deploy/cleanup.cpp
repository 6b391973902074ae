// cleanup: after health_checking, the model's older revisions go (the API still shows
// health_checking). The driver records that it began before calling it, so a restart finishes it.
#include "deploy/cleanup.hpp"

#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/quantities.hpp"

namespace modeld::deploy {

boost::asio::awaitable<Result<Cleaned>> run_cleanup(Services& s, const Run& run, const std::string& keep_commit) {
  // On the disk pool: deleting a revision of hundreds of GB takes time. The store also spares the
  // revision models_dir/NAME links. By reference only (GCC 12 mis-copies class objects captured
  // by value in a coroutine).
  // Revisions pulled ahead stay until they are deployed or removed.
  std::vector<std::string> spare;
  if (auto p = run.pulled.find(run.model.name); p != run.pulled.end()) spare = p->second;
  auto rm = co_await util::on_pool<Result<std::uint64_t>>(
      s.disk_pool, [&] { return s.store.remove_other_revisions(run.model.name, keep_commit, spare); });
  if (!rm) co_return rm.error();
  if (*rm > 0)
    sys::logf(sys::Level::info, run.fields(), "removed older revisions of {} ({})", run.model.name,
              util::format_bytes(*rm));
  co_return Cleaned{*rm};
}

}  // namespace modeld::deploy
