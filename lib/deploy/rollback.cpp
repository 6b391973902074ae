// rolling_back: the new model failed after the old one was stopped; bring the old one back.
#include "deploy/phases.hpp"

#include "store/store.hpp"
#include "units/service_manager.hpp"
#include "util/on_pool.hpp"

#include <fmt/format.h>

namespace modeld::deploy {

boost::asio::awaitable<Result<Restored>> run_rolling_back(Services& s, const Run& run) {
  const auto new_unit = units::serve_unit(run.model.name);
  const auto stop_timeout = run.model.serve.stop_timeout;
  sys::logf(sys::Level::warning, run.fields(), "stopping {}", new_unit);
  if (auto r = co_await s.units.stop(new_unit); !r)
    co_return make_error(Errc::rollback_failed, "could not stop the new service: " + r.error().message);
  if (auto r = co_await units::wait_inactive(s.units, new_unit, stop_wait(stop_timeout)); !r)
    co_return make_error(Errc::rollback_failed, "the new service did not stop: " + r.error().message);

  if (!run.previous) co_return make_error(Errc::rollback_failed, "no model served before: nothing to restore");
  const auto* old = s.config->find_model(run.previous->model);
  if (!old)
    co_return make_error(Errc::rollback_failed,
                         fmt::format("model {} that served before is no longer configured", run.previous->model));
  // Its files were never touched: a new revision of the same model lives in its own folder.
  // The link's switch (blocking: on the disk pool).
  auto switched = co_await util::on_pool<Result<void>>(
      s.disk_pool, [&] { return s.store.switch_link(old->name, run.previous->commit); });
  if (!switched) co_return make_error(Errc::rollback_failed, switched.error().message);
  // The old server as it ran (its recorded settings), not as today's configuration renders it.
  if (auto r = co_await install_dropin(s, *old, run.record.previous_started); !r)
    co_return make_error(Errc::rollback_failed, r.error().message);
  // Warming the new revision may have pushed the old one out of the page cache: it is read back
  // first (not cancellable, as rolling back is not; a failure to warm only slows the start).
  if (old->serve.warm != "off") {
    const sys::Fields fields = run.fields();
    const WarmProgressFn none;
    sys::logf(sys::Level::notice, fields, "warming the previous revision of {} before starting it again", old->name);
    if (auto w = co_await warm_revision(s, *old, run.previous->commit, fields, none, false); !w)
      sys::logf(sys::Level::warning, fields, "cannot warm {}: {}", old->name, w.error().message);
  }
  const auto old_unit = units::serve_unit(old->name);
  sys::logf(sys::Level::warning, run.fields(), "starting {} again (model {} at {})", old_unit, old->name,
            run.previous->commit.substr(0, 12));
  const Launched launched{wall_clock_ns()};
  if (auto r = co_await units::reset_failed_and_start(s.units, old_unit); !r)
    co_return make_error(Errc::rollback_failed, r.error().message);
  auto ready = co_await wait_model_ready(s, *old, run.fields());
  if (!ready)
    co_return make_error(Errc::rollback_failed, "the previous model did not become ready again: " + ready.error().message);
  sys::logf(sys::Level::notice, run.fields(), "model {} serves again", old->name);
  co_return Restored{launched, *ready};
}

}  // namespace modeld::deploy
