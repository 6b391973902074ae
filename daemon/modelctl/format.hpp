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

}  // namespace modelctl
