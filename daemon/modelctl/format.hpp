#pragma once
// modelctl's human output: the API's answers, read into lib/wire's types, turned into the lines
// and tables a person reads.

#include "wire/models.hpp"
#include "wire/record.hpp"
#include "wire/status.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace modelctl {

/// Whether and how to decorate output: colors only on a terminal and without $NO_COLOR.
struct Style {
  bool color = false;

  /// `text` in the color that fits a state word ("succeeded" green, "failed" red, ...).
  std::string state(const std::string& text) const;
  /// `text` in bold.
  std::string bold(const std::string& text) const;
};

/// The string at `key` of the JSON object `j` through esc(), or `fallback` when `j` is not an
/// object or the value is missing or not a string (an error answer's message).
std::string str(const nlohmann::json& j, const char* key, std::string fallback = "-");

/// A string of an answer as modelctl prints it: control characters escaped
/// (modeld::util::escape_control: a file name or a Hub's message cannot add a line or drive the
/// terminal). Every API string modelctl prints goes through here.
std::string esc(const std::string& text);

/// An optional string of an answer through esc(), or `fallback` when it is null.
std::string esc_or(const std::optional<std::string>& text, const std::string& fallback = "-");

/// The first 12 characters of a commit, through esc().
std::string short_commit(const std::string& commit);
/// The first 12 characters of a commit through esc(), or "-" when null.
std::string short_commit(const std::optional<std::string>& commit);

/// A GPU set as modelctl shows it: "all" for null (every GPU), "none" for an empty set, else
/// the indices sorted with runs joined ("0-3", "0,2,4-7").
std::string gpu_text(const std::optional<std::vector<unsigned>>& gpu_ids);

/// How a record is named before its id: "" for a deployment (kind deploy), else its kind and a
/// space ("pull ", "stop ").
std::string kind_prefix(const modeld::wire::Record& deployment);

/// A DEPLOYMENT's progress as "37% of 547 GB at 1.2 GB/s, 4 min left"; empty when there is
/// nothing to download yet.
std::string progress_line(const modeld::wire::Progress& progress);
/// One file's progress as progress_line() writes the whole download's; empty when its size is 0.
std::string progress_line(const modeld::wire::FileProgress& file);

/// progress_line() followed by the file count: "37% of 547 GB at 1.2 GB/s, 4 min left (3 of 64
/// files)"; empty when there is nothing to download yet.
std::string progress_summary(const modeld::wire::Progress& progress);

/// Whether a progress says every byte is there (the last update of a download).
bool progress_complete(const modeld::wire::Progress& progress);

/// A bar of `width` cells (brackets included) filled in proportion to done/total, e.g.
/// "[=======>      ]"; all empty when total is 0.
std::string progress_bar(std::uint64_t done, std::uint64_t total, std::size_t width);

/// `line` cut to at most `columns` visible characters (escape sequences kept, a color reset
/// added when a colored part is cut); unchanged when `columns` is 0.
std::string fit_width(const std::string& line, std::size_t columns);

/// A DEPLOYMENT's progress as the lines of a live view on a terminal `columns` wide: the whole
/// download with a bar and progress_summary(), then each file in flight with its own bar, rate
/// and ETA (at most `max_files`, then "... and N more"). Empty when nothing is to download.
/// The text after each bar is progress_line()'s, as deploy --wait prints it without a terminal.
std::vector<std::string> progress_lines(const modeld::wire::Progress& progress, std::size_t columns,
                                        std::size_t max_files = 16);

/// A DEPLOYMENT's "switch" as "downtime 2 min 12 s: stop 4.0 s, launch 1.0 s, load 2 min 2 s,
/// readiness 5.0 s" (modeld::wire::describe_switch); empty when it is null.
std::string switch_text(const modeld::wire::Record& deployment);

/// A DEPLOYMENT as the lines of a live view (modelctl watch on a terminal): id, model, commit,
/// then while it runs its phase and progress_lines(), once it ended its result and last phase
/// (headed "Last deployment:"); the error, start ("-" when unknown) and end times.
std::vector<std::string> deployment_lines(const modeld::wire::Record& deployment, const Style& style,
                                          std::size_t columns);

/// GET /v1/status "services" in one line, "a (port 8000, GPUs 0-3), b (port 8001, GPUs 4-7)", in
/// the order put into service; empty when fewer than two serve (the active model says it all).
std::string services_line(const std::vector<modeld::wire::ServiceInfo>& services);

/// The body of GET /v1/status as several lines: daemon, the active model (with its GPUs and its
/// watchdog), a table of every service when more than one serves, and the deployment.
std::string status_text(const modeld::wire::Status& status, const Style& style);

/// The body of GET /v1/models as an aligned table with a header row.
std::string models_table(const std::vector<modeld::wire::ModelInfo>& models, const Style& style);

/// The body of GET /v1/models/{name}/plan as a short table: files and bytes to fetch, local,
/// partial, free, reserve, evictions, "fits" or "does not fit by X" (with bytes needed and
/// available), the pre-flight (a "Pre-flight:" block, one "ok"/"FAILED" line per check), and
/// whether rollback stays possible.
std::string plan_text(const modeld::wire::PlanReport& plan, const Style& style);

/// Whether every pre-flight check of a plan passed (true for a plan without "preflight").
bool preflight_passed(const modeld::wire::PlanReport& plan);

/// The body of POST /v1/models/{name}/verify: one summary line, then one line per problem.
std::string verify_text(const modeld::wire::VerifyReport& report, const Style& style);

/// The body of DELETE /v1/models/{name} as one line.
std::string removal_text(const modeld::wire::Removal& removal);

}  // namespace modelctl
