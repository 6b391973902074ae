#include "deploy/redeploy.hpp"
#include "deploy/launch.hpp"

#include "units/service_manager.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace modeld::deploy {

RedeployCheck compare_with_serving(const Deployment& d, const std::optional<ActiveRecord>& active,
                                   const StartedSettings& now) {
  if (!active || active->model != d.model || !d.commit || active->commit != *d.commit) return {};
  if (d.restart) return {Redeploy::restart_requested, "restart requested"};
  if (!active->started)
    return {Redeploy::settings_changed, "the settings its service was started with are not recorded"};
  const auto changed = settings_changed(*active->started, now);
  if (!changed.empty()) return {Redeploy::settings_changed, fmt::format("{}", fmt::join(changed, ", "))};
  return {Redeploy::noop, ""};
}

boost::asio::awaitable<std::optional<std::string>> not_ready_reason(Services& s, const Run& run,
                                                                   const ServingProbe& probe) {
  const auto unit = units::serve_unit(run.model.name);
  auto st = co_await s.units.status(unit);
  if (!st) co_return fmt::format("cannot check {}: {}", unit, st.error().message);
  if (st->active_state != units::ActiveState::active)
    co_return fmt::format("{} is {}", unit, units::to_string(st->active_state));
  if (auto same = co_await check_still_verified(s, run, "restarting it"); !same) co_return same.error().message;
  if (auto ok = co_await probe(run.model); !ok) co_return fmt::format("its probe failed: {}", ok.error().message);
  co_return std::nullopt;
}

}  // namespace modeld::deploy
