#include "health/health.hpp"
#include "util/json.hpp"
#include "util/on_pool.hpp"
#include "util/poll.hpp"
#include "util/quantities.hpp"
#include "util/text.hpp"

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>

namespace modeld::health {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string_view step_name(Step s) noexcept {
  switch (s) {
    case Step::unit_active: return "unit_active";
    case Step::port: return "port";
    case Step::health: return "health";
    case Step::models: return "models";
    case Step::completion: return "completion";
    case Step::ready: return "ready";
  }
  return "?";
}

namespace {

constexpr std::size_t kMaxProbeBody = 1u << 20;

// How much of a server's answer a message quotes.
constexpr std::size_t kExcerptBytes = 200;

Result<http::Request> make_request(const Target& t, std::string method, const std::string& path, std::string body = {}) {
  std::string host = t.host.find(':') != std::string::npos ? "[" + t.host + "]" : t.host;
  auto url = http::Url::parse(fmt::format("http://{}:{}{}", host, t.port, path));
  if (!url) return url.error();
  http::Request r;
  r.method = std::move(method);
  r.url = std::move(*url);
  r.timeout = t.request_timeout;
  if (t.api_key) r.headers.add("Authorization", "Bearer " + *t.api_key);
  if (!body.empty()) {
    r.body = std::move(body);
    r.content_type = "application/json";
  }
  return r;
}

using Passed = std::function<void(Step, const std::string&)>;

// The three checks in order; `passed` is told of each one that succeeds.
awaitable<Result<void>> probe_steps(http::Client& client, const Target& t, const Passed& passed) {
  auto fail = [](Step step, std::string what) {
    return make_error(Errc::health_failed, fmt::format("{} check: {}", step_name(step), what));
  };
  auto quote = [](std::string_view answer) { return util::excerpt(answer, kExcerptBytes); };

  // 1. GET health_path answers 200.
  auto req = make_request(t, "GET", t.health_path);
  if (!req) co_return req.error();
  auto where = req->url.redacted();
  auto r = co_await client.request(*req, kMaxProbeBody);
  if (!r) co_return r.error();
  if (r->head.status != 200)
    co_return fail(Step::health, fmt::format("GET {} answered {}: {}", where, r->head.status, quote(r->body)));
  passed(Step::health, fmt::format("GET {} answered 200", where));

  // 2. GET models_path lists the served name.
  req = make_request(t, "GET", t.models_path);
  if (!req) co_return req.error();
  where = req->url.redacted();
  r = co_await client.request(*req, kMaxProbeBody);
  if (!r) co_return r.error();
  if (r->head.status != 200)
    co_return fail(Step::models, fmt::format("GET {} answered {}: {}", where, r->head.status, quote(r->body)));
  json models = json::parse(r->body, nullptr, false);
  auto data = models.is_object() ? models.find("data") : models.end();
  if (models.is_discarded() || !models.is_object() || data == models.end() || !data->is_array())
    co_return fail(Step::models, fmt::format("GET {} did not answer a JSON object with a 'data' array: {}", where,
                                             quote(r->body)));
  std::vector<std::string> ids;
  for (const auto& m : *data)
    if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
  if (std::find(ids.begin(), ids.end(), t.served_name) == ids.end())
    co_return fail(Step::models, fmt::format("GET {} does not list '{}'; it lists: {}", where, t.served_name,
                                             ids.empty() ? std::string("nothing") : quote(fmt::format("{}", fmt::join(ids, ", ")))));
  passed(Step::models, fmt::format("GET {} lists '{}'", where, t.served_name));

  // 3. A one-token completion.
  if (t.completion) {
    json body = {{"model", t.served_name}, {"prompt", "Hello"}, {"max_tokens", 1}, {"temperature", 0}};
    req = make_request(t, "POST", "/v1/completions", util::dump_json(body));
    if (!req) co_return req.error();
    where = req->url.redacted();
    r = co_await client.request(*req, kMaxProbeBody);
    if (!r) co_return r.error();
    if (r->head.status != 200)
      co_return fail(Step::completion, fmt::format("POST {} answered {}: {}", where, r->head.status, quote(r->body)));
    json answer = json::parse(r->body, nullptr, false);
    bool has_text = answer.is_object() && answer.contains("choices") && answer["choices"].is_array() &&
                    !answer["choices"].empty() && answer["choices"][0].is_object() &&
                    answer["choices"][0].contains("text") && answer["choices"][0]["text"].is_string();
    if (!has_text)
      co_return fail(Step::completion,
                     fmt::format("POST {} answered without choices[0].text: {}", where, quote(r->body)));
    passed(Step::completion, fmt::format("POST {} returned a token", where));
  }
  co_return Result<void>{};
}

bool is_cancel(const boost::system::system_error& e) { return e.code() == asio::error::operation_aborted; }

}  // namespace

awaitable<Result<void>> probe_once(http::Client& client, const Target& target) {
  try {
    co_return co_await probe_steps(client, target, [](Step, const std::string&) {});
  } catch (const boost::system::system_error& e) {
    if (!is_cancel(e)) throw;
  }
  co_return make_error(Errc::cancelled, "readiness probe: cancelled");
}

OutputReader journal_output(asio::thread_pool& pool, std::string unit, std::chrono::system_clock::time_point since,
                            std::size_t lines, std::filesystem::path directory, std::string identifier) {
  // The open journal is shared by the copies of the reader and used by one pool job at a time:
  // wait_ready() awaits each read before it starts the next.
  auto journal = std::make_shared<std::unique_ptr<sys::UnitJournal>>();
  // Not a coroutine itself: GCC 12 miscompiles lambdas with captures made inside a coroutine
  // lambda (their captures are destroyed twice), so the pool job is built in plain code.
  return [&pool, unit = std::move(unit), since, lines, directory = std::move(directory), identifier = std::move(identifier),
          journal](const units::UnitStatus& status) {
    // By identifier, the invocation is not in the journal: one query for the whole wait.
    auto job = [unit, since, lines, directory, identifier, journal,
                invocation = identifier.empty() ? status.invocation_id : std::string()]() -> Result<sys::UnitOutput> {
      if (!*journal || (*journal)->query().invocation_id != invocation) {
        sys::UnitJournalQuery q;
        q.unit = unit;
        q.identifier = identifier;
        q.invocation_id = invocation;
        if (invocation.empty()) q.since = since;
        q.lines = lines;
        q.directory = directory;
        auto opened = sys::UnitJournal::open(std::move(q));
        if (!opened) return opened.error();
        *journal = std::move(*opened);
      }
      return (*journal)->read();
    };
    return util::on_pool<Result<sys::UnitOutput>>(pool, std::move(job));
  };
}

namespace {

bool process_exists(std::uint32_t pid) {
  std::error_code ec;
  return std::filesystem::exists(fmt::format("/proc/{}", pid), ec);
}

// Whether something accepts a TCP connection on the target's port: the step between a live
// process and an HTTP answer, which tells "still loading, not listening" from "listening but
// not healthy". A connect that takes longer than a second or two counts as "not yet".
awaitable<Result<void>> port_accepts(const Target& t) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(t.host, ec);
  if (ec) co_return Result<void>{};  // a host name: the HTTP checks resolve and judge it
  boost::beast::tcp_stream stream(co_await asio::this_coro::executor);
  stream.expires_after(std::min<std::chrono::milliseconds>(t.request_timeout, std::chrono::seconds(2)));
  auto [cec] = co_await stream.async_connect(asio::ip::tcp::endpoint(address, t.port),
                                             asio::as_tuple(asio::use_awaitable));
  if (cec == asio::error::operation_aborted) throw boost::system::system_error(cec);
  if (cec)
    co_return make_error(Errc::network_error,
                         fmt::format("port {} does not accept connections yet ({})", t.port,
                                     cec == boost::beast::error::timeout ? std::string("connect timed out") : cec.message()));
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  co_return Result<void>{};
}

// A server line fit for a message: the API key (should the server print its arguments) hidden.
std::string redact(std::string line, const Target& t) {
  if (t.api_key && !t.api_key->empty())
    for (auto at = line.find(*t.api_key); at != std::string::npos; at = line.find(*t.api_key, at + 3))
      line.replace(at, t.api_key->size(), "***");
  return line;
}

std::string quoted_lines(const std::vector<std::string>& lines, const Target& t) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + redact(l, t);
  return out;
}

std::chrono::milliseconds since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t);
}

}  // namespace

awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager, const std::string& unit,
                                   const Target& target, std::chrono::milliseconds timeout,
                                   std::function<void(Step, const std::string&)> on_step,
                                   std::chrono::milliseconds interval) {
  ReadyOptions options;
  options.timeout = timeout;
  options.interval = interval;
  options.on_step = std::move(on_step);
  co_return co_await wait_ready(client, manager, unit, target, options);
}

namespace {

// One wait_ready(): what it has seen so far, and one method per part of a poll.
class ReadyWait {
 public:
  ReadyWait(http::Client& client, units::ServiceManager& manager, const std::string& unit, const Target& target,
            const ReadyOptions& options)
      : client_(client), manager_(manager), unit_(unit), target_(target), options_(options),
        output_readable_(static_cast<bool>(options.output)) {}

  awaitable<Result<void>> run();

 private:
  // Tells on_step of `s` the first time it (or a later step) is passed.
  void passed(Step s, const std::string& text) {
    if (static_cast<int>(s) > reached_) {
      reached_ = static_cast<int>(s);
      if (options_.on_step) options_.on_step(s, text);
    }
  }
  std::string_view reached_name() const { return reached_ < 0 ? "none" : step_name(static_cast<Step>(reached_)); }
  std::string last_line() const { return last_lines_.empty() ? std::string() : redact(last_lines_.back(), target_); }

  awaitable<std::optional<Result<void>>> poll();
  awaitable<bool> read_output(const units::UnitStatus& st);
  awaitable<Error> dead(const units::UnitStatus& s);
  awaitable<std::optional<Result<void>>> probe_running(const units::UnitStatus& s);
  std::optional<Error> hung_or_late(bool alive, std::uint32_t main_pid);

  http::Client& client_;
  units::ServiceManager& manager_;
  const std::string& unit_;
  const Target& target_;
  const ReadyOptions& options_;
  const Clock::time_point start_ = Clock::now();
  const Clock::time_point deadline_ = start_ + options_.timeout;
  int reached_ = -1;  // the highest Step passed so far
  bool seen_active_ = false;
  std::string last_answer_ = "the unit has not become active";
  // What the journal says: a new line (or any HTTP answer) is a sign of life.
  bool output_readable_;
  std::string last_cursor_;
  std::vector<std::string> last_lines_;
  Clock::time_point last_activity_ = start_;
  Clock::time_point next_progress_ = start_ + options_.progress_every;
};

awaitable<Result<void>> ReadyWait::run() {
  std::optional<Result<void>> outcome;
  try {
    // One millisecond past the deadline, so the poll at the deadline itself reports it.
    co_await util::poll_until(deadline_ + std::chrono::milliseconds(1), options_.interval,
                              [&]() -> awaitable<bool> {
                                outcome = co_await poll();
                                co_return outcome.has_value();
                              });
  } catch (const boost::system::system_error& e) {
    if (!is_cancel(e)) throw;
    outcome.reset();
  }
  if (outcome) co_return *outcome;
  co_return make_error(Errc::cancelled, fmt::format("waiting for {} to be ready: cancelled", unit_));
}

// One poll: the unit's state, then the probes when it runs, the journal, and the time limits;
// nullopt when the server is not ready yet and may still become so.
awaitable<std::optional<Result<void>>> ReadyWait::poll() {
  auto st = co_await manager_.status(unit_);
  bool alive = false;
  if (!st) {
    // A failed status query is not the unit failing: keep polling until the deadline.
    last_answer_ = st.error().message;
  } else {
    const auto& s = *st;
    const bool dead_now = s.active_state == units::ActiveState::failed ||
                          (s.active_state == units::ActiveState::inactive &&
                           (seen_active_ || (!s.result.empty() && s.result != "success")));
    if (dead_now) co_return Result<void>(co_await dead(s));
    const bool running = s.active_state == units::ActiveState::active || s.active_state == units::ActiveState::reloading;
    const bool pid_alive = s.main_pid == 0 || process_exists(s.main_pid);
    alive = (running || s.active_state == units::ActiveState::activating) && pid_alive;
    if (running && !pid_alive) {
      // systemd notices the exit a moment later; the next poll reports the unit dead.
      last_answer_ = fmt::format("{}'s main process {} has exited", unit_, s.main_pid);
    } else if (running) {
      if (auto done = co_await probe_running(s)) co_return done;
    } else {
      last_answer_ = fmt::format("{} is {} ({})", unit_, units::to_string(s.active_state), s.sub_state);
    }
    co_await read_output(s);
  }
  if (auto e = hung_or_late(alive, st ? st->main_pid : 0)) co_return Result<void>(*e);
  co_return std::nullopt;
}

// Reads the journal; false when it is (or has become) unreadable.
awaitable<bool> ReadyWait::read_output(const units::UnitStatus& st) {
  if (!output_readable_) co_return false;
  auto out = co_await options_.output(st);
  if (!out) {
    output_readable_ = false;
    if (options_.on_output_unreadable) options_.on_output_unreadable(out.error().message);
    co_return false;
  }
  if (!out->newest_cursor.empty() && out->newest_cursor != last_cursor_) {
    last_cursor_ = out->newest_cursor;
    last_activity_ = Clock::now();
  }
  last_lines_ = std::move(out->lines);
  co_return true;
}

// unit_failed for a unit that failed or stopped while starting, with its last journal lines.
awaitable<Error> ReadyWait::dead(const units::UnitStatus& s) {
  std::string said;
  if (options_.output) {
    // journald stores a stream's last lines a moment after the process is gone: read until two
    // reads agree, for at most a second.
    std::string before = last_cursor_;
    for (int i = 0; i < 5 && co_await read_output(s); ++i) {
      if (i > 0 && last_cursor_ == before) break;
      before = last_cursor_;
      if (!co_await util::pause_for(std::chrono::milliseconds(200))) break;
    }
    if (!output_readable_)
      said = "; its journal could not be read";
    else if (last_lines_.empty())
      said = "; it wrote nothing to its journal";
    else
      said = fmt::format("; its last journal lines:{}", quoted_lines(last_lines_, target_));
  }
  std::string words = options_.explain_exit ? options_.explain_exit(s) : std::string();
  if (!words.empty()) words = ": " + words;
  co_return make_error(Errc::unit_failed,
                       fmt::format("{} {} while starting after {} (result {}, exit status {}{}){}", unit_,
                                   s.active_state == units::ActiveState::failed ? "failed" : "stopped",
                                   util::format_seconds(since(start_)), s.result.empty() ? "unknown" : s.result,
                                   s.exec_main_status, words, said));
}

// The port, then the HTTP probes, of a unit that runs: success once ready, cancelled, or nullopt
// (not ready yet, last_answer_ saying why).
awaitable<std::optional<Result<void>>> ReadyWait::probe_running(const units::UnitStatus& s) {
  seen_active_ = true;
  passed(Step::unit_active, s.main_pid ? fmt::format("{} is active, main process {} alive", unit_, s.main_pid)
                                       : fmt::format("{} is active", unit_));
  auto port = co_await port_accepts(target_);
  if (!port) {
    last_answer_ = port.error().message;
    co_return std::nullopt;
  }
  passed(Step::port, fmt::format("port {} accepts connections", target_.port));
  auto probe = co_await probe_steps(client_, target_, [this](Step step, const std::string& text) { passed(step, text); });
  if (probe) {
    passed(Step::ready, fmt::format("{} is ready after {}", unit_, util::format_seconds(since(start_))));
    co_return Result<void>{};
  }
  if (probe.error().code == Errc::cancelled) co_return Result<void>(probe.error());
  // An HTTP answer, even a refusal, shows the server is not silent.
  if (probe.error().code == Errc::health_failed) last_activity_ = Clock::now();
  last_answer_ = probe.error().message;
  co_return std::nullopt;
}

// readiness_timeout for a server alive but silent for stall_timeout (hung) or not ready by the
// deadline; else tells on_progress, every progress_every, and returns nullopt.
std::optional<Error> ReadyWait::hung_or_late(bool alive, std::uint32_t main_pid) {
  const auto now = Clock::now();
  const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_activity_);
  const std::string line = last_line();
  if (alive && output_readable_ && options_.stall_timeout.count() > 0 && silent >= options_.stall_timeout)
    return make_error(Errc::readiness_timeout,
                      fmt::format("{} is hung: its main process {} is alive but has been silent for {} (no journal "
                                  "line, no HTTP answer; stall_timeout {}), not ready after {}; last step reached: {}; "
                                  "last answer: {}; last server line: '{}'",
                                  unit_, main_pid, util::format_seconds(silent),
                                  util::format_seconds(options_.stall_timeout), util::format_seconds(since(start_)),
                                  reached_name(), last_answer_, line.empty() ? "none" : line));
  if (now >= deadline_)
    return make_error(Errc::readiness_timeout,
                      fmt::format("{} was not ready within {}; last step reached: {}; last answer: {}{}", unit_,
                                  util::format_seconds(options_.timeout), reached_name(), last_answer_,
                                  line.empty() ? std::string() : fmt::format("; last server line: '{}'", line)));
  if (now >= next_progress_) {
    next_progress_ = now + options_.progress_every;
    if (options_.on_progress) options_.on_progress(Progress{since(start_), silent, line, last_answer_});
  }
  return std::nullopt;
}

}  // namespace

awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager, const std::string& unit,
                                   const Target& target, const ReadyOptions& options) {
  ReadyWait wait(client, manager, unit, target, options);
  co_return co_await wait.run();
}

awaitable<Result<BenchmarkResult>> benchmark(http::Client& client, const Target& target, const std::string& prompt,
                                             unsigned max_tokens) {
  json body = {{"model", target.served_name}, {"prompt", prompt}, {"max_tokens", max_tokens},
               {"temperature", 0},           {"stream", true}};
  auto req = make_request(target, "POST", "/v1/completions", util::dump_json(body));
  if (!req) co_return req.error();
  const std::string where = req->url.redacted();

  std::string pending;  // a partial SSE line
  std::size_t chunks = 0;
  std::optional<std::uint64_t> reported_tokens;  // usage.completion_tokens, when the server sends it
  std::optional<Clock::time_point> first, last;
  const auto start = Clock::now();

  auto on_line = [&](std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") return;  // comments, event names, blank separators
    line.remove_prefix(5);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line == "[DONE]") return;
    json event = json::parse(line, nullptr, false);
    if (!event.is_object()) return;
    if (event.contains("usage") && event["usage"].is_object() && event["usage"].contains("completion_tokens") &&
        event["usage"]["completion_tokens"].is_number_unsigned())
      reported_tokens = event["usage"]["completion_tokens"].get<std::uint64_t>();
    const auto& choices = event.contains("choices") ? event["choices"] : json();
    if (!choices.is_array() || choices.empty() || !choices[0].is_object()) return;
    const auto& text = choices[0].contains("text") ? choices[0]["text"] : json();
    if (!text.is_string() || text.get_ref<const std::string&>().empty()) return;
    auto now = Clock::now();
    if (!first) first = now;
    last = now;
    ++chunks;
  };

  http::BodySink sink;
  sink.on_head = [&](const http::ResponseHead& head) -> Result<void> {
    if (head.status != 200)
      return make_error(Errc::health_failed, fmt::format("benchmark: POST {} answered {}", where, head.status));
    return {};
  };
  sink.on_data = [&](std::span<const char> data) -> awaitable<Result<void>> {
    pending.append(data.data(), data.size());
    std::size_t pos = 0;
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', pos)) {
      on_line(std::string_view(pending).substr(pos, nl - pos));
      pos = nl + 1;
    }
    pending.erase(0, pos);
    if (pending.size() > (1u << 20))
      co_return make_error(Errc::health_failed, fmt::format("benchmark: POST {}: an event line over 1 MiB", where));
    co_return Result<void>{};
  };

  Result<http::ResponseHead> head = make_error(Errc::internal, "benchmark not run");
  try {
    head = co_await client.stream(*req, sink);
  } catch (const boost::system::system_error& e) {
    if (!is_cancel(e)) throw;
    head = make_error(Errc::cancelled, "benchmark: cancelled");
  }
  if (!head) co_return head.error();
  if (!pending.empty()) on_line(pending);
  if (!first)
    co_return make_error(Errc::health_failed, fmt::format("benchmark: POST {} streamed no tokens", where));

  BenchmarkResult result;
  result.ttft_s = std::chrono::duration<double>(*first - start).count();
  double decode_s = std::chrono::duration<double>(*last - *first).count();
  auto tokens = reported_tokens.value_or(chunks);
  // The first token is the prefill's; the decode rate counts the ones after it.
  if (tokens > 1 && decode_s > 0) result.decode_tokens_per_s = static_cast<double>(tokens - 1) / decode_s;
  co_return result;
}

}  // namespace modeld::health
