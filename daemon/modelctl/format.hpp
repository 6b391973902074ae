#pragma once
// modelctl's human output: the API's JSON turned into the lines and tables a person reads.

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace modelctl {

/// Whether and how to decorate output: colors only on a terminal and without $NO_COLOR.
struct Style {
  bool color = false;

  /// `text` in the color that fits a state word ("succeeded" green, "failed" red, ...).
  std::string state(const std::string& text) const;
  /// `text` in bold.
  std::string bold(const std::string& text) const;
};

/// The first 12 characters of a commit, or "-" when null.
std::string short_commit(const nlohmann::json& commit);

/// A DEPLOYMENT's progress as "37% of 547.0 GB at 1.2 GB/s, 4 min left"; empty when there is
/// nothing to download yet.
std::string progress_line(const nlohmann::json& progress);

/// The body of GET /v1/status as several lines (daemon, active model, deployment).
std::string status_text(const nlohmann::json& status, const Style& style);

/// The body of GET /v1/models as an aligned table with a header row.
std::string models_table(const nlohmann::json& models, const Style& style);

/// The body of GET /v1/models/{name}/plan as a short table: files and bytes to fetch, local,
/// partial, free, reserve, evictions, "fits" or "does not fit by X" (with bytes needed and
/// available), and whether rollback stays possible.
std::string plan_text(const nlohmann::json& plan, const Style& style);

/// The body of POST /v1/models/{name}/verify: one summary line, then one line per problem.
std::string verify_text(const nlohmann::json& report, const Style& style);

/// The body of DELETE /v1/models/{name} as one line.
std::string removal_text(const nlohmann::json& removal);

}  // namespace modelctl
