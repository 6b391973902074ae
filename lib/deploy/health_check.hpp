#pragma once
// health_checking and benchmarking (health_check.cpp): readiness of the new service, then its
// first-token latency and decode rate.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// When a readiness wait saw the port accept a connection and the server ready (ns since the
/// epoch); with the Services::wait_ready seam both are the moment it returned.
struct Readiness {
  std::int64_t port_ns = 0;
  std::int64_t ready_ns = 0;
};

/// What benchmarking measured; empty when disabled or failed (a failed benchmark is no failure).
struct Benchmarked {
  std::optional<double> ttft_s;               ///< first-token latency, seconds
  std::optional<double> decode_tokens_per_s;  ///< decode rate
};

/// health_checking: wait for readiness within startup_timeout; returns when the port listened and
/// the server was ready.
boost::asio::awaitable<Result<Readiness>> run_health_checking(Services& s, const Run& run);

/// Waits until the service of `model` is ready within its startup_timeout, logging each step
/// (Services::wait_ready instead, when set); returns when the port listened and it was ready.
boost::asio::awaitable<Result<Readiness>> wait_model_ready(Services& s, const config::ModelConfig& model,
                                                      const sys::Fields& fields);

/// benchmarking: measure first-token latency and decode rate when enabled; never fails (a
/// failed measurement is logged and returns no numbers).
boost::asio::awaitable<Result<Benchmarked>> run_benchmarking(Services& s, const Run& run);

/// What readiness and the watchdog probe for `model`: its port, health and models paths, served
/// name, whether a completion is needed, and the API key from api_key_file (io_error naming the
/// file, never its content).
Result<health::Target> target_of(const config::ModelConfig& model);

/// Reads the model's health API key from api_key_file (first line, trimmed) into `key`; leaves
/// it empty when no file is configured; io_error naming the file (never its content) otherwise.
Result<void> read_api_key(const config::ModelConfig& model, std::optional<std::string>& key);

}  // namespace modeld::deploy
