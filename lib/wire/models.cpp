#include "wire/models.hpp"

#include "wire/fields.hpp"

#include <concepts>

namespace modeld::wire {
namespace {

using nlohmann::json;

using detail::either;

// Reads `j` as T with detail::read, or bad_request "WHAT: ..." on a mistyped or missing value.
template <class T>
Result<T> read_as(const json& j, const char* what) {
  try {
    T v{};
    detail::read(j, v);
    return v;
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string(what) + ": " + e.what());
  }
}

}  // namespace

template <either<RevisionInfo> S, class F>
void fields(S& r, F&& f) {
  f("commit", r.commit);
  f("state", r.state);
  f("pulled", r.pulled);
  f("in_service", r.in_service);
}

template <either<ModelInfo> S, class F>
void fields(S& m, F&& f) {
  f("name", m.name);
  f("repo", m.repo);
  f("revision", m.revision);
  f("commit", m.commit);
  f("state", m.state);
  f("size_bytes", m.size_bytes);
  f("active", m.active);
  f("pinned", m.pinned);
  f("last_active", m.last_active);
  f("revisions", m.revisions);
}

template <either<PlannedEviction> S, class F>
void fields(S& e, F&& f) {
  f("name", e.name);
  f("bytes", e.bytes);
  f("last_active", e.last_active);
  f("active", e.active);
}

template <either<PreflightCheck> S, class F>
void fields(S& c, F&& f) {
  f("check", c.check);
  f("ok", c.ok);
  f("message", c.message);
}

// The plan's sizes and counts, in bytes and files.
template <either<PlanReport> S, class F>
void size_fields(S& p, F&& f) {
  f("files_total", p.files_total);
  f("bytes_total", p.bytes_total);
  f("files_to_fetch", p.files_to_fetch);
  f("bytes_to_fetch", p.bytes_to_fetch);
  f("bytes_local", p.bytes_local);
  f("bytes_linkable", p.bytes_linkable);
  f("bytes_partial", p.bytes_partial);
  f("files_adoptable", p.files_adoptable);
  f("bytes_adoptable", p.bytes_adoptable);
  f("bytes_needed", p.bytes_needed);
  f("bytes_free", p.bytes_free);
  f("disk_reserve", p.disk_reserve);
  f("shortfall_bytes", p.shortfall_bytes);
}

template <either<PlanReport> S, class F>
void fields(S& p, F&& f) {
  f("model", p.model);
  f("repo", p.repo);
  f("revision", p.revision);
  f("commit", p.commit);
  f("already_serving", p.already_serving);
  f("verified", p.verified);
  size_fields(p, f);
  f("adopt_from", p.adopt_from);
  f("evictions", p.evictions);
  f("fits", p.fits);
  f("allow_downtime", p.allow_downtime);
  f("active_model", p.active_model);
  f("stops", p.stops);
  f("rollback_possible", p.rollback_possible);
  f("warming", p.warming);
  f("fits_with_allow_downtime", p.fits_with_allow_downtime);
  f("preflight", p.preflight);
}

// A problem's "tensor" is null when it is not about one tensor (VerifyProblem::tensor empty):
// written and read beside these.
template <either<VerifyProblem> S, class F>
void fields(S& p, F&& f) {
  f("code", p.code);
  f("file", p.file);
  f("message", p.message);
}

// A report's "ok" is computed (VerifyReport::ok()) and its problems carry "tensor": both are
// written and read beside these.
template <either<VerifyReport> S, class F>
void fields(S& r, F&& f) {
  f("model", r.model);
  f("commit", r.commit);
  f("files", r.files);
  f("bytes", r.bytes);
}

template <either<Removal> S, class F>
void fields(S& r, F&& f) {
  f("model", r.model);
  f("bytes_freed", r.bytes_freed);
  f("commits", r.commits);
}

json models_json(const std::vector<ModelInfo>& models) { return json{{"models", detail::write(models)}}; }

json to_json(const PlanReport& plan) { return detail::write(plan); }

json to_json(const VerifyReport& report) {
  json j = detail::write(report);
  j["ok"] = report.ok();
  j["problems"] = json::array();
  for (const auto& p : report.problems) {
    json problem = detail::write(p);
    problem["tensor"] = p.tensor.empty() ? json(nullptr) : json(p.tensor);
    j["problems"].push_back(std::move(problem));
  }
  return j;
}

json to_json(const Removal& removal) { return detail::write(removal); }

Result<std::vector<ModelInfo>> models_from_json(const json& j) {
  if (!j.is_object() || !j.contains("models")) return make_error(Errc::bad_request, "models: no \"models\" list");
  return read_as<std::vector<ModelInfo>>(j["models"], "models");
}

Result<PlanReport> plan_from_json(const json& j) { return read_as<PlanReport>(j, "plan"); }

Result<VerifyReport> verify_from_json(const json& j) {
  auto r = read_as<VerifyReport>(j, "verify");
  if (!r || !j.contains("problems")) return r;
  try {
    for (const auto& p : j["problems"]) {
      auto& problem = r->problems.emplace_back();
      detail::read(p, problem);
      if (p.contains("tensor") && !p["tensor"].is_null()) problem.tensor = p["tensor"].get<std::string>();
    }
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string("verify: ") + e.what());
  }
  return r;
}

Result<Removal> removal_from_json(const json& j) { return read_as<Removal>(j, "rm"); }

}  // namespace modeld::wire
