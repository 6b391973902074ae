#include "deploy/reconcile.hpp"
#include "deploy/launch.hpp"

#include "deploy/gpu_watch.hpp"
#include "units/service_manager.hpp"
#include "util/on_pool.hpp"

#include <fmt/format.h>

namespace modeld::deploy {

namespace asio = boost::asio;

namespace {

constexpr std::string_view kUnitPrefix = "modeld-serve@", kUnitSuffix = ".service";

// NAME of "modeld-serve@NAME.service" (model names need no systemd escaping: config.cpp allows
// only characters that stand for themselves in an instance name).
std::string model_of_unit(const std::string& unit) {
  return unit.substr(kUnitPrefix.size(), unit.size() - kUnitPrefix.size() - kUnitSuffix.size());
}

// The settings the unit runs with, when they can be known: the drop-in modeld wrote is exactly
// what today's configuration renders. nullopt otherwise (a redeploy then restarts the server).
asio::awaitable<std::optional<StartedSettings>> settings_if_unchanged(Services& s, const config::ModelConfig& m,
                                                                      const std::string& unit) {
  auto written = s.units.read_dropin(unit, "10-modeld.conf");
  if (!written || !*written) co_return std::nullopt;
  const auto settings = started_settings(s, m);
  std::vector<std::string> uuids;
  if (settings.gpu_ids) {
    auto found = co_await gpu_uuids(s, *settings.gpu_ids);
    if (!found) co_return std::nullopt;
    uuids = std::move(*found);
  }
  if (**written != render_dropin(m, settings, uuids)) co_return std::nullopt;
  co_return settings;
}

struct OnDisk {
  std::optional<std::string> commit;
  store::ManifestCheck manifest = store::ManifestCheck::absent;
};

asio::awaitable<UnrecordedUnit> judge(Services& s, const config::Config& cfg, const std::string& unit,
                                      const std::string& now) {
  UnrecordedUnit u{model_of_unit(unit), unit, std::nullopt, {}};
  const auto* m = cfg.find_model(u.model);
  if (!m) {
    u.why = fmt::format("model {} is not configured: modeld leaves {} alone (systemctl stop {} if it should not "
                        "run)", u.model, unit, unit);
    co_return u;
  }
  const auto disk = co_await util::on_pool<OnDisk>(s.disk_pool, [&] {
    OnDisk d;
    d.commit = s.store.linked_commit(u.model);
    if (d.commit) d.manifest = s.store.check_manifest(u.model, *d.commit);
    return d;
  });
  if (!disk.commit) {
    u.why = fmt::format("{} links no revision: what {} serves is unknown, so it is not adopted (deploy {} to "
                        "put it under modeld, or systemctl stop {})", s.store.model_path(u.model).string(), unit,
                        u.model, unit);
    co_return u;
  }
  if (disk.manifest == store::ManifestCheck::absent) {
    u.why = fmt::format("its revision {} was never verified: not adopted (deploy {} to verify and adopt it)",
                        *disk.commit, u.model);
    co_return u;
  }
  auto settings = co_await settings_if_unchanged(s, *m, unit);
  u.why = fmt::format("revision {} (models_dir/{} links it{}); {}", *disk.commit, u.model,
                      disk.manifest == store::ManifestCheck::changed ? ", though files changed since its verification"
                                                                      : "",
                      settings ? "its drop-in is today's configuration's"
                               : "its drop-in is not today's configuration's: placement is the configuration's, and "
                                 "the next deploy restarts it");
  u.adopt = ActiveRecord{u.model, *disk.commit, now, std::move(settings)};
  co_return u;
}

}  // namespace

asio::awaitable<Result<std::vector<UnrecordedUnit>>> find_unrecorded_units(Services& s, std::set<std::string> recorded,
                                                                           std::set<std::string> skip,
                                                                           std::string now) {
  const auto cfg = s.config;  // a reload while this awaits must not free the tables it reads
  auto up = co_await s.units.units_up(fmt::format("{}*{}", kUnitPrefix, kUnitSuffix));
  if (!up) co_return up.error();
  std::vector<UnrecordedUnit> out;
  for (const auto& unit : *up) {
    if (unit.size() <= kUnitPrefix.size() + kUnitSuffix.size()) continue;
    const auto model = model_of_unit(unit);
    if (recorded.contains(model) || skip.contains(model)) continue;
    out.push_back(co_await judge(s, *cfg, unit, now));
  }
  co_return out;
}

}  // namespace modeld::deploy
