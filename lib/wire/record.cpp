#include "wire/record.hpp"

#include "util/json.hpp"
#include "util/name_table.hpp"

#include <nlohmann/json.hpp>

namespace modeld::wire {
namespace {

using nlohmann::json;

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

json files_json(const std::vector<FileProgress>& files) {
  auto out = json::array();
  for (const auto& f : files)
    out.push_back({{"path", f.path},
                   {"bytes_done", f.bytes_done},
                   {"bytes_total", f.bytes_total},
                   {"rate_bytes_per_s", f.rate_bytes_per_s},
                   {"eta_s", util::or_null(f.eta_s)},
                   {"connections", f.connections}});
  return out;
}

FileProgress file_from_json(const json& j) {
  FileProgress f;
  f.path = j.at("path").get<std::string>();
  f.bytes_done = j.at("bytes_done").get<std::uint64_t>();
  f.bytes_total = j.at("bytes_total").get<std::uint64_t>();
  f.rate_bytes_per_s = j.at("rate_bytes_per_s").get<double>();
  if (!j.at("eta_s").is_null()) f.eta_s = j["eta_s"].get<double>();
  f.connections = j.value("connections", 0u);
  return f;
}

json benchmark_json(const Record& r) {
  if (!r.benchmark_ttft_s) return nullptr;
  return {{"ttft_s", *r.benchmark_ttft_s}, {"decode_tokens_per_s", r.benchmark_decode_tokens_per_s.value_or(0)}};
}

// The fields of a DEPLOYMENT that every record has: the parts that may be missing are read by
// read_optional().
void read_required(const json& j, Record& r) {
  r.id = j.at("id").get<std::string>();
  r.model = j.at("model").get<std::string>();
  if (!j.at("commit").is_null()) r.commit = j.at("commit").get<std::string>();
  r.progress = progress_from_json(j.at("progress"));
  if (!j.at("error").is_null()) r.error = error_from_json(j["error"]);
  r.started_at = j.at("started_at").get<std::string>();
  if (!j.at("finished_at").is_null()) r.finished_at = j.at("finished_at").get<std::string>();
}

void read_optional(const json& j, Record& r) {
  r.allow_downtime = j.value("allow_downtime", false);
  r.changed = j.value("changed", true);
  if (j.contains("benchmark") && !j["benchmark"].is_null()) {
    r.benchmark_ttft_s = j["benchmark"].at("ttft_s").get<double>();
    r.benchmark_decode_tokens_per_s = j["benchmark"].at("decode_tokens_per_s").get<double>();
  }
  if (j.contains("warm")) r.warm = warm_from_json(j["warm"]);
  if (j.contains("switch")) r.switch_report = switch_from_json(j["switch"]);
}

}  // namespace

std::string_view to_string(Kind k) noexcept { return util::name_in(kKinds, k).value_or("unknown"); }
std::optional<Kind> kind_from_string(std::string_view s) noexcept { return util::value_in(kKinds, s); }
std::string_view to_string(Phase p) noexcept { return util::name_in(kPhases, p).value_or("unknown"); }
std::string_view to_string(State s) noexcept { return util::name_in(kStates, s).value_or("unknown"); }
std::optional<Phase> phase_from_string(std::string_view s) noexcept { return util::value_in(kPhases, s); }
std::optional<State> state_from_string(std::string_view s) noexcept { return util::value_in(kStates, s); }

json to_json(const Error& e) { return {{"code", std::string(modeld::to_string(e.code))}, {"message", e.message}}; }

json to_json(const Progress& p) {
  return {{"bytes_done", p.bytes_done},
          {"bytes_total", p.bytes_total},
          {"files_done", p.files_done},
          {"files_total", p.files_total},
          {"rate_bytes_per_s", p.rate_bytes_per_s},
          {"eta_s", util::or_null(p.eta_s)},
          {"files", files_json(p.files)}};
}

json to_json(const WarmReport& w) {
  return {{"bytes_total", w.bytes_total},
          {"bytes_resident_before", w.bytes_resident_before},
          {"bytes_warmed", w.bytes_warmed},
          {"bytes_resident_at_launch", util::or_null(w.bytes_resident_at_launch)}};
}

json to_json(const SwitchReport& s) {
  return {{"downtime_s", s.downtime_s},
          {"stop_s", s.stop_s},
          {"launch_s", s.launch_s},
          {"start_to_port_s", s.start_to_port_s},
          {"port_to_ready_s", s.port_to_ready_s}};
}

json to_json(const Record& r) {
  return {
      {"id", r.id},
      {"kind", std::string(to_string(r.kind))},
      {"model", r.model},
      {"commit", util::or_null(r.commit)},
      {"allow_downtime", r.allow_downtime},
      {"changed", r.changed},
      {"phase", std::string(to_string(r.phase))},
      {"state", std::string(to_string(r.state))},
      {"progress", to_json(r.progress)},
      {"error", r.error ? to_json(*r.error) : json(nullptr)},
      {"started_at", r.started_at},
      {"finished_at", util::or_null(r.finished_at)},
      {"benchmark", benchmark_json(r)},
      {"warm", r.warm ? to_json(*r.warm) : json(nullptr)},
      {"switch", r.switch_report ? to_json(*r.switch_report) : json(nullptr)},
  };
}

Error error_from_json(const json& j) {
  return Error{errc_from_string(j.at("code").get<std::string>()), j.at("message").get<std::string>()};
}

Progress progress_from_json(const json& j) {
  Progress p;
  p.bytes_done = j.at("bytes_done").get<std::uint64_t>();
  p.bytes_total = j.at("bytes_total").get<std::uint64_t>();
  p.files_done = j.at("files_done").get<unsigned>();
  p.files_total = j.at("files_total").get<unsigned>();
  p.rate_bytes_per_s = j.at("rate_bytes_per_s").get<double>();
  if (!j.at("eta_s").is_null()) p.eta_s = j.at("eta_s").get<double>();
  if (j.contains("files"))
    for (const auto& f : j["files"]) p.files.push_back(file_from_json(f));
  return p;
}

std::optional<WarmReport> warm_from_json(const json& j) {
  if (j.is_null()) return std::nullopt;
  WarmReport w;
  w.bytes_total = j.at("bytes_total").get<std::uint64_t>();
  w.bytes_resident_before = j.at("bytes_resident_before").get<std::uint64_t>();
  w.bytes_warmed = j.at("bytes_warmed").get<std::uint64_t>();
  if (!j.at("bytes_resident_at_launch").is_null())
    w.bytes_resident_at_launch = j["bytes_resident_at_launch"].get<std::uint64_t>();
  return w;
}

std::optional<SwitchReport> switch_from_json(const json& j) {
  if (j.is_null()) return std::nullopt;
  return SwitchReport{j.at("downtime_s").get<double>(), j.at("stop_s").get<double>(), j.at("launch_s").get<double>(),
                      j.at("start_to_port_s").get<double>(), j.at("port_to_ready_s").get<double>()};
}

Result<Record> record_from_json(const json& j) {
  try {
    Record r;
    read_required(j, r);
    auto phase = phase_from_string(j.at("phase").get<std::string>());
    auto state = state_from_string(j.at("state").get<std::string>());
    if (!phase || !state) return make_error(Errc::bad_request, "deployment record: unknown phase or state");
    r.phase = *phase;
    r.state = *state;
    auto kind = kind_from_string(j.value("kind", std::string("deploy")));
    if (!kind) return make_error(Errc::bad_request, "deployment record: unknown kind " + j["kind"].dump());
    r.kind = *kind;
    read_optional(j, r);
    return r;
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
}

}  // namespace modeld::wire
