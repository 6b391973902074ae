// launching: switch the model's folder to the new revision, write its drop-in, start its unit.
#include "deploy/launch.hpp"
#include "deploy/warm.hpp"

#include "deploy/gpu_watch.hpp"
#include "engine/engine.hpp"
#include "gpu/nvml.hpp"
#include "store/store.hpp"
#include "units/service_manager.hpp"
#include "util/on_pool.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace modeld::deploy {

namespace {

// Quotes one word for an ExecStart= or Environment= line (systemd.syntax(7), systemd.service(5)):
// double quotes with backslash escapes; '%' doubled so specifiers do not expand; in ExecStart=
// (`in_exec`) '$' doubled so environment variables do not expand. Environment= values get no
// variable expansion, so a '$' there is written as it is.
std::string quote(std::string_view word, bool in_exec = true) {
  std::string out = "\"";
  for (char c : word) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '%': out += "%%"; break;
      case '$': out += in_exec ? "$$" : "$"; break;
      default: out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string seconds(std::chrono::milliseconds d) {
  return fmt::format("{}s", std::max<long long>(1, std::chrono::duration_cast<std::chrono::seconds>(d).count()));
}

// The command with the engine's drain flag added when serve.drain_timeout is set and the command
// does not set the flag itself (vLLM's --shutdown-timeout: lib/engine/vllm.cpp cites it; config
// warns where a written one is not drain_timeout). Without a drain the command is as configured.
std::vector<std::string> with_drain_flag(const config::ServeConfig& serve, std::vector<std::string> argv) {
  const engine::Adapter* adapter = engine::find(serve.engine);
  if (serve.drain_timeout.count() == 0 || adapter == nullptr || adapter->drain_flag.empty()) return argv;
  if (engine::flag_value(argv, adapter->drain_flag)) return argv;
  argv.emplace_back(adapter->drain_flag);
  argv.push_back(std::to_string(std::chrono::ceil<std::chrono::seconds>(serve.drain_timeout).count()));
  return argv;
}

}  // namespace

StartedSettings started_settings(const config::ModelConfig& model, const std::filesystem::path& model_dir) {
  return StartedSettings{with_drain_flag(model.serve, config::expand_command(model, model_dir)),
                         model.serve.environment,
                         model_dir.string(),
                         model.serve.gpus,
                         model.serve.port,
                         model.serve.gpu_ids};
}

std::string render_dropin(const config::ModelConfig& model, const std::filesystem::path& model_dir,
                          const std::vector<std::string>& gpu_uuids) {
  return render_dropin(model, started_settings(model, model_dir), gpu_uuids);
}

std::string render_dropin(const config::ModelConfig& model, const StartedSettings& started,
                          const std::vector<std::string>& gpu_uuids) {
  std::string out = fmt::format(
      "# Written by modeld for model {} from {}; rewritten at every daemon start. Do not edit:\n"
      "# put your own settings in another drop-in of this folder.\n"
      "[Unit]\nDescription=modeld model service {} ({})\n\n[Service]\n",
      model.name, model.source_file.string(), model.name, model.repo);
  const auto& argv = started.command;
  out += "ExecStart=\nExecStart=";
  for (std::size_t i = 0; i < argv.size(); ++i) out += (i ? " " : "") + quote(argv[i]);
  out += "\n";
  // WorkingDirectory= takes the rest of the line as the path and no quotes (a quoted value makes
  // systemd 252 drop the settings after it); only specifiers need escaping.
  std::string dir;
  for (char c : started.working_directory) dir += c == '%' ? std::string("%%") : std::string(1, c);
  out += fmt::format("WorkingDirectory={}\n", dir);
  // By UUID, as NVML names the GPUs of serve.gpu_ids: CUDA's own numbering is not NVML's. The
  // order is written first so a configured one wins; the devices last, so nothing overrides them.
  if (started.gpu_ids) out += "Environment=" + quote("CUDA_DEVICE_ORDER=PCI_BUS_ID", false) + "\n";
  for (const auto& [k, v] : started.environment) out += "Environment=" + quote(k + "=" + v, false) + "\n";
  if (started.gpu_ids)
    out += "Environment=" + quote(fmt::format("CUDA_VISIBLE_DEVICES={}", fmt::join(gpu_uuids, ",")), false) + "\n";
  // modeld enforces startup_timeout itself (it can be hours), so systemd must not give up first.
  out += "TimeoutStartSec=infinity\n";
  // With a drain the main process alone gets SIGTERM and drain_timeout + stop_timeout to exit; the
  // rest of the control group gets SIGKILL once it has (systemd.kill(5) KillMode=mixed). Without
  // one the template's KillMode=control-group stands and the drop-in is what it always was.
  if (model.serve.drain_timeout.count() > 0) out += "KillMode=mixed\n";
  out += fmt::format("TimeoutStopSec={}\n", seconds(config::stop_budget(model.serve)));
  return out;
}

StartedSettings started_settings(Services& s, const config::ModelConfig& model) {
  return started_settings(model, s.store.model_path(model.name));
}

boost::asio::awaitable<Result<StartedSettings>> install_dropin(Services& s, const config::ModelConfig& model,
                                                               const std::optional<StartedSettings>& started) {
  const auto unit = units::serve_unit(model.name);
  const StartedSettings settings = started.value_or(started_settings(s, model));
  std::vector<std::string> uuids;
  if (settings.gpu_ids) {
    auto found = co_await gpu_uuids(s, *settings.gpu_ids);
    if (!found)
      co_return make_error(found.error().code,
                           fmt::format("model {} (serve.gpu_ids = [{}]): {}; not writing the drop-in of {}", model.name,
                                       gpu::describe_indices(settings.gpu_ids), found.error().message, unit));
    uuids = std::move(*found);
  }
  // On the event loop: the process backend keeps its drop-ins in memory, owned by the loop; the
  // systemd backend writes one small file (a few ms, fsync included).
  if (auto r = s.units.write_dropin(unit, "10-modeld.conf", render_dropin(model, settings, uuids)); !r)
    co_return r.error();
  if (auto r = co_await s.units.reload(); !r) co_return r.error();
  co_return settings;
}

boost::asio::awaitable<Result<void>> check_still_verified(Services& s, const Run& run, std::string_view refusing) {
  const auto& commit = *run.record.commit;
  const bool same = co_await util::on_pool<bool>(
      s.disk_pool, [&] { return s.store.manifest_still_matches_settled(run.model.name, commit); });
  if (!same)
    co_return make_error(Errc::checkpoint_incomplete,
                         fmt::format("files of {} at {} changed after their verification; {}", run.model.name,
                                     commit.substr(0, 12), refusing));
  co_return Result<void>{};
}

boost::asio::awaitable<Result<Launched>> run_launching(Services& s, const Run& run) {
  const auto unit = units::serve_unit(run.model.name);
  const auto& commit = *run.record.commit;
  // Stopping the old model may have taken minutes: a stat per file proves that nothing touched
  // the verified files meanwhile.
  if (auto r = co_await check_still_verified(s, run, "not launching"); !r) co_return r.error();
  if (auto r = co_await check_gpus_for_launch(s, run); !r) co_return r.error();
  // A folder the files were adopted from is kept, out of the link's way: it may hold more than
  // the checkpoint, and modeld deletes nothing it did not write.
  // Renames and the link's switch (blocking: on the disk pool).
  auto aside = co_await util::on_pool<Result<std::optional<std::filesystem::path>>>(
      s.disk_pool, [&] { return s.store.set_aside_foreign(run.model.name); });
  if (!aside) co_return aside.error();
  if (*aside)
    sys::logf(sys::Level::notice, run.fields(),
              "moved {} (a folder made outside modeld) to {}; its adopted files are hard links of the files "
              "that serve now: do not edit them there (it would change the model in service), delete the folder "
              "when it is no longer needed",
              s.store.model_path(run.model.name).string(), (*aside)->string());
  auto switched = co_await util::on_pool<Result<void>>(s.disk_pool, [&] { return s.store.switch_link(run.model.name, commit); });
  if (!switched) co_return switched.error();
  if (auto r = co_await install_dropin(s, run.model); !r) co_return r.error();
  sys::logf(sys::Level::info, run.fields(), "starting {} on port {} with {} -> {}", unit, run.model.serve.port,
            s.store.model_path(run.model.name).string(), commit.substr(0, 12));
  Launched launched;
  launched.bytes_resident_at_launch = co_await resident_at_launch(s, run);
  // A unit left failed by an earlier attempt would refuse to start again.
  launched.start_requested_ns = wall_clock_ns();
  if (auto r = co_await units::reset_failed_and_start(s.units, unit); !r) co_return r.error();
  co_return launched;
}

}  // namespace modeld::deploy
