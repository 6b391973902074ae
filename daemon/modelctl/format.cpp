// modelctl's human output. Missing or mistyped fields print as "-" rather than failing: a
// newer or older daemon may differ, and status output must not be what breaks.

#include "modelctl/format.hpp"

#include "util/text.hpp"
#include "util/quantities.hpp"
#include "wire/switch_report.hpp"
#include "wire/models.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace modelctl {
namespace {

using nlohmann::json;

std::uint64_t uint(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<std::uint64_t>();
}

double num(const json& j, const char* key, double fallback = 0) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return fallback;
  return j[key].get<double>();
}

// Visible width of UTF-8 text without escape sequences (the table pads colored cells).
std::size_t width(const std::string& s) {
  std::size_t w = 0;
  bool escape = false;
  for (unsigned char c : s) {
    if (escape) {
      if (c == 'm') escape = false;
      continue;
    }
    if (c == 0x1b) {
      escape = true;
      continue;
    }
    if ((c & 0xc0) != 0x80) ++w;
  }
  return w;
}

}  // namespace

std::string str(const json& j, const char* key, std::string fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return fallback;
  return modeld::util::escape_control(j[key].get_ref<const std::string&>());
}

std::string Style::state(const std::string& text) const {
  if (!color) return text;
  const char* code = nullptr;
  if (text == "succeeded" || text == "verified") code = "32";
  else if (text == "failed" || text == "corrupt" || text == "rolled_back") code = "31";
  else if (text == "running" || text == "partial" || text == "cancelled") code = "33";
  if (!code) return text;
  return fmt::format("\x1b[{}m{}\x1b[0m", code, text);
}

std::string Style::bold(const std::string& text) const {
  return color ? fmt::format("\x1b[1m{}\x1b[0m", text) : text;
}

std::string short_commit(const json& commit) {
  if (!commit.is_string()) return "-";
  return modeld::util::escape_control(commit.get_ref<const std::string&>().substr(0, 12));
}

std::string gpu_text(const json& ids) {
  if (ids.is_null()) return "all";
  if (!ids.is_array()) return "-";
  std::vector<std::uint64_t> v;
  for (const auto& i : ids) {
    if (!i.is_number_unsigned()) return "-";
    v.push_back(i.get<std::uint64_t>());
  }
  if (v.empty()) return "none";
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::vector<std::string> runs;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    runs.push_back(i == j ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(runs, ","));
}

std::string kind_prefix(const json& d) {
  const auto kind = str(d, "kind", "deploy");
  return kind == "deploy" ? std::string() : kind + " ";
}

std::string progress_line(const json& p) {
  const auto total = uint(p, "bytes_total");
  if (total == 0) return {};
  const auto done = std::min(uint(p, "bytes_done"), total);
  const auto percent = static_cast<unsigned>(done * 100 / total);
  std::string out = fmt::format("{}% of {}", percent, modeld::util::format_bytes(total));
  if (double rate = num(p, "rate_bytes_per_s"); rate > 0)
    out += " at " + modeld::util::format_rate(rate);
  if (p.is_object() && p.contains("eta_s") && p["eta_s"].is_number() && done < total) {
    auto eta = std::chrono::seconds(static_cast<long long>(std::ceil(p["eta_s"].get<double>())));
    out += ", " + modeld::util::format_duration(eta) + " left";
  }
  return out;
}

std::string progress_summary(const json& p) {
  auto text = progress_line(p);
  if (text.empty()) return text;
  return fmt::format("{} ({} of {} files)", text, uint(p, "files_done"), uint(p, "files_total"));
}

bool progress_complete(const json& p) { return uint(p, "bytes_done") >= uint(p, "bytes_total"); }

std::string progress_bar(std::uint64_t done, std::uint64_t total, std::size_t width) {
  if (width < 3) return {};
  const std::size_t cells = width - 2;
  std::size_t filled = total == 0 ? 0 : static_cast<std::size_t>(std::min(done, total) * cells / total);
  std::string out = "[";
  out.append(filled, '=');
  // The head shows where the bar moves; a full bar has none.
  if (filled < cells && filled > 0) {
    out.back() = '>';
  }
  out.append(cells - filled, ' ');
  out += ']';
  return out;
}

std::string fit_width(const std::string& line, std::size_t columns) {
  if (columns == 0 || width(line) <= columns) return line;
  std::string out;
  std::size_t w = 0;
  bool escape = false, colored = false;
  for (unsigned char c : line) {
    if (escape) {
      out += static_cast<char>(c);
      if (c == 'm') escape = false;
      continue;
    }
    if (c == 0x1b) {
      escape = colored = true;
      out += static_cast<char>(c);
      continue;
    }
    // Stop at the first character that no longer fits, never inside a UTF-8 sequence.
    if ((c & 0xc0) != 0x80 && w++ == columns) break;
    out += static_cast<char>(c);
  }
  if (colored) out += "\x1b[0m";
  return out;
}

namespace {

// A path at most `n` characters wide: its end is kept (shard numbers are there).
std::string elide_front(const std::string& path, std::size_t n) {
  if (width(path) <= n || n < 2) return path;
  std::size_t skip = width(path) - (n - 1), seen = 0, i = 0;
  for (; i < path.size(); ++i) {
    if ((static_cast<unsigned char>(path[i]) & 0xc0) != 0x80 && seen++ == skip) break;
  }
  return "\u2026" + path.substr(i);
}

std::string pad(const std::string& s, std::size_t n) {
  auto w = width(s);
  return w >= n ? s : s + std::string(n - w, ' ');
}

}  // namespace

std::vector<std::string> progress_lines(const json& p, std::size_t columns, std::size_t max_files) {
  std::vector<std::string> out;
  const auto text = progress_summary(p);
  if (text.empty()) return out;
  const std::size_t bar = std::clamp<std::size_t>(columns / 4, 12, 32);
  out.push_back(fmt::format("  {} {}", progress_bar(uint(p, "bytes_done"), uint(p, "bytes_total"), bar), text));
  if (!p.contains("files") || !p["files"].is_array()) return out;
  const auto& files = p["files"];
  std::size_t name_width = 0;
  for (const auto& f : files) name_width = std::max(name_width, width(str(f, "path")));
  name_width = std::min<std::size_t>(name_width, 40);
  std::size_t shown = 0;
  for (const auto& f : files) {
    if (shown == max_files) {
      out.push_back(fmt::format("    ... and {} more", files.size() - shown));
      break;
    }
    ++shown;
    std::string line = fmt::format("    {} {} {}", pad(elide_front(str(f, "path"), name_width), name_width),
                                   progress_bar(uint(f, "bytes_done"), uint(f, "bytes_total"), bar), progress_line(f));
    if (auto c = uint(f, "connections"); c > 1) line += fmt::format(" over {} connections", c);
    out.push_back(std::move(line));
  }
  return out;
}

std::string switch_text(const json& d) {
  const auto& s = d.is_object() ? d.value("switch", json()) : json();
  if (!s.is_object()) return "";
  return modeld::wire::describe_switch(num(s, "downtime_s"), num(s, "stop_s"), num(s, "launch_s"),
                                       num(s, "start_to_port_s"), num(s, "port_to_ready_s"));
}

std::vector<std::string> deployment_lines(const json& d, const Style& style, std::size_t columns) {
  std::vector<std::string> out;
  const auto state = str(d, "state");
  const bool running = state == "running";
  out.push_back(fmt::format("{} {}{} of {} (commit {})", running ? "Deployment: " : "Last deployment:", kind_prefix(d),
                            str(d, "id"), style.bold(str(d, "model")), short_commit(d.value("commit", json()))));
  if (running) {
    out.push_back(fmt::format("  Phase:     {}, {}", str(d, "phase"), style.state(state)));
    for (auto& line : progress_lines(d.value("progress", json()), columns)) out.push_back(std::move(line));
  } else {
    out.push_back(fmt::format("  Result:    {} in phase {}", style.state(state), str(d, "phase")));
  }
  if (const auto& e = d.value("error", json()); e.is_object())
    out.push_back(fmt::format("  Error:     {}: {}", str(e, "code"), str(e, "message")));
  if (auto s = switch_text(d); !s.empty()) out.push_back("  Switch:    " + s);
  out.push_back(fmt::format("  Started:   {}", str(d, "started_at")));
  if (auto f = str(d, "finished_at", ""); !f.empty()) out.push_back(fmt::format("  Finished:  {}", f));
  return out;
}

namespace {

// Rows aligned in columns two spaces apart, each line after `indent`.
std::string aligned(const std::vector<std::vector<std::string>>& rows, const std::string& indent = "") {
  std::vector<std::size_t> widths(rows.empty() ? 0 : rows[0].size(), 0);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size() && i < widths.size(); ++i) widths[i] = std::max(widths[i], width(r[i]));
  std::string out;
  for (const auto& r : rows) {
    std::string line = indent;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(widths[i] - width(r[i]) + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

// The entry of `model` in GET /v1/status "services", or null.
json service_of(const json& services, const std::string& model) {
  if (services.is_array())
    for (const auto& s : services)
      if (str(s, "model", "") == model) return s;
  return json();
}

// The "Active:" line: the model put into service last, with its GPUs when "services" has it.
std::string active_line(const json& status) {
  const auto& a = status.value("active", json());
  if (!a.is_object()) return "Active:      none\n";
  const auto service = service_of(status.value("services", json()), str(a, "model", ""));
  const std::string gpus = service.is_object() ? ", GPUs " + gpu_text(service.value("gpu_ids", json())) : "";
  return fmt::format("Active:      {} (commit {}), {} on port {}{}, since {}\n", str(a, "model"),
                     short_commit(a.value("commit", json())), str(a, "unit"), uint(a, "port"), gpus, str(a, "since"));
}

// A watchdog record as the "Watchdog:" line and, after a restart, a "Restarted:" line.
std::string watchdog_lines(const json& w) {
  if (!w.is_object()) return "";
  const auto restarts = uint(w, "restarts");
  std::string line = fmt::format("Watchdog:    {}, {} restart{}", str(w, "state"), restarts, restarts == 1 ? "" : "s");
  if (auto n = uint(w, "consecutive_failures"); n > 0)
    line += fmt::format(", {} failed probe{} in a row", n, n == 1 ? "" : "s");
  if (w.contains("last_probe_ok") && w["last_probe_ok"].is_boolean())
    line += fmt::format(", last probe {} at {}", w["last_probe_ok"].get<bool>() ? "ok" : "failed",
                        str(w, "last_probe_at"));
  std::string out = line + "\n";
  if (auto at = str(w, "last_restart_at", ""); !at.empty())
    out += fmt::format("  Restarted: {}: {}\n", at, str(w, "last_restart_reason"));
  return out;
}

// A service's watchdog in one table cell: "-" when not watched, else its state and restarts.
std::string watchdog_cell(const json& w) {
  if (!w.is_object()) return "-";
  std::string out = str(w, "state");
  if (auto n = uint(w, "restarts"); n > 0) out += fmt::format(", {} restart{}", n, n == 1 ? "" : "s");
  return out;
}

// Every service in a table, when more than one serves (one is the "Active:" line already).
std::string services_table(const json& services) {
  if (!services.is_array() || services.size() < 2) return "";
  std::vector<std::vector<std::string>> rows{{"MODEL", "COMMIT", "UNIT", "PORT", "GPUS", "SINCE", "WATCHDOG"}};
  for (const auto& s : services)
    rows.push_back({str(s, "model"), short_commit(s.value("commit", json())), str(s, "unit"),
                    std::to_string(uint(s, "port")), gpu_text(s.value("gpu_ids", json())), str(s, "since"),
                    watchdog_cell(s.value("watchdog", json()))});
  return fmt::format("Services:    {} in service (the last put into service is the active one)\n", services.size()) +
         aligned(rows, "  ");
}

// The deployment of GET /v1/status: its id (after its kind when it is no deploy), model, phase,
// state, progress, times, error, switch and benchmark.
std::string deployment_text(const json& d, const Style& style) {
  if (!d.is_object()) return "Deployment:  none\n";
  std::string out = fmt::format("Deployment:  {}{}\n", kind_prefix(d), str(d, "id"));
  out += fmt::format("  Model:     {} (commit {})\n", str(d, "model"), short_commit(d.value("commit", json())));
  out += fmt::format("  Phase:     {}\n", str(d, "phase"));
  out += fmt::format("  State:     {}\n", style.state(str(d, "state")));
  if (auto p = progress_line(d.value("progress", json())); !p.empty()) {
    const auto& pj = d["progress"];
    out += fmt::format("  Progress:  {} ({} of {} files)\n", p, uint(pj, "files_done"), uint(pj, "files_total"));
    if (pj.contains("files") && pj["files"].is_array())
      for (const auto& f : pj["files"]) {
        std::string line = fmt::format("    {}: {}", str(f, "path"), progress_line(f));
        if (auto c = uint(f, "connections"); c > 1) line += fmt::format(" over {} connections", c);
        out += line + "\n";
      }
  }
  out += fmt::format("  Started:   {}\n", str(d, "started_at"));
  if (auto f = str(d, "finished_at", ""); !f.empty()) out += fmt::format("  Finished:  {}\n", f);
  if (const auto& e = d.value("error", json()); e.is_object())
    out += fmt::format("  Error:     {}: {}\n", str(e, "code"), str(e, "message"));
  if (auto sw = switch_text(d); !sw.empty()) out += "  Switch:    " + sw + "\n";
  if (const auto& b = d.value("benchmark", json()); b.is_object())
    out += fmt::format("  Benchmark: first token {:.2f} s, {:.1f} tokens/s\n", num(b, "ttft_s"),
                       num(b, "decode_tokens_per_s"));
  return out;
}

}  // namespace

std::string services_line(const json& services) {
  if (!services.is_array() || services.size() < 2) return "";
  std::vector<std::string> each;
  for (const auto& s : services)
    each.push_back(fmt::format("{} (port {}, GPUs {})", str(s, "model"), uint(s, "port"),
                               gpu_text(s.value("gpu_ids", json()))));
  return fmt::format("{}", fmt::join(each, ", "));
}

std::string status_text(const json& s, const Style& style) {
  const auto& daemon = s.value("daemon", json::object());
  auto uptime = std::chrono::seconds(static_cast<long long>(num(daemon, "uptime_s")));
  std::string out = fmt::format("{} {}, up {}\n", style.bold("modeld"), str(daemon, "version"),
                                modeld::util::format_duration(uptime));
  out += active_line(s);
  out += watchdog_lines(s.value("watchdog", json()));
  out += services_table(s.value("services", json()));
  return out + deployment_text(s.value("deployment", json()), style);
}

namespace {

using modeld::wire::ModelInfo;
using modeld::wire::PlanReport;

// A string of an answer as modelctl prints it: control characters escaped (see str()).
std::string esc(const std::string& s) { return modeld::util::escape_control(s); }

// An optional string of an answer, or `fallback` when it is null.
std::string esc_or(const std::optional<std::string>& s, const std::string& fallback = "-") {
  return s ? esc(*s) : fallback;
}

// The first 12 characters of a commit, escaped; "-" when null.
std::string commit12(const std::optional<std::string>& c) { return c ? esc(c->substr(0, 12)) : "-"; }

// The revisions on disk of every model, one line each, after the models' table: nothing when no
// model has a revision on disk.
std::string revisions_table(const std::vector<ModelInfo>& models) {
  std::string out;
  for (const auto& m : models)
    for (const auto& r : m.revisions) {
      std::string marks;
      if (r.in_service) marks += "  in service";
      if (r.pulled) marks += "  pulled";
      out += fmt::format("  {}  {}  {}{}\n", esc(m.name), esc(r.commit), esc(r.state), marks);
    }
  return out.empty() ? out : "\nRevisions on disk:\n" + out;
}

}  // namespace

std::string models_table(const std::vector<ModelInfo>& models, const Style& style) {
  std::vector<std::vector<std::string>> rows{
      {"NAME", "STATE", "SIZE", "COMMIT", "ACTIVE", "PINNED", "LAST ACTIVE", "REPO"}};
  for (const auto& m : models) {
    rows.push_back({esc(m.name), style.state(esc(m.state)),
                    m.size_bytes ? modeld::util::format_bytes(m.size_bytes) : "-", commit12(m.commit),
                    m.active ? "yes" : "-", m.pinned ? "yes" : "-", esc_or(m.last_active),
                    esc(m.repo) + (m.revision.empty() ? "" : "@" + esc(m.revision))});
  }
  return aligned(rows) + revisions_table(models);
}

namespace {

std::string bytes(std::uint64_t n) { return modeld::util::format_bytes(n); }

std::string files(std::uint64_t n) { return fmt::format("{} file{}", n, n == 1 ? "" : "s"); }

}  // namespace

bool preflight_passed(const PlanReport& plan) {
  return std::all_of(plan.preflight.begin(), plan.preflight.end(), [](const auto& c) { return c.ok; });
}

namespace {

// The plan's "Pre-flight:" block, one line per check; "" for a daemon that sends none.
std::string preflight_text(const PlanReport& p, const Style& style) {
  if (p.preflight.empty()) return {};
  std::string out = "  Pre-flight:\n";
  for (const auto& c : p.preflight) {
    std::string verdict = c.ok ? "ok" : "FAILED";
    if (style.color) verdict = fmt::format("\x1b[{}m{}\x1b[0m", c.ok ? 32 : 31, verdict);
    out += fmt::format("    {:<8} {}: {}\n", esc(c.check), verdict, esc(c.message));
  }
  return out;
}

// The plan's head and what it would fetch and keep: up to its "Reserve:" line.
std::string plan_sizes(const PlanReport& p, const Style& style) {
  std::string out = fmt::format("Plan for {} ({}@{}, commit {}){}\n", style.bold(esc(p.model)), esc(p.repo),
                                esc(p.revision), commit12(p.commit), p.allow_downtime ? ", downtime allowed" : "");
  if (p.already_serving)
    out += fmt::format("  {} already serves commit {} with the same settings: deploying it changes nothing\n",
                       esc(p.model), commit12(p.commit));
  out += fmt::format("  Files:      {}, {}\n", files(p.files_total), bytes(p.bytes_total));
  if (p.verified)
    out += "  To fetch:   nothing: this commit is on disk and verified\n";
  else
    out += fmt::format("  To fetch:   {}, {}\n", files(p.files_to_fetch), bytes(p.bytes_to_fetch));
  std::string local = bytes(p.bytes_local);
  if (p.bytes_linkable > 0) local += fmt::format(" ({} hard-linked from older revisions)", bytes(p.bytes_linkable));
  out += fmt::format("  Local:      {}\n", local);
  if (p.adopt_from)
    out += fmt::format("  Adopt:      {}, {} from {} (hashed at deployment; a file that differs is downloaded)\n",
                       files(p.files_adoptable), bytes(p.bytes_adoptable), esc(*p.adopt_from));
  out += fmt::format("  Partial:    {} already downloaded, resumed\n", bytes(p.bytes_partial));
  out += fmt::format("  Needed:     {} of new disk space\n", bytes(p.bytes_needed));
  out += fmt::format("  Free:       {}\n", bytes(p.bytes_free));
  out += fmt::format("  Reserve:    {}\n", bytes(p.disk_reserve));
  return out;
}

// The plan's evictions and whether it fits, with the hint that downtime would make it fit.
std::string plan_fit(const PlanReport& p, const Style& style) {
  std::vector<std::string> evictions;
  std::uint64_t evicted = 0;
  for (const auto& e : p.evictions) {
    evicted += e.bytes;
    evictions.push_back(fmt::format("{} ({}{})", esc(e.name), bytes(e.bytes), e.active ? ", the active model" : ""));
  }
  std::string out =
      fmt::format("  Evictions:  {}\n", evictions.empty() ? "none" : fmt::format("{}", fmt::join(evictions, ", ")));
  const auto available = p.bytes_free > p.disk_reserve ? p.bytes_free - p.disk_reserve : 0;
  if (p.fits) {
    out += fmt::format("  Result:     {}\n", style.color ? "\x1b[32mfits\x1b[0m" : "fits");
  } else {
    std::string result = fmt::format("does not fit by {}", bytes(p.shortfall_bytes));
    if (style.color) result = fmt::format("\x1b[31m{}\x1b[0m", result);
    out += fmt::format("  Result:     {}: needs {}, available {} ({} free minus reserve {}{})\n", result,
                       bytes(p.bytes_needed), bytes(available + evicted), bytes(p.bytes_free), bytes(p.disk_reserve),
                       evicted ? fmt::format(", plus {} from evictions", bytes(evicted)) : std::string());
  }
  if (!p.fits && p.fits_with_allow_downtime)
    out += fmt::format("  Hint:       fits with --allow-downtime, which evicts the active model {} (no rollback then)\n",
                       esc_or(p.active_model, ""));
  return out;
}

}  // namespace

std::string plan_text(const PlanReport& p, const Style& style) {
  std::string out = plan_sizes(p, style) + plan_fit(p, style);
  const std::string warming = esc(p.warming);
  if (warming == "in_outage")
    out += "  Warming:    after the active model stops (it is evicted): adds to the outage\n";
  else if (warming == "off")
    out += "  Warming:    off for this model\n";
  else if (!warming.empty())
    out += "  Warming:    before the old model stops, while it serves\n";
  out += preflight_text(p, style);
  const std::string active = esc_or(p.active_model, "");
  if (active.empty())
    out += "  Rollback:   - (no model active)\n";
  else if (p.rollback_possible)
    out += fmt::format("  Rollback:   possible ({} is kept)\n", active);
  else
    out += fmt::format("  Rollback:   not possible: the active model {} would be evicted\n", active);
  return out;
}

std::string verify_text(const modeld::wire::VerifyReport& r, const Style& style) {
  const auto& problems = r.problems;
  const std::string summary =
      problems.empty() ? style.state("verified")
                       : fmt::format("{} problem{}", problems.size(), problems.size() == 1 ? "" : "s");
  std::string out = fmt::format("{} at {}: {}, {}: {}\n", esc(r.model), commit12(r.commit), files(r.files),
                                bytes(r.bytes), summary);
  for (const auto& p : problems) out += fmt::format("  {}: {}\n", esc(p.code), esc(p.message));
  return out;
}

std::string removal_text(const modeld::wire::Removal& r) {
  return fmt::format("Removed {}: {} revision{}, {} freed\n", esc(r.model), r.commits.size(),
                     r.commits.size() == 1 ? "" : "s", bytes(r.bytes_freed));
}

}  // namespace modelctl
