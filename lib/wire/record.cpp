#include "wire/record.hpp"

#include "util/name_table.hpp"
#include "wire/fields.hpp"

#include <nlohmann/json.hpp>

namespace modeld {

// The API's error object {"code", "message"}, its code by its stable name (an unknown one reads
// as Errc::internal). In namespace modeld, beside Error, for argument-dependent lookup.
template <wire::detail::either<Error> S, class F>
void fields(S& e, F&& f) {
  f("code",
    wire::detail::via<std::string>(
        e.code, [](Errc c) { return std::string(to_string(c)); },
        [](const std::string& name, Errc& c) { c = errc_from_string(name); }),
    wire::detail::required);
  f("message", e.message, wire::detail::required);
}

}  // namespace modeld

namespace modeld::wire {
namespace {

using nlohmann::json;

using detail::either;
using detail::named;
using detail::required;

// `j` read as T with detail::read; throws nlohmann::json::exception naming what is wrong.
template <class T>
T read_as(const json& j) {
  T v{};
  detail::read(j, v);
  return v;
}

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

// The API's "benchmark" object, which Record keeps as two optionals.
struct Benchmark {
  double ttft_s = 0;
  double decode_tokens_per_s = 0;
};

template <either<Benchmark> S, class F>
void fields(S& b, F&& f) {
  f("ttft_s", b.ttft_s, required);
  f("decode_tokens_per_s", b.decode_tokens_per_s, required);
}

// The "benchmark" of `r`: null until a benchmark ran (its TTFT is known).
std::optional<Benchmark> benchmark_of(const Record& r) {
  if (!r.benchmark_ttft_s) return std::nullopt;
  return Benchmark{*r.benchmark_ttft_s, r.benchmark_decode_tokens_per_s.value_or(0)};
}

void set_benchmark(const std::optional<Benchmark>& b, Record& r) {
  r.benchmark_ttft_s = b ? std::optional(b->ttft_s) : std::nullopt;
  r.benchmark_decode_tokens_per_s = b ? std::optional(b->decode_tokens_per_s) : std::nullopt;
}

}  // namespace

// A file in flight; "connections" may be missing (records of older daemons).
template <either<FileProgress> S, class F>
void fields(S& p, F&& f) {
  f("path", p.path, required);
  f("bytes_done", p.bytes_done, required);
  f("bytes_total", p.bytes_total, required);
  f("rate_bytes_per_s", p.rate_bytes_per_s, required);
  f("eta_s", p.eta_s, required);
  f("connections", p.connections);
}

// "files" may be missing (records on disk need not keep it).
template <either<Progress> S, class F>
void fields(S& p, F&& f) {
  f("bytes_done", p.bytes_done, required);
  f("bytes_total", p.bytes_total, required);
  f("files_done", p.files_done, required);
  f("files_total", p.files_total, required);
  f("rate_bytes_per_s", p.rate_bytes_per_s, required);
  f("eta_s", p.eta_s, required);
  f("files", p.files);
}

template <either<WarmReport> S, class F>
void fields(S& w, F&& f) {
  f("bytes_total", w.bytes_total, required);
  f("bytes_resident_before", w.bytes_resident_before, required);
  f("bytes_warmed", w.bytes_warmed, required);
  f("bytes_resident_at_launch", w.bytes_resident_at_launch, required);
}

template <either<SwitchReport> S, class F>
void fields(S& s, F&& f) {
  f("downtime_s", s.downtime_s, required);
  f("stop_s", s.stop_s, required);
  f("launch_s", s.launch_s, required);
  f("start_to_port_s", s.start_to_port_s, required);
  f("port_to_ready_s", s.port_to_ready_s, required);
}

// DEPLOYMENT; "kind", "allow_downtime", "changed", "benchmark", "warm" and "switch" may be
// missing, as in records of older daemons.
template <either<Record> S, class F>
void fields(S& r, F&& f) {
  f("id", r.id, required);
  f("kind", named(r.kind, kKinds, "kind"));
  f("model", r.model, required);
  f("commit", r.commit, required);
  f("allow_downtime", r.allow_downtime);
  f("changed", r.changed);
  f("phase", named(r.phase, kPhases, "phase"), required);
  f("state", named(r.state, kStates, "state"), required);
  f("progress", r.progress, required);
  f("error", r.error, required);
  f("started_at", r.started_at, required);
  f("finished_at", r.finished_at, required);
  f("benchmark", detail::via<std::optional<Benchmark>>(r, benchmark_of, set_benchmark));
  f("warm", r.warm);
  f("switch", r.switch_report);
}

std::string_view to_string(Kind k) noexcept { return util::name_in(kKinds, k).value_or("unknown"); }
std::optional<Kind> kind_from_string(std::string_view s) noexcept { return util::value_in(kKinds, s); }
std::string_view to_string(Phase p) noexcept { return util::name_in(kPhases, p).value_or("unknown"); }
std::string_view to_string(State s) noexcept { return util::name_in(kStates, s).value_or("unknown"); }
std::optional<Phase> phase_from_string(std::string_view s) noexcept { return util::value_in(kPhases, s); }
std::optional<State> state_from_string(std::string_view s) noexcept { return util::value_in(kStates, s); }

json to_json(const Error& e) { return detail::write(e); }
json to_json(const Progress& p) { return detail::write(p); }
json to_json(const WarmReport& w) { return detail::write(w); }
json to_json(const SwitchReport& s) { return detail::write(s); }
json to_json(const Record& r) { return detail::write(r); }

Error error_from_json(const json& j) { return read_as<Error>(j); }
Progress progress_from_json(const json& j) { return read_as<Progress>(j); }
std::optional<WarmReport> warm_from_json(const json& j) { return read_as<std::optional<WarmReport>>(j); }
std::optional<SwitchReport> switch_from_json(const json& j) { return read_as<std::optional<SwitchReport>>(j); }

Result<Record> record_from_json(const json& j) {
  try {
    return read_as<Record>(j);
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
}

Result<std::vector<Record>> deployments_from_json(const json& j) {
  if (!j.is_object() || !j.contains("deployments") || !j["deployments"].is_array())
    return make_error(Errc::bad_request, "deployments: expected an object with an array \"deployments\"");
  std::vector<Record> out;
  for (const auto& d : j["deployments"]) {
    auto r = record_from_json(d);
    if (!r) return r.error();
    out.push_back(std::move(*r));
  }
  return out;
}

}  // namespace modeld::wire
