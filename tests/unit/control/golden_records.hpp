#pragma once
// Fixed records for the golden tests (tests/fixtures/golden/README.md): deployments of every
// kind and terminal state, services, watchdogs, models, plans, verify reports and removals whose
// every field, times included, is set here, so the JSON and text made from them never vary.

#include "deploy/control.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace modeld::control::golden {

// Commits of the three models: alpha serves A1 (A0 before it), beta serves B0 and pulled B1,
// gamma has G1 partly on disk.
inline const std::string kA0 = std::string(20, 'a') + std::string(20, '0');
inline const std::string kA1 = std::string(20, 'a') + std::string(20, '1');
inline const std::string kB0 = std::string(20, 'b') + std::string(20, '0');
inline const std::string kB1 = std::string(20, 'b') + std::string(20, '1');
inline const std::string kG1 = std::string(20, 'c') + std::string(20, '1');

// 2026-03-01T10:00:00Z in ns since the epoch.
inline constexpr std::int64_t kTenOClockNs = 1772359200LL * 1000000000LL;

// What the service of `model` was started with: on `port`, GPUs `first`..`first`+3.
inline deploy::StartedSettings started(const std::string& model, std::uint16_t port, unsigned first) {
  deploy::StartedSettings s;
  s.command = {"/usr/bin/vllm", "serve", "/srv/models/" + model, "--port", std::to_string(port)};
  s.environment = {{"NCCL_DEBUG", "WARN"}};
  s.working_directory = "/srv/models/" + model;
  s.gpus = 4;
  s.port = port;
  s.gpu_ids = std::vector<unsigned>{first, first + 1, first + 2, first + 3};
  return s;
}

// A record with the given identity, kind, end and times; every other field at its default.
inline deploy::Deployment record(const std::string& id, const std::string& model, deploy::Kind kind,
                                 deploy::State state, deploy::Phase phase, const std::string& started_at,
                                 const std::string& finished_at) {
  deploy::Deployment d;
  d.id = id;
  d.kind = kind;
  d.model = model;
  d.state = state;
  d.phase = phase;
  d.started_at = started_at;
  if (!finished_at.empty()) d.finished_at = finished_at;
  return d;
}

// deploy of alpha A0 -> A1, succeeded: warm, switch (from its marks) and benchmark.
inline deploy::Deployment alpha_succeeded() {
  auto d = record("20260301T100000Z-alpha", "alpha", deploy::Kind::deploy, deploy::State::succeeded,
                  deploy::Phase::benchmarking, "2026-03-01T10:00:00Z", "2026-03-01T10:07:31Z");
  d.commit = kA1;
  d.allow_downtime = true;
  d.progress = {8000000000, 8000000000, 8, 8, 0, std::nullopt, {}};
  d.benchmark_ttft_s = 0.125;
  d.benchmark_decode_tokens_per_s = 61.5;
  d.warm = deploy::WarmReport{8000000000, 2000000000, 6000000000, 7999999488};
  d.previous = {deploy::ActiveRecord{"alpha", kA0, "2026-02-20T08:00:00Z", started("alpha", 8000, 0)}};
  d.old_stopped = true;
  d.cleanup_begun = true;
  d.started_ns = kTenOClockNs + 250000000;
  d.switch_marks = {kTenOClockNs + 300000000000, kTenOClockNs + 304000000000, kTenOClockNs + 305250000000,
                    kTenOClockNs + 425750000000, kTenOClockNs + 430875000000};
  d.switch_report = deploy::switch_report_of(d.switch_marks);
  return d;
}

// pull of beta B1, succeeded (downloaded and verified, no service touched).
inline deploy::Deployment beta_pulled() {
  auto d = record("20260301T110000Z-beta", "beta", deploy::Kind::pull, deploy::State::succeeded,
                  deploy::Phase::verifying, "2026-03-01T11:00:00Z", "2026-03-01T11:20:00Z");
  d.commit = kB1;
  d.progress = {3000000000, 3000000000, 4, 4, 0, std::nullopt, {}};
  d.started_ns = kTenOClockNs + 3600000000000LL;
  return d;
}

// deploy of gamma, failed in downloading: the Hub's error, a message with a quote, a tab and é.
inline deploy::Deployment gamma_failed() {
  auto d = record("20260301T120000Z-gamma", "gamma", deploy::Kind::deploy, deploy::State::failed,
                  deploy::Phase::downloading, "2026-03-01T12:00:00Z", "2026-03-01T12:03:20Z");
  d.commit = kG1;
  d.progress = {1234567890, 5000000000, 2, 6, 0, std::nullopt, {}};
  d.error = make_error(Errc::hub_unavailable,
                       "GET org/gamma \"model-00003.safetensors\": 503 after 4 tries\t(caf\xc3\xa9 CDN)");
  d.started_ns = kTenOClockNs + 7200000000000LL;
  return d;
}

// deploy of alpha A1 -> A0, rolled back after health_checking failed: warm measured at launch.
inline deploy::Deployment alpha_rolled_back() {
  auto d = record("20260301T130000Z-alpha", "alpha", deploy::Kind::deploy, deploy::State::rolled_back,
                  deploy::Phase::rolling_back, "2026-03-01T13:00:00Z", "2026-03-01T13:09:05Z");
  d.commit = kA0;
  d.progress = {0, 8000000000, 8, 8, 0, std::nullopt, {}};
  d.warm = deploy::WarmReport{8000000000, 8000000000, 0, 8000000000};
  d.error = make_error(Errc::health_failed, "the new model never answered /health within 600 s");
  d.previous = {deploy::ActiveRecord{"alpha", kA1, "2026-03-01T10:07:10Z", started("alpha", 8000, 0)}};
  d.old_stopped = true;
  d.restart = true;
  d.started_ns = kTenOClockNs + 10800000000000LL;
  d.switch_marks = {kTenOClockNs + 10801000000000LL, kTenOClockNs + 10803500000000LL,
                    kTenOClockNs + 10804000000000LL, 0, 0};
  return d;
}

// stop of gamma, succeeded (its service stopped, files kept).
inline deploy::Deployment gamma_stopped() {
  auto d = record("20260301T140000Z-gamma", "gamma", deploy::Kind::stop, deploy::State::succeeded,
                  deploy::Phase::stopping_old, "2026-03-01T14:00:00Z", "2026-03-01T14:00:06Z");
  d.commit = kG1;
  d.previous = {deploy::ActiveRecord{"gamma", kG1, "2026-03-01T13:30:00Z", std::nullopt}};
  d.old_stopped = true;
  d.started_ns = kTenOClockNs + 14400000000000LL;
  return d;
}

// deploy of beta, cancelled while warming.
inline deploy::Deployment beta_cancelled() {
  auto d = record("20260301T090000Z-beta", "beta", deploy::Kind::deploy, deploy::State::cancelled,
                  deploy::Phase::warming, "2026-03-01T09:00:00Z", "2026-03-01T09:02:00Z");
  d.commit = kB0;
  d.warm = deploy::WarmReport{3000000000, 1000000000, 500000000, std::nullopt};
  d.error = make_error(Errc::cancelled, "cancelled by request");
  d.cancel_requested = true;
  return d;
}

// deploy of alpha that found it already serving: succeeded, changed false.
inline deploy::Deployment alpha_noop() {
  auto d = record("20260301T080000Z-alpha", "alpha", deploy::Kind::deploy, deploy::State::succeeded,
                  deploy::Phase::planning, "2026-03-01T08:00:00Z", "2026-03-01T08:00:01Z");
  d.commit = kA0;
  d.changed = false;
  return d;
}

// deploy of gamma, running: downloading, two files in flight (one without an ETA yet).
inline deploy::Deployment gamma_running() {
  auto d = record("20260301T150000Z-gamma", "gamma", deploy::Kind::deploy, deploy::State::running,
                  deploy::Phase::downloading, "2026-03-01T15:00:00Z", "");
  d.commit = kG1;
  d.progress.bytes_done = 1500000000;
  d.progress.bytes_total = 5000000000;
  d.progress.files_done = 3;
  d.progress.files_total = 6;
  d.progress.rate_bytes_per_s = 125000000.25;
  d.progress.eta_s = 28.0;
  d.progress.files = {{"model-00004-of-00006.safetensors", 300000000, 900000000, 75000000.5, 8.0, 4},
                      {"model-00005-of-00006.safetensors", 1000, 900000000, 0, std::nullopt, 1}};
  return d;
}

// The history of the rich deploy::Control, newest first: one running, then every kind and end.
inline std::vector<deploy::Deployment> history() {
  return {gamma_running(), gamma_stopped(), alpha_rolled_back(), gamma_failed(),
          beta_pulled(),   alpha_succeeded(), beta_cancelled(),  alpha_noop()};
}

// The watchdog of `model`: alpha restarted and backing off, beta watching.
inline deploy::WatchdogStatus watchdog(const std::string& model) {
  deploy::WatchdogStatus w;
  w.model = model;
  w.unit = "modeld-serve@" + model + ".service";
  w.last_probe_at = "2026-03-01T15:01:00Z";
  if (model == "alpha") {
    w.state = "backoff";
    w.consecutive_failures = 2;
    w.restarts = 3;
    w.probe_failures = 7;
    w.last_restart_at = "2026-03-01T14:50:00Z";
    w.last_restart_reason = "modeld-serve@alpha.service left the active state: it is failed (exit-code 1)";
    w.last_probe_ok = false;
    w.last_probe_seconds = 0.25;
  } else {
    w.state = "watching";
    w.probe_failures = 1;
    w.last_probe_ok = true;
    w.last_probe_seconds = 0.0625;
  }
  return w;
}

// Services in service, in the order put into service: beta, then alpha (the active one).
inline std::vector<deploy::ServiceInfo> services() {
  return {{"beta", kB0, "modeld-serve@beta.service", 8001, std::vector<unsigned>{4, 5, 6, 7},
           "2026-02-25T12:00:00Z", watchdog("beta")},
          {"alpha", kA1, "modeld-serve@alpha.service", 8000, std::vector<unsigned>{0, 1, 2, 3},
           "2026-03-01T10:07:10Z", watchdog("alpha")}};
}

inline deploy::Active active() {
  return {"alpha", kA1, "modeld-serve@alpha.service", 8000, "2026-03-01T10:07:10Z"};
}

// GET /v1/models: alpha verified and serving, beta with a pulled revision, gamma partial and pinned.
inline std::vector<deploy::ModelInfo> models() {
  deploy::ModelInfo alpha{"alpha", "org/alpha", "main", kA1, "verified", 8000000000, true, false,
                          "2026-03-01T15:00:00Z", {{kA0, "verified", false, false}, {kA1, "verified", false, true}}};
  deploy::ModelInfo beta{"beta", "org/beta", "v2", kB0, "verified", 6000000000, false, false,
                         "2026-03-01T15:00:00Z", {{kB0, "verified", false, true}, {kB1, "verified", true, false}}};
  deploy::ModelInfo gamma{"gamma", "org/gamma", "main", std::nullopt, "partial", 1234567890, false, true,
                          std::nullopt, {{kG1, "partial", false, false}}};
  deploy::ModelInfo delta{"delta", "org/delta", "main", std::nullopt, "absent", 0, false, false, std::nullopt, {}};
  return {alpha, beta, gamma, delta};
}

// A plan of gamma that fits by evicting beta's old revision, a pre-flight check failing.
inline deploy::PlanReport plan_fits() {
  deploy::PlanReport p;
  p.model = "gamma";
  p.repo = "org/gamma";
  p.revision = "main";
  p.commit = kG1;
  p.files_total = 6;
  p.bytes_total = 5000000000;
  p.files_to_fetch = 4;
  p.bytes_to_fetch = 3765432110;
  p.bytes_local = 1234567890;
  p.bytes_linkable = 34567890;
  p.bytes_partial = 200000000;
  p.adopt_from = "/srv/models/gamma";
  p.files_adoptable = 1;
  p.bytes_adoptable = 1000000000;
  p.bytes_needed = 3565432110;
  p.bytes_free = 3000000000;
  p.disk_reserve = 100000000;
  p.evictions = {{"delta", 900000000, std::string("2026-01-01T00:00:00Z"), false},
                 {"epsilon", 500000000, std::nullopt, false}};
  p.fits = true;
  p.active_model = "alpha";
  p.stops = {"alpha"};
  p.preflight = {{"command", true, "/usr/bin/vllm is an executable file"},
                 {"gpus", true, "GPUs 0-3 are free"},
                 {"port", false, "port 8000 (models.gamma.serve.port, /etc/modeld/models.d/gamma.toml) is in use by pid 4242 (nginx)"}};
  return p;
}

// A plan of beta that does not fit without downtime (it would evict alpha, in service): no rollback.
inline deploy::PlanReport plan_short() {
  deploy::PlanReport p;
  p.model = "beta";
  p.repo = "org/beta";
  p.revision = "v2";
  p.commit = kB1;
  p.files_total = 4;
  p.bytes_total = 3000000000;
  p.files_to_fetch = 4;
  p.bytes_to_fetch = 3000000000;
  p.bytes_needed = 3000000000;
  p.bytes_free = 1000000000;
  p.disk_reserve = 500000000;
  p.evictions = {{"alpha", 8000000000, std::string("2026-03-01T15:00:00Z"), true}};
  p.fits = false;
  p.shortfall_bytes = 2500000000;
  p.allow_downtime = false;
  p.active_model = "alpha";
  p.stops = {"beta"};
  p.rollback_possible = false;
  p.warming = "in_outage";
  p.fits_with_allow_downtime = true;
  p.preflight = {{"command", true, "/usr/bin/vllm is an executable file"}};
  return p;
}

// A plan of a model that already serves that commit.
inline deploy::PlanReport plan_serving() {
  deploy::PlanReport p;
  p.model = "alpha";
  p.repo = "org/alpha";
  p.revision = "main";
  p.commit = kA1;
  p.verified = true;
  p.files_total = 8;
  p.bytes_total = 8000000000;
  p.bytes_local = 8000000000;
  p.bytes_free = 90000000000;
  p.fits = true;
  p.already_serving = true;
  p.active_model = "alpha";
  p.stops = {"alpha"};
  p.warming = "off";
  return p;
}

inline deploy::VerifyReport verify_problems() {
  return {"alpha", kA1, 8, 8000000000,
          {{"checksum_mismatch", "model-00001-of-00008.safetensors", "",
            "model-00001-of-00008.safetensors: sha256 is 00ff.. but the Hub lists 11ee.."},
           {"safetensors_invalid", "model-00002-of-00008.safetensors", "model.layers.0.mlp.weight",
            "model-00002-of-00008.safetensors: tensor model.layers.0.mlp.weight ends past the file"}}};
}

inline deploy::VerifyReport verify_clean() { return {"beta", kB0, 4, 3000000000, {}}; }

inline deploy::Removal removal_all() { return {"gamma", 1234567890, {kG1}}; }
inline deploy::Removal removal_one() { return {"beta", 3000000000, {kB1}}; }

}  // namespace modeld::control::golden
