#pragma once
// The on-disk form of a deployment record (state_dir/deployments/ID.json): the API's DEPLOYMENT
// fields (wire::to_json) and the daemon's bookkeeping beside them. Its own format, apart from the
// API's: a record written by any earlier modeld still loads. No I/O here (StateStore writes it).

#include "deploy/deployment.hpp"
#include "util/error.hpp"

#include <nlohmann/json_fwd.hpp>

namespace modeld::deploy {

/// The JSON written to state_dir for `d`: every API field, then "previous", "old_stopped",
/// "downtime_first", "cancel_requested", "cleanup_begun", "started_ns", "switch_marks",
/// "restart" and, only while set, "end_unlogged", "switch_method" and "switch_fallback". Pure.
nlohmann::json record_file_json(const Deployment& d);

/// Reads what record_file_json() wrote, also as older daemons wrote it (no "kind", a single
/// "previous_model" instead of "previous", no marks); the files in flight are not kept. Returns
/// bad_request "deployment record: ..." naming the field on a malformed object; never throws.
Result<Deployment> record_from_file_json(const nlohmann::json& j);

}  // namespace modeld::deploy
