#include "deploy/record_file.hpp"

#include "wire/fields.hpp"

#include <nlohmann/json.hpp>

namespace modeld::deploy {

using nlohmann::json;
using wire::detail::either;

// Each mark may be missing (0): records of older daemons have none.
template <either<SwitchMarks> S, class F>
void fields(S& m, F&& f) {
  f("stop_requested_ns", m.stop_requested_ns);
  f("stop_done_ns", m.stop_done_ns);
  f("start_requested_ns", m.start_requested_ns);
  f("port_ns", m.port_ns);
  f("ready_ns", m.ready_ns);
}

namespace {

// The bookkeeping of a Deployment (D: const while writing), beside its API fields in the file.
template <class D>
struct Bookkeeping {
  D& d;
};

json previous_json(const std::vector<ActiveRecord>& previous) {
  auto out = json::array();
  for (const auto& a : previous) out.push_back(to_json(a));
  return out;
}

void set_previous(const json& j, std::vector<ActiveRecord>& previous) {
  previous.clear();
  for (const auto& a : j) previous.push_back(active_record_from_json(a));
}

// Every field may be missing (false or 0), as in records of older daemons; "end_unlogged" is
// written only while set.
template <class D, class F>
void fields(const Bookkeeping<D>& b, F&& f) {
  f("previous", wire::detail::via<json>(b.d.previous, previous_json, set_previous));
  f("old_stopped", b.d.old_stopped);
  f("downtime_first", b.d.downtime_first);
  f("cancel_requested", b.d.cancel_requested);
  f("cleanup_begun", b.d.cleanup_begun);
  f("started_ns", b.d.started_ns);
  f("switch_marks", b.d.switch_marks);
  f("restart", b.d.restart);
  f("end_unlogged", b.d.end_unlogged, wire::detail::when_set);
  f("switch_method", b.d.switch_method, wire::detail::when_set);
  f("switch_fallback", b.d.switch_fallback, wire::detail::when_set);
}

// A record written before the list "previous": the one service of "previous_model",
// "previous_commit" and "previous_started", if any.
void read_single_previous(const json& j, Deployment& d) {
  if (!j.contains("previous_model") || j["previous_model"].is_null() || !j.contains("previous_commit") ||
      j["previous_commit"].is_null())
    return;
  ActiveRecord a{j["previous_model"].get<std::string>(), j["previous_commit"].get<std::string>(), ""};
  if (j.contains("previous_started") && j["previous_started"].is_object())
    if (auto st = started_settings_from_json(j["previous_started"])) a.started = std::move(*st);
  d.previous.push_back(std::move(a));
}

}  // namespace

json record_file_json(const Deployment& d) {
  json j = wire::to_json(static_cast<const wire::Record&>(d));
  j.update(wire::detail::write(Bookkeeping<const Deployment>{d}));
  return j;
}

Result<Deployment> record_from_file_json(const json& j) {
  auto record = wire::record_from_json(j);
  if (!record) return record.error();
  Deployment d;
  static_cast<wire::Record&>(d) = std::move(*record);
  // The files in flight belong to the download of the process that wrote the record.
  d.progress.files.clear();
  try {
    Bookkeeping<Deployment> bookkeeping{d};
    wire::detail::read(j, bookkeeping);
    if (!j.contains("previous")) read_single_previous(j, d);
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
  return d;
}

}  // namespace modeld::deploy
