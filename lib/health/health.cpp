#include "health/health.hpp"
#include "util/json.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace modeld::health {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kMaxProbeBody = 1u << 20;

const char* step_name(Step s) {
  switch (s) {
    case Step::unit_active: return "unit active";
    case Step::health: return "health";
    case Step::models: return "models";
    case Step::completion: return "completion";
    case Step::ready: return "ready";
  }
  return "?";
}

// Server text fit for one line of a message.
std::string excerpt(std::string_view text, std::size_t limit = 200) {
  std::string out;
  for (char c : text.substr(0, limit)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? ' ' : c);
  if (text.size() > limit) out += "...";
  return out;
}

std::string seconds(std::chrono::milliseconds d) { return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0); }

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

  // 1. GET health_path answers 200.
  auto req = make_request(t, "GET", t.health_path);
  if (!req) co_return req.error();
  auto where = req->url.redacted();
  auto r = co_await client.request(*req, kMaxProbeBody);
  if (!r) co_return r.error();
  if (r->head.status != 200)
    co_return fail(Step::health, fmt::format("GET {} answered {}: {}", where, r->head.status, excerpt(r->body)));
  passed(Step::health, fmt::format("GET {} answered 200", where));

  // 2. GET models_path lists the served name.
  req = make_request(t, "GET", t.models_path);
  if (!req) co_return req.error();
  where = req->url.redacted();
  r = co_await client.request(*req, kMaxProbeBody);
  if (!r) co_return r.error();
  if (r->head.status != 200)
    co_return fail(Step::models, fmt::format("GET {} answered {}: {}", where, r->head.status, excerpt(r->body)));
  json models = json::parse(r->body, nullptr, false);
  auto data = models.is_object() ? models.find("data") : models.end();
  if (models.is_discarded() || !models.is_object() || data == models.end() || !data->is_array())
    co_return fail(Step::models, fmt::format("GET {} did not answer a JSON object with a 'data' array: {}", where,
                                             excerpt(r->body)));
  std::vector<std::string> ids;
  for (const auto& m : *data)
    if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
  if (std::find(ids.begin(), ids.end(), t.served_name) == ids.end())
    co_return fail(Step::models, fmt::format("GET {} does not list '{}'; it lists: {}", where, t.served_name,
                                             ids.empty() ? std::string("nothing") : excerpt(fmt::format("{}", fmt::join(ids, ", ")))));
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
      co_return fail(Step::completion, fmt::format("POST {} answered {}: {}", where, r->head.status, excerpt(r->body)));
    json answer = json::parse(r->body, nullptr, false);
    bool has_text = answer.is_object() && answer.contains("choices") && answer["choices"].is_array() &&
                    !answer["choices"].empty() && answer["choices"][0].is_object() &&
                    answer["choices"][0].contains("text") && answer["choices"][0]["text"].is_string();
    if (!has_text)
      co_return fail(Step::completion,
                     fmt::format("POST {} answered without choices[0].text: {}", where, excerpt(r->body)));
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

awaitable<Result<void>> wait_ready(http::Client& client, units::ServiceManager& manager, const std::string& unit,
                                   const Target& target, std::chrono::milliseconds timeout,
                                   std::function<void(Step, const std::string&)> on_step,
                                   std::chrono::milliseconds interval) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  int reached = -1;  // the highest Step passed so far
  Passed passed = [&](Step s, const std::string& text) {
    if (static_cast<int>(s) > reached) {
      reached = static_cast<int>(s);
      if (on_step) on_step(s, text);
    }
  };
  bool seen_active = false;
  std::string last_answer = "the unit has not become active";
  try {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
      auto st = co_await manager.status(unit);
      if (!st) {
        // A failed status query is not the unit failing: keep polling until the deadline.
        last_answer = st.error().message;
      } else {
        const auto& s = *st;
        bool dead = s.active_state == "failed" ||
                    (s.active_state == "inactive" && (seen_active || (!s.result.empty() && s.result != "success")));
        if (dead)
          co_return make_error(Errc::unit_failed,
                               fmt::format("{} {} while starting (result {}, exit status {})", unit,
                                           s.active_state == "failed" ? "failed" : "stopped",
                                           s.result.empty() ? "unknown" : s.result, s.exec_main_status));
        if (s.active_state == "active" || s.active_state == "reloading") {
          seen_active = true;
          passed(Step::unit_active, fmt::format("{} is active", unit));
          auto probe = co_await probe_steps(client, target, passed);
          if (probe) {
            passed(Step::ready, fmt::format("{} is ready after {}", unit,
                                            seconds(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start))));
            co_return Result<void>{};
          }
          if (probe.error().code == Errc::cancelled) co_return probe.error();
          last_answer = probe.error().message;
        } else {
          last_answer = fmt::format("{} is {} ({})", unit, s.active_state, s.sub_state);
        }
      }
      auto now = Clock::now();
      if (now >= deadline)
        co_return make_error(Errc::readiness_timeout,
                             fmt::format("{} was not ready within {}; last step reached: {}; last answer: {}", unit,
                                         seconds(timeout), reached < 0 ? "none" : step_name(static_cast<Step>(reached)),
                                         last_answer));
      timer.expires_after(std::min<Clock::duration>(interval, deadline - now));
      auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) break;  // cancelled
    }
  } catch (const boost::system::system_error& e) {
    if (!is_cancel(e)) throw;
  }
  co_return make_error(Errc::cancelled, fmt::format("waiting for {} to be ready: cancelled", unit));
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
