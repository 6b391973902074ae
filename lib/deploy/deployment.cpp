#include "deploy/deployment.hpp"

#include "util/json.hpp"
#include "util/name_table.hpp"

#include <nlohmann/json.hpp>


namespace modeld::deploy {
namespace {

constexpr util::NameTable<Phase, 9> kPhases{{
    {Phase::planning, "planning"},
    {Phase::freeing_disk, "freeing_disk"},
    {Phase::downloading, "downloading"},
    {Phase::verifying, "verifying"},
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


}  // namespace

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

}  // namespace

nlohmann::json to_json(const Progress& p) {
  return {{"bytes_done", p.bytes_done},
          {"bytes_total", p.bytes_total},
          {"files_done", p.files_done},
          {"files_total", p.files_total},
          {"rate_bytes_per_s", p.rate_bytes_per_s},
          {"eta_s", util::or_null(p.eta_s)},
          {"files", files_json(p.files)}};
}

nlohmann::json to_json(const Deployment& d, bool internal) {
  nlohmann::json j{
      {"id", d.id},
      {"model", d.model},
      {"commit", util::or_null(d.commit)},
      {"allow_downtime", d.allow_downtime},
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
  };
  if (internal) {
    j["previous_model"] = util::or_null(d.previous_model);
    j["previous_commit"] = util::or_null(d.previous_commit);
    j["old_stopped"] = d.old_stopped;
    j["downtime_first"] = d.downtime_first;
    j["cancel_requested"] = d.cancel_requested;
    j["kind"] = "deploy";
    j["cleanup_begun"] = d.cleanup_begun;
    j["started_ns"] = d.started_ns;
  }
  return j;
}

Result<Deployment> deployment_from_json(const nlohmann::json& j) {
  try {
    Deployment d;
    d.id = j.at("id").get<std::string>();
    d.model = j.at("model").get<std::string>();
    if (!j.at("commit").is_null()) d.commit = j.at("commit").get<std::string>();
    d.allow_downtime = j.value("allow_downtime", false);
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
    if (j.contains("previous_model") && !j["previous_model"].is_null())
      d.previous_model = j["previous_model"].get<std::string>();
    if (j.contains("previous_commit") && !j["previous_commit"].is_null())
      d.previous_commit = j["previous_commit"].get<std::string>();
    d.old_stopped = j.value("old_stopped", false);
    d.downtime_first = j.value("downtime_first", false);
    d.cancel_requested = j.value("cancel_requested", false);
    if (j.value("kind", std::string("deploy")) != "deploy")
      return make_error(Errc::bad_request, "deployment record: unknown kind " + j["kind"].dump());
    d.cleanup_begun = j.value("cleanup_begun", false);
    d.started_ns = j.value("started_ns", std::int64_t{0});
    return d;
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
}

}  // namespace modeld::deploy
