// rolling_back: the new model failed after the services in conflict with it were stopped; bring
// every one of them back, in the order they had been put into service.
#include "deploy/rollback.hpp"
#include "deploy/health_check.hpp"
#include "deploy/stop_old.hpp"
#include "deploy/launch.hpp"
#include "deploy/warm.hpp"

#include "store/store.hpp"
#include "units/service_manager.hpp"
#include "util/on_pool.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace modeld::deploy {

namespace {

// Prepares service `a` as it ran (its revision linked, its drop-in from its recorded settings,
// its files warmed) and asks for its start; errors say why it cannot come back.
boost::asio::awaitable<Result<void>> start_previous(Services& s, const Run& run, const ActiveRecord& a) {
  const auto* old = s.config->find_model(a.model);
  if (!old) co_return make_error(Errc::rollback_failed, fmt::format("model {} is no longer configured", a.model));
  // Its files were never touched: a new revision of the same model lives in its own folder, unless
  // allow_downtime evicted it. The stat and the link's switch block: on the disk pool.
  auto switched = co_await util::on_pool<Result<void>>(s.disk_pool, [&]() -> Result<void> {
    std::error_code ec;
    if (!std::filesystem::is_directory(s.store.revision_dir(a.model, a.commit), ec))
      return make_error(Errc::rollback_failed,
                        fmt::format("model {} was evicted to make room (allow_downtime) and cannot be restored", a.model));
    return s.store.switch_link(a.model, a.commit);
  });
  if (!switched) co_return make_error(Errc::rollback_failed, switched.error().message);
  // The old server as it ran (its recorded settings), not as today's configuration renders it.
  if (auto r = co_await install_dropin(s, *old, a.started); !r) co_return make_error(Errc::rollback_failed, r.error().message);
  // Warming the new revision may have pushed the old one out of the page cache: it is read back
  // first (not cancellable, as rolling back is not). A failure to warm, an unreadable file
  // included, is said and the old server started anyway: whether it still loads is its start's
  // to tell, and nothing better than trying is left to do.
  const sys::Fields fields = run.fields();
  if (old->serve.warm != "off") {
    const WarmProgressFn none;
    sys::logf(sys::Level::notice, fields, "warming the previous revision of {} before starting it again", a.model);
    if (auto w = co_await warm_revision(s, *old, a.commit, fields, none, false); !w) {
      sys::Fields f = fields;
      for (const auto& file : w.error().files) f.extra.emplace_back("MODELD_FILE", file);
      sys::logf(sys::Level::warning, f, "cannot warm {}: {}; starting it anyway", a.model, w.error().message);
    }
  }
  const auto unit = units::serve_unit(a.model);
  sys::logf(sys::Level::warning, fields, "starting {} again (model {} at {})", unit, a.model, a.commit.substr(0, 12));
  if (auto r = co_await units::reset_failed_and_start(s.units, unit); !r)
    co_return make_error(Errc::rollback_failed, r.error().message);
  co_return Result<void>{};
}

}  // namespace

boost::asio::awaitable<Result<Restored>> run_rolling_back(Services& s, const Run& run) {
  const auto new_unit = units::serve_unit(run.model.name);
  const auto stop_timeout = config::stop_budget(run.model.serve);
  sys::logf(sys::Level::warning, run.fields(), "stopping {}", new_unit);
  if (auto r = co_await s.units.stop(new_unit); !r)
    co_return make_error(Errc::rollback_failed, "could not stop the new service: " + r.error().message);
  if (auto r = co_await units::wait_inactive(s.units, new_unit, stop_wait(stop_timeout)); !r)
    co_return make_error(Errc::rollback_failed, "the new service did not stop: " + r.error().message);
  if (run.record.previous.empty()) co_return make_error(Errc::rollback_failed, "no model served before: nothing to restore");

  // Started one after another in the order they were put into service, then each awaited: they
  // load side by side, on GPUs of their own.
  Restored out;
  std::vector<const ActiveRecord*> started;
  for (const auto& a : run.record.previous) {
    const auto asked = wall_clock_ns();
    if (auto r = co_await start_previous(s, run, a); !r) {
      out.failed.emplace_back(a.model, r.error().message);
      continue;
    }
    if (!out.launched.start_requested_ns) out.launched.start_requested_ns = asked;
    started.push_back(&a);
  }
  for (const auto* a : started) {
    const auto* old = s.config->find_model(a->model);
    auto ready = co_await wait_model_ready(s, *old, run.fields());
    if (!ready) {
      out.failed.emplace_back(a->model, "the previous model did not become ready again: " + ready.error().message);
      continue;
    }
    out.readiness.port_ns = std::max(out.readiness.port_ns, ready->port_ns);
    out.readiness.ready_ns = std::max(out.readiness.ready_ns, ready->ready_ns);
    out.restored.push_back(a->model);
    sys::logf(sys::Level::notice, run.fields(), "model {} serves again", a->model);
  }
  co_return out;
}

}  // namespace modeld::deploy
