#include "deploy/record_file.hpp"

#include <nlohmann/json.hpp>

namespace modeld::deploy {
namespace {

using nlohmann::json;

json marks_json(const SwitchMarks& m) {
  return {{"stop_requested_ns", m.stop_requested_ns},
          {"stop_done_ns", m.stop_done_ns},
          {"start_requested_ns", m.start_requested_ns},
          {"port_ns", m.port_ns},
          {"ready_ns", m.ready_ns}};
}

SwitchMarks marks_from_json(const json& j) {
  SwitchMarks m;
  m.stop_requested_ns = j.value("stop_requested_ns", std::int64_t{0});
  m.stop_done_ns = j.value("stop_done_ns", std::int64_t{0});
  m.start_requested_ns = j.value("start_requested_ns", std::int64_t{0});
  m.port_ns = j.value("port_ns", std::int64_t{0});
  m.ready_ns = j.value("ready_ns", std::int64_t{0});
  return m;
}

// The services a record stops: "previous", or in a record written before the list, the one of
// "previous_model", "previous_commit" and "previous_started".
void read_previous(const json& j, Deployment& d) {
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

// The bookkeeping fields of `j` into `d`; throws nlohmann::json::exception on a mistyped one.
void read_bookkeeping(const json& j, Deployment& d) {
  read_previous(j, d);
  d.old_stopped = j.value("old_stopped", false);
  d.downtime_first = j.value("downtime_first", false);
  d.cancel_requested = j.value("cancel_requested", false);
  d.cleanup_begun = j.value("cleanup_begun", false);
  d.started_ns = j.value("started_ns", std::int64_t{0});
  if (j.contains("switch_marks")) d.switch_marks = marks_from_json(j["switch_marks"]);
  d.restart = j.value("restart", false);
  d.end_unlogged = j.value("end_unlogged", false);
}

}  // namespace

json record_file_json(const Deployment& d) {
  json j = wire::to_json(static_cast<const wire::Record&>(d));
  j["previous"] = json::array();
  for (const auto& a : d.previous) j["previous"].push_back(to_json(a));
  j["old_stopped"] = d.old_stopped;
  j["downtime_first"] = d.downtime_first;
  j["cancel_requested"] = d.cancel_requested;
  j["cleanup_begun"] = d.cleanup_begun;
  j["started_ns"] = d.started_ns;
  j["switch_marks"] = marks_json(d.switch_marks);
  j["restart"] = d.restart;
  if (d.end_unlogged) j["end_unlogged"] = true;
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
    read_bookkeeping(j, d);
  } catch (const json::exception& e) {
    return make_error(Errc::bad_request, std::string("deployment record: ") + e.what());
  }
  return d;
}

}  // namespace modeld::deploy
