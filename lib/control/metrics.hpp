#pragma once
// GET /metrics beyond what the Deployer's records hold: counters fed by the Deployer's event stream
// (deployments by result, phase durations, bytes downloaded, verification failures) and by the
// daemon (configuration reloads), and the optional TCP listener of [metrics] listen that serves
// the same text to Prometheus. The text itself is built by metrics_text() (routes.hpp).

#include "deploy/control.hpp"
#include "util/error.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace modeld::control {

struct Request;
struct Response;

/// The observations of one phase across deployments: how many, their total and the last one.
struct PhaseDurations {
  std::uint64_t count = 0;
  double sum = 0;   ///< seconds
  double last = 0;  ///< seconds, of the deployment that ran the phase last

  /// Adds one duration in seconds.
  void observe(double seconds);
};

/// The outages of switches (DEPLOYMENT.switch.downtime_s): a histogram over every deployment that
/// reported one, and the last one per model.
struct SwitchDowntimes {
  /// Upper bounds of the histogram's buckets in seconds, from a second to an hour (+Inf beyond).
  static constexpr std::array<double, 11> bounds{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600};
  std::array<std::uint64_t, bounds.size()> buckets{};  ///< observations <= each bound (cumulative)
  std::uint64_t count = 0;
  double sum = 0;                       ///< seconds
  std::map<std::string, double> last;  ///< model -> the downtime of its last switch, seconds

  /// Adds the switch of a deployment of `model` that lasted `seconds`.
  void observe(const std::string& model, double seconds);
};

/// Counter values that metrics_text() prints when it is given them.
struct MetricCounters {
  std::map<std::string, std::uint64_t> deployments;   ///< terminal state -> deployments that ended so
  std::map<std::string, PhaseDurations> phases;       ///< phase name -> durations
  std::uint64_t download_bytes = 0;                   ///< checkpoint bytes written by downloads
  std::map<std::string, std::uint64_t> verification_failures;  ///< "deployment" | "verify" -> failures
  std::map<std::string, std::uint64_t> reloads;       ///< "success" | "failure" -> configuration reloads
  std::optional<bool> last_reload_ok;                 ///< nullopt until the first reload
  SwitchDowntimes switches;                           ///< from the history at start, then each ended deployment
};

/// The Prometheus text exposition of GET /metrics with the deployment counts and switch
/// downtimes taken from the Deployer's history and every other counter at 0 (the server answers
/// with a MetricsCollector's counters instead).
std::string metrics_text(const deploy::Control& control);

/// The Prometheus text exposition of GET /metrics (docs/interface.md "Added by this project"):
/// modeld_up, modeld_deployments_total{result}, modeld_deployment_running,
/// modeld_phase_duration_seconds{phase} (the last run's), modeld_phase_seconds_total{phase},
/// modeld_phase_runs_total{phase}, modeld_download_bytes_total,
/// modeld_download_rate_bytes_per_second, modeld_verification_failures_total{source},
/// modeld_config_reloads_total{result}, modeld_active_model_info{model,commit,unit} (the service
/// put into service last), modeld_service_info{model,commit,unit,port,gpu_ids} (each service), the
/// watchdog's series (modeld_readiness_probe_seconds{model} ..., each model watched), the
/// benchmark's, and the switches' (modeld_switch_downtime_seconds{model}, modeld_switch_downtimes_seconds).
std::string metrics_text(const deploy::Control& control, const MetricCounters& counters);

/// The counters that `control`'s history holds: deployments by terminal state and the switch
/// downtimes of the ended ones; every other counter at 0.
MetricCounters counts_from_history(const deploy::Control& control);

/// Keeps MetricCounters up to date from `control`'s events; lives on the io_context thread.
class MetricsCollector {
 public:
  /// Subscribes to `control` (which must outlive the collector) and starts the deployment counts
  /// and the switch downtimes from the ended deployments of its history.
  explicit MetricsCollector(deploy::Control& control);
  ~MetricsCollector();
  MetricsCollector(const MetricsCollector&) = delete;
  MetricsCollector& operator=(const MetricsCollector&) = delete;

  /// Counts what an answered request says, e.g. a POST /v1/models/NAME/verify that found problems.
  void observe(const Request& request, const Response& response);

  /// Counts one configuration reload, taken over (`ok`) or refused.
  void reloaded(bool ok);

  /// Feeds one event as the Deployer would (the subscription calls this; tests too).
  void on_event(const deploy::Event& event);

  /// The counters as they are now.
  const MetricCounters& counters() const { return counters_; }

  /// The whole exposition: metrics_text(control, counters()).
  std::string text() const;

 private:
  struct Tracked {
    std::string phase;
    std::chrono::steady_clock::time_point since;
    std::uint64_t bytes_done = 0;
  };
  deploy::Control& control_;
  std::uint64_t token_ = 0;
  MetricCounters counters_;
  std::map<std::string, Tracked> running_;  ///< by deployment id
};

/// How many connections the TCP /metrics listener holds ([metrics] max_connections,
/// per_address_connections).
struct MetricsLimits {
  std::size_t max_connections = 16;         ///< connections at once, every client together
  std::size_t per_address_connections = 4;  ///< connections at once from one peer IP address
};

/// Serves GET (and HEAD) /metrics over TCP for [metrics] listen: read-only, no other route (404),
/// other methods 405; keep-alive, header limit 8 KiB, a request within 10 s, its answer taken
/// within 5 s. Access control is only the address it is bound to. A new connection beyond a limit
/// of MetricsLimits is always let in: it takes the place of the connection longest without
/// progress (no request byte read, no answer byte written), whether it waits for a request or for
/// its answer to be read, of its own address (per-address limit) or of the address holding the
/// most (overall limit); one that made progress within the last second is closed only when every
/// such connection did. So clients that hold connections without asking or without reading cannot
/// keep a scraper out. Closed connections are told in a warning line at most every 10 s, naming
/// the addresses that lost connections since the last line.
class MetricsListener {
 public:
  /// `text` makes the body of each answer; called on `executor`'s thread. `limits` must be at
  /// least 1 each.
  MetricsListener(boost::asio::any_io_executor executor, std::function<std::string()> text,
                  MetricsLimits limits = {});
  ~MetricsListener();
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  /// Resolves `host_port` ("127.0.0.1:9464", "[::1]:9464", "localhost:9464"; port 0 picks a free
  /// one, for tests), binds the first address it gives and listens. Errors: io_error naming
  /// metrics.listen and the address (in use, cannot be resolved, not local).
  Result<void> listen(const std::string& host_port);

  /// The bound port (after listen()).
  std::uint16_t port() const;

  /// Starts accepting connections; an emit on `stop_on` (the daemon's cancellation tree) stops
  /// the listener as stop() does. Returns at once.
  void start(boost::asio::cancellation_slot stop_on = {});

  /// Closes the listener and every connection; idempotent.
  void stop();

  /// Connections open now (for tests).
  std::size_t connections() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace modeld::control
