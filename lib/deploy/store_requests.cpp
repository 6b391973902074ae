// The Deployer's answers about the store: the model list (store walks), plan, verify and rm,
// with the refusals that keep them off a running deployment's files.
#include "deploy/deployer.hpp"
#include "deploy/record_run.hpp"
#include "deploy/maintenance.hpp"
#include "deploy/plan.hpp"
#include "deploy/preflight.hpp"
#include "deploy/reconcile.hpp"
#include "deploy/redeploy.hpp"
#include "util/json.hpp"

#include "fetch/fetch.hpp"
#include "repo/ids.hpp"
#include "store/store.hpp"
#include "sys/notify.hpp"
#include "sys/task.hpp"
#include "units/service_manager.hpp"
#include "util/memory.hpp"
#include "util/on_pool.hpp"
#include "util/test_hooks.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include <sys/stat.h>

namespace modeld::deploy {

namespace asio = boost::asio;

namespace {

// Whether anything of `model` is under models_dir: its link (or whatever is at its name) or its
// store folder. A name that is not a valid model name never is.
bool on_disk(const store::Store& st, const std::string& model) {
  if (!repo::valid_model_name(model)) return false;
  struct stat sb {};
  if (::lstat(st.model_path(model).c_str(), &sb) == 0) return true;
  const auto dir = st.models_dir() / ".store" / model;
  return ::lstat(dir.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

}  // namespace

namespace {

// What a walk of the store found of one model: its size, the revision GET /v1/models reports (the
// linked one, else the newest) and that revision's state.
struct DiskModel {
  std::uint64_t size_bytes = 0;
  std::optional<std::string> commit;
  std::string state = "partial";
  std::vector<std::pair<std::string, std::string>> revisions;  ///< every revision on disk: commit, state
};

// A revision's state as GET /v1/models names it. Blocks (reads the manifest, a stat per file).
std::string revision_state(const store::Store& st, const std::string& name, const std::string& commit) {
  const auto check = st.check_manifest(name, commit);
  if (check == store::ManifestCheck::matches) return "verified";
  if (check == store::ManifestCheck::changed) return "corrupt";
  return "partial";
}

// Walks the store: every model on disk. Blocks (readdir, a stat per file).
std::map<std::string, DiskModel> models_on_disk(const store::Store& st) {
  std::map<std::string, DiskModel> out;
  for (const auto& s : st.list()) {
    DiskModel m;
    m.size_bytes = s.size_bytes;
    m.commit = s.linked_commit;
    if (!m.commit && !s.commits.empty()) m.commit = s.commits.back();
    for (const auto& c : s.commits) m.revisions.emplace_back(c, revision_state(st, s.name, c));
    if (m.commit) {
      auto known = std::find_if(m.revisions.begin(), m.revisions.end(), [&](const auto& r) { return r.first == *m.commit; });
      m.state = known != m.revisions.end() ? known->second : revision_state(st, s.name, *m.commit);
    }
    out[s.name] = std::move(m);
  }
  return out;
}

}  // namespace

struct Deployer::DiskModels {
  std::map<std::string, DiskModel> by_name;
};

asio::awaitable<Result<std::shared_ptr<const Deployer::DiskModels>>> Deployer::walk_store() {
  const auto& st = services_.store;
  auto settled = co_await util::on_pool<std::optional<DiskModels>>(status_pool_, [&st]() -> std::optional<DiskModels> {
    DiskModels d;
    if (st.read_if_settled([&] { d.by_name = models_on_disk(st); })) return d;
    return std::nullopt;
  });
  if (settled) {
    last_walk_ = std::make_shared<const DiskModels>(std::move(*settled));
    co_return last_walk_;
  }
  // modeld links or deletes files now (on the disk pool, perhaps for long): the last walk's list.
  if (last_walk_) co_return last_walk_;
  auto now = co_await util::on_pool<DiskModels>(status_pool_, [&st] { return DiskModels{models_on_disk(st)}; });
  co_return std::make_shared<const DiskModels>(std::move(now));
}

asio::awaitable<std::vector<ModelInfo>> Deployer::models() {
  auto disk = co_await walks_.run("store", [this] { return walk_store(); });
  static const DiskModels none;
  co_return model_list(disk ? **disk : none);
}

std::vector<ModelInfo> Deployer::model_list(const DiskModels& disk) const {
  std::vector<ModelInfo> out;
  for (const auto& [name, m] : services_.config->models) {
    ModelInfo i;
    i.name = name;
    i.repo = m.repo;
    i.revision = m.revision;
    i.pinned = m.pinned;
    i.active = state_.active.find(name) != nullptr;
    if (auto la = state_.last_active.find(name); la != state_.last_active.end()) i.last_active = la->second;
    i.state = "absent";
    if (auto s = disk.by_name.find(name); s != disk.by_name.end()) {
      i.size_bytes = s->second.size_bytes;
      i.commit = s->second.commit;
      i.state = s->second.state;
      i.revisions = revisions_of(name, s->second.revisions);
    }
    out.push_back(std::move(i));
  }
  return out;
}

std::vector<RevisionInfo> Deployer::revisions_of(const std::string& model,
                                                const std::vector<std::pair<std::string, std::string>>& on_disk) const {
  std::vector<RevisionInfo> out;
  for (const auto& [commit, state] : on_disk) {
    RevisionInfo r{commit, state};
    r.pulled = is_pulled(state_.pulled, model, commit);
    r.in_service = in_service(model, commit);
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<Error> Deployer::disk_conflict(const std::string& model, std::string_view action) const {
  if (auto r = refuse_while_recovering()) return r;
  if (auto b = busy_.find(model); b != busy_.end())
    return make_error(Errc::deployment_running, fmt::format("a {} of model {} is in progress", b->second, model));
  if (action == "rm" && state_.active.find(model))
    return make_error(Errc::model_active,
                      fmt::format("model {} is active (served by {}); deploy another model before removing it", model,
                                  units::serve_unit(model)));
  if (running_) {
    const auto& d = running_->record();
    // Verifying reads every file while a deployment may link, download or evict; rm only
    // conflicts with the deployment's own target and the model it replaces.
    if (action == "verify" || running_->touched_models().contains(model))
    {
      // "rm --commit" is written "rm NAME --commit ...": the model right after the command.
      const auto space = action.find(' ');
      const auto command = space == std::string_view::npos
                               ? fmt::format("{} {}", action, model)
                               : fmt::format("{} {}{} ...", action.substr(0, space), model, action.substr(space));
      return make_error(Errc::deployment_running,
                        fmt::format("{} {} of {} is running (phase {}); {} when it has ended", noun_of(d.kind), d.id,
                                    d.model, to_string(d.phase), command));
    }
  }
  if (shutting_down_) return make_error(Errc::cancelled, "modeld is shutting down");
  return std::nullopt;
}

namespace {

// Holds a model in Deployer::busy_ for the lifetime of one verify or rm.
struct BusyGuard {
  std::map<std::string, std::string>& busy;
  std::string model;
  BusyGuard(std::map<std::string, std::string>& b, std::string m, std::string what) : busy(b), model(std::move(m)) {
    busy[model] = std::move(what);
  }
  ~BusyGuard() { busy.erase(model); }
};

}  // namespace

asio::awaitable<Result<PlanReport>> Deployer::plan(std::string model, bool allow_downtime,
                                                   std::optional<std::string> commit) {
  // The configuration and the state may change while the Hub answers; the plan keeps its copies.
  auto cfg = services_.config;
  const auto* m = cfg->find_model(model);
  if (!m) co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured", model));
  // Concurrent plans of one model under one configuration share one dry run (one listing, one
  // filtered copy of it). The key holds the configuration's address, alive while its flight runs.
  const std::string key = fmt::format("{}\n{}\n{}\n{}", model, allow_downtime, commit.value_or(""),
                                      static_cast<const void*>(cfg.get()));
  ++plans_waiting_;
  auto report = co_await plans_.run(key, [&] { return plan_now(*m, allow_downtime, commit); });
  // The listing's records and the plans' copies of them are freed by now: give the pages back
  // (on the event loop: a few ms), once, when the last plan of a burst has its answer.
  if (--plans_waiting_ == 0) util::release_free_memory();
  co_return report;
}

asio::awaitable<Result<PlanReport>> Deployer::plan_now(const config::ModelConfig& m, bool allow_downtime,
                                                       std::optional<std::string> commit) {
  std::optional<std::string> active;
  if (const auto* last = state_.active.last()) active = last->model;
  const auto stopped = conflicting(state_.active.services, placement_of(m), *services_.config);
  const Serving serving{models_of(state_.active.services), models_of(stopped)};
  const auto last_active = state_.last_active;
  const auto pulled = state_.pulled;
  const std::string revision = commit.value_or(m.revision);
  auto report = co_await dry_run_plan(services_, m, revision, allow_downtime, serving, active, last_active, pulled);
  if (!report) co_return report;
  // What a deployment of the planned commit would decide after its planning.
  Deployment d;
  d.model = m.name;
  d.commit = report->commit;
  const Run run{.record = d, .model = m};
  report->already_serving = !(co_await why_not_noop(d, run));
  std::vector<Placement> stops;
  for (const auto& a : stopped) stops.push_back(placement_of(a, services_.config->find_model(a.model)));
  report->preflight = co_await run_preflight(services_, m, stops);
  co_return report;
}

asio::awaitable<std::optional<Error>> Deployer::unknown_model(const std::string& model) {
  if (services_.config->find_model(model)) co_return std::nullopt;
  // Two lstat calls (blocking: on the disk pool).
  auto& st = services_.store;
  const bool there = co_await util::on_pool<bool>(services_.disk_pool, [&] { return on_disk(st, model); });
  if (there) co_return std::nullopt;
  co_return make_error(Errc::unknown_model, fmt::format("no model named '{}' is configured or on disk", model));
}

asio::awaitable<Result<VerifyReport>> Deployer::verify(std::string model) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (auto c = disk_conflict(model, "verify")) co_return *c;
  BusyGuard guard(busy_, model, "verify");
  sys::Fields f;
  f.model = model;
  sys::logf(sys::Level::info, f, "verifying model {} on disk", model);
  auto r = co_await verify_on_disk(services_, model);
  if (!r) co_return r.error();
  f.extra.emplace_back("MODELD_COMMIT", r->commit);
  if (r->ok()) {
    sys::logf(sys::Level::notice, f, "model {} at {} verified: {} files, {}, no problems", model,
              r->commit.substr(0, 12), r->files, util::format_bytes(r->bytes));
    rewatch_verified(model, r->commit, f);
  } else {
    for (const auto& p : r->problems) {
      sys::Fields pf = f;
      pf.extra.emplace_back("MODELD_FILE", p.file);
      if (!p.tensor.empty()) pf.extra.emplace_back("MODELD_TENSOR", p.tensor);
      sys::log(sys::Level::error, pf, p.message);
    }
    sys::logf(sys::Level::error, f, "model {} at {}: {} problem{} found", model, r->commit.substr(0, 12),
              r->problems.size(), r->problems.size() == 1 ? "" : "s");
  }
  co_return r;
}

void Deployer::rewatch_verified(const std::string& model, const std::string& commit, const sys::Fields& f) {
  if (!in_service(model, commit) || watcher_for(model).running()) return;
  // The watchdog stops for good when it finds the files changed; now they hash clean again, it
  // watches (and restarts a server that is down) once more.
  sys::logf(sys::Level::notice, f, "model {} is active and its files are intact: the watchdog watches it again", model);
  watch_service(model, false);
}

asio::awaitable<std::optional<Error>> Deployer::unit_runs(const std::string& model, bool whole_model) {
  const auto unit = units::serve_unit(model);
  auto st = co_await services_.units.status(unit);
  if (!st)
    co_return make_error(st.error().code,
                         fmt::format("cannot tell whether {} runs ({}): not removing model {}", unit,
                                     st.error().message, model));
  if (!units::is_up(st->active_state)) co_return std::nullopt;
  // A service in state serves its recorded revision: the others may go (rm --commit).
  if (!whole_model && state_.active.find(model)) co_return std::nullopt;
  co_return make_error(Errc::model_active,
                       fmt::format("{} is {} (systemd), though modeld has no service of model {} in its state: what it "
                                   "serves is unknown, so no revision of {} is removed; stop it first (systemctl stop "
                                   "{}), or deploy {} to put it under modeld",
                                   unit, units::to_string(st->active_state), model, model, unit, model));
}

asio::awaitable<Result<Removal>> Deployer::remove(std::string model) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (auto c = disk_conflict(model, "rm")) co_return *c;
  BusyGuard guard(busy_, model, "rm");
  if (auto e = co_await unit_runs(model, true)) co_return *e;
  auto r = co_await remove_from_disk(services_, model);
  if (!r) co_return r.error();
  sys::Fields f;
  f.model = model;
  sys::logf(sys::Level::notice, f, "removed model {} ({} revision{}, {} freed)", model, r->commits.size(),
            r->commits.size() == 1 ? "" : "s", util::format_bytes(r->bytes_freed));
  if (forget_pulled(state_.pulled, model, std::nullopt)) co_await save_state(f);
  co_return r;
}

asio::awaitable<Result<Removal>> Deployer::remove_revision(std::string model, std::string commit) {
  if (auto unknown = co_await unknown_model(model)) co_return *unknown;
  if (in_service(model, commit))
    co_return make_error(Errc::model_active,
                         fmt::format("revision {} of model {} is in service (served by {}); deploy another revision "
                                     "or model before removing it",
                                     commit, model, units::serve_unit(model)));
  if (auto c = disk_conflict(model, "rm --commit")) co_return *c;
  BusyGuard guard(busy_, model, "rm");
  if (auto e = co_await unit_runs(model, false)) co_return *e;
  auto r = co_await remove_revision_from_disk(services_, model, commit);
  if (!r) co_return r.error();
  sys::Fields f;
  f.model = model;
  f.extra.emplace_back("MODELD_COMMIT", commit);
  sys::logf(sys::Level::notice, f, "removed revision {} of model {} ({} freed)", commit, model,
            util::format_bytes(r->bytes_freed));
  if (forget_pulled(state_.pulled, model, commit)) co_await save_state(f);
  co_return r;
}

}  // namespace modeld::deploy
