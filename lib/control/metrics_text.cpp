// The Prometheus text exposition of GET /metrics (metrics.hpp): every family's HELP and TYPE
// lines and its samples, from the Deployer's records and the MetricCounters.

#include "control/metrics.hpp"

#include "deploy/deployment.hpp"
#include "gpu/nvml.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::control {

namespace {

// Escapes a Prometheus label value: backslash, double quote and line feed.
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string metrics_text(const deploy::Control& control) { return metrics_text(control, counts_from_history(control)); }

namespace {

void family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// One series per label value in `keys`, with `label`="key" and its count in `counts` (0 when absent).
void labelled_counts(std::string& out, std::string_view name, std::string_view label,
                     std::initializer_list<std::string_view> keys,
                     const std::map<std::string, std::uint64_t>& counts) {
  for (std::string_view key : keys) {
    auto it = counts.find(std::string(key));
    out += fmt::format("{}{{{}=\"{}\"}} {}\n", name, label, key, it == counts.end() ? 0 : it->second);
  }
}

// modeld_up, the deployments, their phases and the download families.
void deployment_metrics(std::string& out, const deploy::Control& control, const MetricCounters& counters) {
  family(out, "modeld_up", "gauge", "Whether modeld is running (always 1 when it answers).");
  out += "modeld_up 1\n";

  family(out, "modeld_deployments_total", "counter", "Deployments that ended, by terminal state.");
  labelled_counts(out, "modeld_deployments_total", "result", {"succeeded", "failed", "cancelled", "rolled_back"},
                  counters.deployments);

  const auto current = control.current();
  family(out, "modeld_deployment_running", "gauge", "Whether a deployment runs now.");
  out += fmt::format("modeld_deployment_running {}\n", current && !current->ended() ? 1 : 0);

  // Durations of each phase: the deployment that ran it last (what an operator compares with),
  // and totals since the daemon started for averages (rate(total) / rate(runs)). Plain counters
  // rather than a histogram: the buckets that would fit a 2 s planning and a 3 h download differ
  // too much to be useful in one family.
  family(out, "modeld_phase_duration_seconds", "gauge",
         "Time the deployment that ran each phase last spent in it, in seconds.");
  for (const auto& [phase, d] : counters.phases)
    out += fmt::format("modeld_phase_duration_seconds{{phase=\"{}\"}} {}\n", label_value(phase), d.last);
  family(out, "modeld_phase_seconds_total", "counter", "Time all deployments since modeld started spent in each phase, in seconds.");
  for (const auto& [phase, d] : counters.phases)
    out += fmt::format("modeld_phase_seconds_total{{phase=\"{}\"}} {}\n", label_value(phase), d.sum);
  family(out, "modeld_phase_runs_total", "counter", "Phases run to their end by deployments since modeld started.");
  for (const auto& [phase, d] : counters.phases)
    out += fmt::format("modeld_phase_runs_total{{phase=\"{}\"}} {}\n", label_value(phase), d.count);

  family(out, "modeld_download_bytes_total", "counter", "Checkpoint bytes written by downloads since modeld started.");
  out += fmt::format("modeld_download_bytes_total {}\n", counters.download_bytes);
  family(out, "modeld_download_rate_bytes_per_second", "gauge",
         "Download rate of the running deployment now (0 when nothing downloads), in bytes per second.");
  double rate = 0;
  if (current && !current->ended() && current->phase == deploy::Phase::downloading)
    rate = current->progress.rate_bytes_per_s;
  out += fmt::format("modeld_download_rate_bytes_per_second {}\n", rate);
}

// The switches' outages: the last per model and a histogram of all.
void switch_metrics(std::string& out, const SwitchDowntimes& sw) {
  family(out, "modeld_switch_downtime_seconds", "gauge",
         "Outage of the model's last switch (DEPLOYMENT.switch.downtime_s), in seconds.");
  for (const auto& [model, s] : sw.last)
    out += fmt::format("modeld_switch_downtime_seconds{{model=\"{}\"}} {}\n", label_value(model), s);
  family(out, "modeld_switch_downtimes_seconds", "histogram",
         "Outages of switches (DEPLOYMENT.switch.downtime_s) in the kept history and since, in seconds.");
  for (std::size_t i = 0; i < sw.bounds.size(); ++i)
    out += fmt::format("modeld_switch_downtimes_seconds_bucket{{le=\"{}\"}} {}\n", sw.bounds[i], sw.buckets[i]);
  out += fmt::format("modeld_switch_downtimes_seconds_bucket{{le=\"+Inf\"}} {}\n", sw.count);
  out += fmt::format("modeld_switch_downtimes_seconds_sum {}\n", sw.sum);
  out += fmt::format("modeld_switch_downtimes_seconds_count {}\n", sw.count);
}

// The verification failure and configuration reload families.
void check_metrics(std::string& out, const MetricCounters& counters) {
  family(out, "modeld_verification_failures_total", "counter",
         "Checkpoints found damaged: deployments failed by a size, checksum, safetensors or completeness check "
         "(source=deployment), and modelctl verify runs that found problems (source=verify).");
  labelled_counts(out, "modeld_verification_failures_total", "source", {"deployment", "verify"},
                  counters.verification_failures);

  family(out, "modeld_config_reloads_total", "counter", "Configuration reloads (SIGHUP), taken over or refused.");
  labelled_counts(out, "modeld_config_reloads_total", "result", {"success", "failure"}, counters.reloads);
  family(out, "modeld_config_last_reload_successful", "gauge",
         "Whether the last configuration reload was taken over (1 until the first reload).");
  out += fmt::format("modeld_config_last_reload_successful {}\n", counters.last_reload_ok.value_or(true) ? 1 : 0);
}

// The watchdog records of every model watched since the daemon started (control.watchdogs()),
// and of each service in service that control.watchdogs() leaves out: one per model.
std::vector<deploy::WatchdogStatus> watched_models(const deploy::Control& control) {
  auto watched = control.watchdogs();
  for (const auto& s : control.services()) {
    if (!s.watchdog) continue;
    auto same = [&](const deploy::WatchdogStatus& w) { return w.model == s.model; };
    if (std::none_of(watched.begin(), watched.end(), same)) watched.push_back(*s.watchdog);
  }
  return watched;
}

// The post-deploy watchdog, one series per model watched since the daemon started.
void watchdog_metrics(std::string& out, const deploy::Control& control) {
  const auto watched = watched_models(control);
  auto per_model = [&](const char* name, const char* type, const char* help, auto value) {
    if (watched.empty()) return;
    family(out, name, type, help);
    for (const auto& w : watched) {
      auto v = value(w);
      if (v) out += fmt::format("{}{{model=\"{}\"}} {}\n", name, label_value(w.model), *v);
    }
  };
  per_model("modeld_watchdog_restarts_total", "counter", "Restarts of the model's unit by the watchdog.",
            [](const deploy::WatchdogStatus& w) { return std::optional<double>(static_cast<double>(w.restarts)); });
  per_model("modeld_watchdog_probe_failures_total", "counter", "Failed watchdog probes of the model's server.",
            [](const deploy::WatchdogStatus& w) { return std::optional<double>(static_cast<double>(w.probe_failures)); });
  per_model("modeld_watchdog_consecutive_failures", "gauge", "Failed watchdog probes in a row now.",
            [](const deploy::WatchdogStatus& w) {
              return std::optional<double>(static_cast<double>(w.consecutive_failures));
            });
  per_model("modeld_readiness_probe_seconds", "gauge", "How long the last watchdog probe took, in seconds.",
            [](const deploy::WatchdogStatus& w) { return w.last_probe_seconds; });
}

// The active model (the service put into service last) and every service in service.
void service_metrics(std::string& out, const deploy::Control& control) {
  family(out, "modeld_active_model_info", "gauge",
         "The model in service (of several, the one put into service last), its commit and its unit.");
  if (auto a = control.active())
    out += fmt::format("modeld_active_model_info{{model=\"{}\",commit=\"{}\",unit=\"{}\"}} 1\n",
                       label_value(a->model), label_value(a->commit), label_value(a->unit));
  family(out, "modeld_service_info", "gauge",
         "Each model in service: its commit, unit, the port and GPU ids (NVML indices; all, none) it was started with.");
  for (const auto& s : control.services())
    out += fmt::format("modeld_service_info{{model=\"{}\",commit=\"{}\",unit=\"{}\",port=\"{}\",gpu_ids=\"{}\"}} 1\n",
                       label_value(s.model), label_value(s.commit), label_value(s.unit), s.port,
                       label_value(gpu::describe_indices(s.gpu_ids)));
}

// The benchmark of each model's newest deployment that measured one.
void benchmark_metrics(std::string& out, const deploy::Control& control) {
  std::map<std::string, std::pair<double, double>> bench;
  for (const auto& d : control.history(std::numeric_limits<std::size_t>::max()))
    if (d.benchmark_ttft_s && d.benchmark_decode_tokens_per_s && !bench.count(d.model))
      bench[d.model] = {*d.benchmark_ttft_s, *d.benchmark_decode_tokens_per_s};
  if (bench.empty()) return;
  out += "# HELP modeld_benchmark_ttft_seconds Time to the first token in the model's last deployment benchmark.\n";
  out += "# TYPE modeld_benchmark_ttft_seconds gauge\n";
  for (const auto& [model, b] : bench)
    out += fmt::format("modeld_benchmark_ttft_seconds{{model=\"{}\"}} {}\n", label_value(model), b.first);
  out += "# HELP modeld_benchmark_decode_tokens_per_second Decode rate in the model's last deployment benchmark.\n";
  out += "# TYPE modeld_benchmark_decode_tokens_per_second gauge\n";
  for (const auto& [model, b] : bench)
    out += fmt::format("modeld_benchmark_decode_tokens_per_second{{model=\"{}\"}} {}\n", label_value(model),
                       b.second);
}

}  // namespace

std::string metrics_text(const deploy::Control& control, const MetricCounters& counters) {
  std::string out;
  deployment_metrics(out, control, counters);
  switch_metrics(out, counters.switches);
  check_metrics(out, counters);
  service_metrics(out, control);
  watchdog_metrics(out, control);
  benchmark_metrics(out, control);
  return out;
}

}  // namespace modeld::control
