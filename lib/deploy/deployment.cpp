#include "deploy/deployment.hpp"

#include "util/json.hpp"
#include "util/name_table.hpp"

#include <nlohmann/json.hpp>

#include <chrono>


namespace modeld::deploy {
namespace {

constexpr util::NameTable<Phase, 10> kPhases{{
    {Phase::planning, "planning"},
    {Phase::freeing_disk, "freeing_disk"},
    {Phase::downloading, "downloading"},
    {Phase::verifying, "verifying"},
    {Phase::warming, "warming"},
    {Phase::stopping_old, "stopping_old"},
    {Phase::launching, "launching"},
    {Phase::health_checking, "health_checking"},
    {Phase::benchmarking, "benchmarking"},
    {Phase::rolling_back, "rolling_back"},
}};

constexpr util::NameTable<State, 5> kStates{{
    {State::running, "running"},
    {State::succeeded, "succeeded"},
    {State::failed, "failed"},
    {State::cancelled, "cancelled"},
    {State::rolled_back, "rolled_back"},
}};

constexpr util::NameTable<Kind, 3> kKinds{{
    {Kind::deploy, "deploy"},
    {Kind::pull, "pull"},
    {Kind::stop, "stop"},
}};

}  // namespace

std::string_view to_string(Kind k) noexcept { return util::name_in(kKinds, k).value_or("unknown"); }
std::optional<Kind> kind_from_string(std::string_view s) noexcept { return util::value_in(kKinds, s); }
std::string_view to_string(Phase p) noexcept { return util::name_in(kPhases, p).value_or("unknown"); }
std::string_view to_string(State s) noexcept { return util::name_in(kStates, s).value_or("unknown"); }
std::optional<Phase> phase_from_string(std::string_view s) noexcept { return util::value_in(kPhases, s); }
std::optional<State> state_from_string(std::string_view s) noexcept { return util::value_in(kStates, s); }

nlohmann::json error_json(const Error& e) {
  return {{"code", std::string(to_string(e.code))}, {"message", e.message}};
}

namespace {

nlohmann::json files_json(const std::vector<FileProgress>& files) {
  auto out = nlohmann::json::array();
  for (const auto& f : files)
    out.push_back({{"path", f.path},
                   {"bytes_done", f.bytes_done},
                   {"bytes_total", f.bytes_total},
                   {"rate_bytes_per_s", f.rate_bytes_per_s},
                   {"eta_s", util::or_null(f.eta_s)},
                   {"connections", f.connections}});
  return out;
}

nlohmann::json warm_json(const std::optional<WarmReport>& w) {
  if (!w) return nullptr;
  return {{"bytes_total", w->bytes_total},
          {"bytes_resident_before", w->bytes_resident_before},
          {"bytes_warmed", w->bytes_warmed},
          {"bytes_resident_at_launch", util::or_null(w->bytes_resident_at_launch)}};
}

nlohmann::json switch_json(const std::optional<SwitchReport>& s) {
  if (!s) return nullptr;
  return {{"downtime_s", s->downtime_s},
          {"stop_s", s->stop_s},
          {"launch_s", s->launch_s},
          {"start_to_port_s", s->start_to_port_s},
          {"port_to_ready_s", s->port_to_ready_s}};
}

std::optional<WarmReport> warm_from_json(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  WarmReport w;
  w.bytes_total = j.at("bytes_total").get<std::uint64_t>();
  w.bytes_resident_before = j.at("bytes_resident_before").get<std::uint64_t>();
  w.bytes_warmed = j.at("bytes_warmed").get<std::uint64_t>();
  if (!j.at("bytes_resident_at_launch").is_null())
    w.bytes_resident_at_launch = j["bytes_resident_at_launch"].get<std::uint64_t>();
  return w;
}

std::optional<SwitchReport> switch_from_json(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return SwitchReport{j.at("downtime_s").get<double>(), j.at("stop_s").get<double>(), j.at("launch_s").get<double>(),
                      j.at("start_to_port_s").get<double>(), j.at("port_to_ready_s").get<double>()};
}

nlohmann::json marks_json(const SwitchMarks& m) {
  return {{"stop_requested_ns", m.stop_requested_ns},
          {"stop_done_ns", m.stop_done_ns},
          {"start_requested_ns", m.start_requested_ns},
          {"port_ns", m.port_ns},
          {"ready_ns", m.ready_ns}};
}

SwitchMarks marks_from_json(const nlohmann::json& j) {
  SwitchMarks m;
  m.stop_requested_ns = j.value("stop_requested_ns", std::int64_t{0});
  m.stop_done_ns = j.value("stop_done_ns", std::int64_t{0});
  m.start_requested_ns = j.value("start_requested_ns", std::int64_t{0});
  m.port_ns = j.value("port_ns", std::int64_t{0});
  m.ready_ns = j.value("ready_ns", std::int64_t{0});
  return m;
}

// Seconds from `from` to `to` (ns since the epoch); 0 when negative.
double span_s(std::int64_t from, std::int64_t to) { return to > from ? static_cast<double>(to - from) / 1e9 : 0.0; }

}  // namespace

std::int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<SwitchReport> switch_report_of(const SwitchMarks& m) {
  if (m.start_requested_ns == 0 || m.ready_ns == 0) return std::nullopt;
  const bool stopped = m.stop_requested_ns != 0;
  const auto begin = stopped ? m.stop_requested_ns : m.start_requested_ns;
  // Without a stop-done mark (the old service was found stopped after a restart), the stop ends
  // where the launch would begin: the whole gap is the stop's.
  const auto stop_done = !stopped ? m.start_requested_ns : m.stop_done_ns ? m.stop_done_ns : m.start_requested_ns;
  const auto port = m.port_ns ? m.port_ns : m.ready_ns;
  SwitchReport r;
  r.downtime_s = span_s(begin, m.ready_ns);
  r.stop_s = span_s(begin, stop_done);
  r.launch_s = span_s(stop_done, m.start_requested_ns);
  r.start_to_port_s = span_s(m.start_requested_ns, port);
  r.port_to_ready_s = span_s(port, m.ready_ns);
  return r;
}

nlohmann::json to_json(const Progress& p) {
  return {{"bytes_done", p.bytes_done},
          {"bytes_total", p.bytes_total},
          {"files_done", p.files_done},
          {"files_total", p.files_total},
          {"rate_bytes_per_s", p.rate_bytes_per_s},
          {"eta_s", util::or_null(p.eta_s)},
          {"files", files_json(p.files)}};
}

nlohmann::json to_json(const WarmReport& w) { return warm_json(w); }

nlohmann::json to_json(const Deployment& d, bool internal) {
  nlohmann::json j{
      {"id", d.id},
      {"kind", std::string(to_string(d.kind))},
      {"model", d.model},
      {"commit", util::or_null(d.commit)},
      {"allow_downtime", d.allow_downtime},
      {"changed", d.changed},
      {"phase", std::string(to_string(d.phase))},
      {"state", std::string(to_string(d.state))},
      {"progress", to_json(d.progress)},
      {"error", d.error ? error_json(*d.error) : nlohmann::json(nullptr)},
      {"started_at", d.started_at},
      {"finished_at", util::or_null(d.finished_at)},
      {"benchmark", d.benchmark_ttft_s ? nlohmann::json{{"ttft_s", *d.benchmark_ttft_s},
                                                        {"decode_tokens_per_s",
                                                         d.benchmark_decode_tokens_per_s.value_or(0)}}
                                       : nlohmann::json(nullptr)},
      {"warm", warm_json(d.warm)},
      {"switch", switch_json(d.switch_report)},
  };
  if (internal) {
    j["previous"] = nlohmann::json::array();
    for (const auto& a : d.previous) j["previous"].push_back(to_json(a));
    j["old_stopped"] = d.old_stopped;
    j["downtime_first"] = d.downtime_first;
    j["cancel_requested"] = d.cancel_requested;
    j["cleanup_begun"] = d.cleanup_begun;
    j["started_ns"] = d.started_ns;
    j["switch_marks"] = marks_json(d.switch_marks);
    j["restart"] = d.restart;
    if (d.end_unlogged) j["end_unlogged"] = true;
  }
  return j;
}

namespace {

// The services a record stops: "previous", or in a record written before the list, the one of
// "previous_model", "previous_commit" and "previous_started".
void read_previous(const nlohmann::json& j, Deployment& d) {
  if (j.contains("previous")) {
    for (const auto& a : j.at("previous")) d.previous.push_back(active_record_from_json(a));
    return;
  }
  if (!j.contains("previous_model") || j["previous_model"].is_null() || !j.contains("previous_commit") ||
      j["previous_commit"].is_null())
    return;
  ActiveRecord a{j["previous_model"].get<std::string>(), j["previous_commit"].get<std::string>(), ""};
  if (j.contains("previous_started") && j["previous_started"].is_object())
    if (auto st = started_settings_from_json(j["previous_started"])) a.started = std::move(*st);
  d.previous.push_back(std::move(a));
}

}  // namespace

Result<Deployment> deployment_from_json(const nlohmann::json& j) {
  try {
    Deployment d;
    d.id = j.at("id").get<std::string>();
    d.model = j.at("model").get<std::string>();
    if (!j.at("commit").is_null()) d.commit = j.at("commit").get<std::string>();
    d.allow_downtime = j.value("allow_downtime", false);
    d.changed = j.value("changed", true);
    auto phase = phase_from_string(j.at("phase").get<std::string>());
    auto state = state_from_string(j.at("state").get<std::string>());
    if (!phase || !state) return make_error(Errc::bad_request, "deployment record: unknown phase or state");
    d.phase = *phase;
    d.state = *state;
    const auto& p = j.at("progress");
    d.progress.bytes_done = p.at("bytes_done").get<std::uint64_t>();
    d.progress.bytes_total = p.at("bytes_total").get<std::uint64_t>();
    d.progress.files_done = p.at("files_done").get<unsigned>();
    d.progress.files_total = p.at("files_total").get<unsigned>();
    d.progress.rate_bytes_per_s = p.at("rate_bytes_per_s").get<double>();
    if (!p.at("eta_s").is_null()) d.progress.eta_s = p.at("eta_s").get<double>();
    if (!j.at("error").is_null())
      d.error = Error{errc_from_string(j["error"].at("code").get<std::string>()),
                      j["error"].at("message").get<std::string>()};
    d.started_at = j.at("started_at").get<std::string>();
    if (!j.at("finished_at").is_null()) d.finished_at = j.at("finished_at").get<std::string>();
    if (j.contains("benchmark") && !j["benchmark"].is_null()) {
      d.benchmark_ttft_s = j["benchmark"].at("ttft_s").get<double>();
      d.benchmark_decode_tokens_per_s = j["benchmark"].at("decode_tokens_per_s").get<double>();
    }
    read_previous(j, d);
    d.old_stopped = j.value("old_stopped", false);
    d.downtime_first = j.value("downtime_first", false);
    d.cancel_requested = j.value("cancel_requested", false);
    auto kind = kind_from_string(j.value("kind", std::string("deploy")));
    if (!kind) return make_error(Errc::bad_request, "deployment record: unknown kind " + j["kind"].dump());
    d.kind = *kind;
    if (j.contains("warm")) d.warm = warm_from_json(j["warm"]);
    if (j.contains("switch")) d.switch_report = switch_from_json(j["switch"]);
    d.cleanup_begun = j.value("cleanup_begun", false);
    d.started_ns = j.value("started_ns", std::int64_t{0});
    if (j.contains("switch_marks")) d.switch_marks = marks_from_json(j["switch_marks"]);
    d.restart = j.value("restart", false);
    d.end_unlogged = j.value("end_unlogged", false);
    return d;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
}

}  // namespace modeld::deploy
