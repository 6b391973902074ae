// stopping_old: stop the model that serves now and wait until its unit is inactive.
#include "deploy/phases.hpp"

#include "units/service_manager.hpp"
#include "util/units.hpp"

namespace modeld::deploy {

std::chrono::milliseconds stop_wait(std::chrono::milliseconds stop_timeout) {
  return stop_timeout + std::chrono::seconds(15);
}

boost::asio::awaitable<Result<void>> run_stopping_old(Services& s, Run& run) {
  if (!run.previous) {
    sys::logf(sys::Level::info, run.fields(), "nothing to stop: no model is active");
    co_return Result<void>{};
  }
  const auto unit = units::serve_unit(run.previous->model);
  const auto* old_cfg = s.config->find_model(run.previous->model);
  const auto timeout = old_cfg ? old_cfg->serve.stop_timeout : std::chrono::milliseconds(std::chrono::minutes(5));

  auto st = co_await s.units.status(unit);
  if (st && (st->active_state == "inactive" || st->active_state == "failed")) {
    sys::logf(sys::Level::info, run.fields(), "nothing to stop: {} is already {}", unit, st->active_state);
    co_return Result<void>{};
  }
  sys::logf(sys::Level::info, run.fields(), "stopping {} (model {}), waiting up to {}", unit, run.previous->model,
            util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(timeout)));
  if (auto r = co_await s.units.stop(unit); !r) co_return r.error();
  if (auto r = co_await units::wait_inactive(s.units, unit, stop_wait(timeout)); !r) co_return r.error();
  sys::logf(sys::Level::info, run.fields(), "{} stopped", unit);
  co_return Result<void>{};
}

}  // namespace modeld::deploy
