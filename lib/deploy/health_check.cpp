// health_checking and benchmarking: readiness of the new server, then an optional measurement.
#include "deploy/health_check.hpp"
#include "deploy/launch.hpp"

#include "deploy/preflight.hpp"
#include "health/health.hpp"
#include "units/service_manager.hpp"
#include "util/files.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace modeld::deploy {

Result<void> read_api_key(const config::ModelConfig& model, std::optional<std::string>& key) {
  key.reset();
  if (model.health.api_key_file.empty()) return {};
  auto k = util::read_secret_file(model.health.api_key_file);
  if (!k) return make_error(Errc::io_error, "cannot read api_key_file of model " + model.name + ": " + k.error().message);
  key = std::move(*k);
  return {};
}

Result<health::Target> target_of(const config::ModelConfig& m) {
  health::Target t;
  t.port = m.serve.port;
  t.health_path = m.health.path;
  t.models_path = m.health.models_path;
  t.served_name = m.serve.served_name;
  t.completion = m.health.completion;
  if (auto r = read_api_key(m, t.api_key); !r) return r.error();
  return t;
}

namespace {
// The longest gap between two "loading" lines in modeld's journal while a server loads.
constexpr std::chrono::milliseconds kProgressEvery = std::chrono::seconds(30);

// wait_model_ready with the real probes.
boost::asio::awaitable<Result<Readiness>> probe_until_ready(Services& s, const config::ModelConfig& m,
                                                       const sys::Fields& fields) {
  auto target = target_of(m);
  if (!target) co_return target.error();
  const auto unit = units::serve_unit(m.name);
  sys::logf(sys::Level::info, fields, "waiting up to {} for {} to be ready on port {} (hung after {} without output)",
            util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(m.serve.startup_timeout)), unit,
            m.serve.port, util::format_duration(std::chrono::duration_cast<std::chrono::seconds>(m.health.stall_timeout)));
  const auto t0 = std::chrono::steady_clock::now();
  health::ReadyOptions options;
  options.timeout = m.serve.startup_timeout;
  options.stall_timeout = m.health.stall_timeout;
  // Progress at most every 30 s, and at least twice within stall_timeout, so an operator sees
  // what the server said before it could be called hung.
  options.progress_every =
      m.health.stall_timeout.count() > 0
          ? std::max<std::chrono::milliseconds>(std::chrono::seconds(1),
                                                std::min<std::chrono::milliseconds>(kProgressEvery, m.health.stall_timeout / 2))
          : kProgressEvery;
  // The unit's own journal lines of its current run; the time bound only matters when systemd
  // reports no invocation ID, and reaches back over the launch just before. The backend says
  // where they are: by unit (systemd), by identifier (the process backend), or nowhere (no
  // journald: nothing to read, so no stall detection either).
  auto journal = s.units.journal_of(unit);
  if (journal.readable)
    options.output = health::journal_output(s.disk_pool, unit,
                                            std::chrono::system_clock::now() - std::chrono::seconds(5), 10, {},
                                            std::move(journal.identifier));
  Readiness marks;
  options.on_step = [&](health::Step step, const std::string& detail) {
    if (step == health::Step::port) marks.port_ns = wall_clock_ns();
    if (step == health::Step::ready) marks.ready_ns = wall_clock_ns();
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0);
    sys::Fields f = fields;
    f.extra.emplace_back("MODELD_READINESS_STEP", std::string(health::step_name(step)));
    sys::logf(sys::Level::info, f, "{} ({} after the start)", detail.empty() ? std::string(health::step_name(step)) : detail,
              util::format_duration(secs));
  };
  options.on_progress = [&](const health::Progress& p) {
    sys::Fields f = fields;
    f.extra.emplace_back("MODELD_READINESS_STEP", "loading");
    auto silent = std::chrono::duration_cast<std::chrono::seconds>(p.silent).count();
    sys::logf(sys::Level::info, f, "loading: {} s, last server line: '{}'{}; not ready yet: {}",
              std::chrono::duration_cast<std::chrono::seconds>(p.waited).count(), p.last_line,
              silent >= 2 ? fmt::format(" (nothing new for {} s)", silent) : std::string(), p.last_answer);
  };
  const StartedSettings started = started_settings(s, m);
  options.explain_exit = [&](const units::UnitStatus& st) {
    return explain_exit(m, started, st, s.config->daemon.service_manager);
  };
  options.on_output_unreadable = [&](const std::string& why) {
    sys::logf(sys::Level::warning, fields, "{}; treating {} as loading while it is alive, ignoring", why, unit);
  };
  auto ready = co_await health::wait_ready(s.local_client, s.units, unit, *target, options);
  if (ready) {
    if (!marks.ready_ns) marks.ready_ns = wall_clock_ns();
    co_return marks;
  }
  if (options.output) co_return ready.error();
  Error e = ready.error();
  e.message += "; its output went to modeld's own standard output (no journald on this host)";
  co_return e;
}

}  // namespace

boost::asio::awaitable<Result<Readiness>> wait_model_ready(Services& s, const config::ModelConfig& m,
                                                           const sys::Fields& fields) {
  if (!s.wait_ready) co_return co_await probe_until_ready(s, m, fields);
  if (auto r = co_await s.wait_ready(m, fields); !r) co_return r.error();
  const auto now = wall_clock_ns();
  co_return Readiness{now, now};
}

boost::asio::awaitable<Result<Readiness>> run_health_checking(Services& s, const Run& run) {
  co_return co_await wait_model_ready(s, run.model, run.fields());
}

boost::asio::awaitable<Result<Benchmarked>> run_benchmarking(Services& s, const Run& run) {
  if (!run.model.benchmark.enabled) {
    sys::logf(sys::Level::info, run.fields(), "benchmark disabled for model {}", run.model.name);
    co_return Benchmarked{};
  }
  auto target = target_of(run.model);
  if (!target) co_return target.error();
  auto r = co_await health::benchmark(s.local_client, *target, run.model.benchmark.prompt, run.model.benchmark.max_tokens);
  if (!r) {
    // A failed measurement does not make a ready server unfit to serve.
    sys::logf(sys::Level::warning, run.fields(), "benchmark failed: {}, ignoring", r.error().message);
    co_return Benchmarked{};
  }
  sys::logf(sys::Level::info, run.fields(), "benchmark: first token after {:.3f} s, {:.1f} tokens/s", r->ttft_s,
            r->decode_tokens_per_s);
  co_return Benchmarked{r->ttft_s, r->decode_tokens_per_s};
}

}  // namespace modeld::deploy
