#pragma once
// Readiness of an inference server with vLLM's OpenAI-compatible surface: the unit stays
// active, GET health path is 200, GET models path lists the served name, and a max_tokens=1
// completion returns a token (interface.md "[models.NAME.health]").

#include "http/client.hpp"
#include "sys/journal.hpp"
#include "units/service_manager.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio { class thread_pool; }

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

/// The readiness step reached, for progress messages, in the order they are passed: the unit is
/// active with its main process alive, its port accepts a TCP connection, the health path is
/// 200, the models path lists the served name, a completion returns a token.
enum class Step { unit_active, port, health, models, completion, ready };

/// The contract's name of step `s` (interface.md, MODELD_READINESS_STEP): "unit_active", "port",
/// "health", "models", "completion", "ready"; also the name messages give it.
std::string_view step_name(Step s) noexcept;

/// Runs the three HTTP checks once, in order; health_failed naming the step and what was
/// answered, network_error when nothing listens, timeout, cancelled.
boost::asio::awaitable<Result<void>> probe_once(http::Client& client, const Target& target);

/// wait_ready() with ReadyOptions holding only `timeout`, `on_step` and `interval`: no journal,
/// so no hang detection and no server lines in errors.
boost::asio::awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager,
                                                const std::string& unit, const Target& target,
                                                std::chrono::milliseconds timeout,
                                                std::function<void(Step, const std::string&)> on_step,
                                                std::chrono::milliseconds interval = std::chrono::milliseconds(500));

/// Reads the server's newest journal lines for the unit in `status` (its current run). An error
/// means the journal cannot be read: wait_ready() then treats the server as loading.
using OutputReader = std::function<boost::asio::awaitable<Result<sys::UnitOutput>>(const units::UnitStatus& status)>;

/// An OutputReader over the systemd journal (sys::UnitJournal) of `unit`, reading on `pool`; it
/// opens the journal at its first read and again when the unit's invocation changes. Lines are of
/// the unit's current invocation, or, when the unit reports no invocation ID, not older than
/// `since`. At most `lines` lines, each cut at 300 bytes. `directory`: the journal files in
/// that folder instead of the local journal (for tests). `identifier` not empty: lines whose
/// SYSLOG_IDENTIFIER is `identifier`, not older than `since` (the process backend's servers).
OutputReader journal_output(boost::asio::thread_pool& pool, std::string unit,
                            std::chrono::system_clock::time_point since, std::size_t lines = 10,
                            std::filesystem::path directory = {}, std::string identifier = {});

/// What wait_ready() tells about a server that is not ready yet.
struct Progress {
  std::chrono::milliseconds waited{0};  ///< since the wait started
  std::chrono::milliseconds silent{0};  ///< since the server's last journal line or HTTP answer
  std::string last_line;                ///< its newest journal line ("" when none or unreadable)
  std::string last_answer;              ///< why it is not ready yet: the last probe's answer
};

/// How wait_ready() waits.
struct ReadyOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(60)};  ///< startup_timeout: readiness_timeout after it
  /// A server alive but silent (no new journal line, no HTTP answer) this long is hung
  /// (readiness_timeout saying so); 0 turns hang detection off. Needs `output`.
  std::chrono::milliseconds stall_timeout{0};
  std::chrono::milliseconds interval{500};  ///< between two polls of the unit, journal and probes
  /// on_progress is called at most this often (the first time one period after the start).
  std::chrono::milliseconds progress_every{std::chrono::seconds(30)};
  OutputReader output;  ///< empty: no journal (no hang detection, no lines in errors)
  /// Called once for each step, when it is first passed, in order, ending with Step::ready.
  std::function<void(Step, const std::string&)> on_step;
  std::function<void(const Progress&)> on_progress;  ///< a server still not ready, every progress_every
  /// Called once, with the reason, when the journal cannot be read (the wait goes on without
  /// hang detection).
  std::function<void(const std::string&)> on_output_unreadable;
  /// Words for how a dead server ended (e.g. what systemd's exit status 203 means, with the
  /// program's path), added to the unit_failed message after its exit status; empty: none.
  std::function<std::string(const units::UnitStatus&)> explain_exit;
};

/// Waits until the server is ready, polling every `options.interval`:
/// - dead (the unit "failed", or "inactive" after it was active or with a Result other than
///   "success"): unit_failed with its Result, exit status (and `options.explain_exit`'s words)
///   and the server's last journal lines
///   (an API key of `target` in them replaced by "***");
/// - alive (active, main process present in /proc): the port accepts a connection, then
///   probe_once()'s checks; any failure there means "not ready yet";
/// - hung (alive, not ready, nothing new in its journal and no HTTP answer for stall_timeout):
///   readiness_timeout whose message says "hung" and how long it was silent;
/// - not ready within `timeout`: readiness_timeout naming the last step and answer.
/// Cancelled when the caller is cancelled.
boost::asio::awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager,
                                                const std::string& unit, const Target& target,
                                                const ReadyOptions& options);

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
