#pragma once
// Readiness of an inference server with vLLM's OpenAI-compatible surface: the unit stays
// active, GET health path is 200, GET models path lists the served name, and a max_tokens=1
// completion returns a token (interface.md "[models.NAME.health]").

#include "http/client.hpp"
#include "units/service_manager.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace modeld::health {

/// What to probe.
struct Target {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string health_path = "/health";
  std::string models_path = "/v1/models";
  std::string served_name;
  bool completion = true;
  std::optional<std::string> api_key;  ///< sent as "Authorization: Bearer"; never logged
  std::chrono::milliseconds request_timeout = std::chrono::seconds(30);  ///< connect and each read
};

/// The readiness step reached, for progress messages.
enum class Step { unit_active, health, models, completion, ready };

/// Runs the three HTTP checks once, in order; health_failed naming the step and what was
/// answered, network_error when nothing listens, timeout, cancelled.
boost::asio::awaitable<Result<void>> probe_once(http::Client& client, const Target& target);

/// Waits until the server is ready: polls the unit (dead: unit_failed with its Result and exit
/// status; "failed", or "inactive" after it was active or with a Result other than "success")
/// and, while it is active, probe_once() every `interval`, up to `timeout` (readiness_timeout
/// naming the last step and answer). `on_step(step, text)` is called once for each step, when it
/// is first passed, in order, ending with Step::ready; cancelled when the caller is cancelled.
boost::asio::awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager,
                                                const std::string& unit, const Target& target,
                                                std::chrono::milliseconds timeout,
                                                std::function<void(Step, const std::string&)> on_step,
                                                std::chrono::milliseconds interval = std::chrono::milliseconds(500));

/// A first-token latency and decode-rate measurement with one streamed completion.
struct BenchmarkResult {
  double ttft_s = 0;
  double decode_tokens_per_s = 0;
};

/// Sends one streamed completion ("stream": true) of `max_tokens` for `prompt` and measures the
/// time to the first token and the decode rate after it (usage.completion_tokens when the server
/// sends it, else one token per event). health_failed on a non-200 answer or no tokens;
/// network_error, timeout, cancelled.
boost::asio::awaitable<Result<BenchmarkResult>> benchmark(http::Client& client, const Target& target,
                                                          const std::string& prompt, unsigned max_tokens);

}  // namespace modeld::health
