// modelctl's human output, from the answers read into lib/wire's types (an answer of another
// daemon version that does not read as them fails before anything is printed).

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
using modeld::wire::FileProgress;
using modeld::wire::Progress;
using modeld::wire::Record;
using modeld::wire::ServiceInfo;
using modeld::wire::Status;
using modeld::wire::WatchdogStatus;

// The stable name of a phase, state, kind or error code.
template <class E>
std::string named(E value) {
  using modeld::to_string;
  using modeld::wire::to_string;
  return std::string(to_string(value));
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

// "37% of 547 GB at 1.2 GB/s, 4 min left" for `done` of `total` bytes; empty when total is 0.
std::string progress_text(std::uint64_t done, std::uint64_t total, double rate, const std::optional<double>& eta_s) {
  if (total == 0) return {};
  done = std::min(done, total);
  const auto percent = static_cast<unsigned>(done * 100 / total);
  std::string out = fmt::format("{}% of {}", percent, modeld::util::format_bytes(total));
  if (rate > 0) out += " at " + modeld::util::format_rate(rate);
  if (eta_s && done < total) {
    auto eta = std::chrono::seconds(static_cast<long long>(std::ceil(*eta_s)));
    out += ", " + modeld::util::format_duration(eta) + " left";
  }
  return out;
}

}  // namespace

std::string str(const json& j, const char* key, std::string fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return fallback;
  return esc(j[key].get_ref<const std::string&>());
}

std::string esc(const std::string& text) { return modeld::util::escape_control(text); }

std::string esc_or(const std::optional<std::string>& text, const std::string& fallback) {
  return text ? esc(*text) : fallback;
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

std::string short_commit(const std::string& commit) { return esc(commit.substr(0, 12)); }

std::string short_commit(const std::optional<std::string>& commit) { return commit ? short_commit(*commit) : "-"; }

std::string gpu_text(const std::optional<std::vector<unsigned>>& ids) {
  if (!ids) return "all";
  std::vector<unsigned> v = *ids;
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

std::string kind_prefix(const Record& d) {
  return d.kind == modeld::wire::Kind::deploy ? std::string() : named(d.kind) + " ";
}

std::string progress_line(const Progress& p) {
  return progress_text(p.bytes_done, p.bytes_total, p.rate_bytes_per_s, p.eta_s);
}

std::string progress_line(const FileProgress& f) {
  return progress_text(f.bytes_done, f.bytes_total, f.rate_bytes_per_s, f.eta_s);
}

std::string progress_summary(const Progress& p) {
  auto text = progress_line(p);
  if (text.empty()) return text;
  return fmt::format("{} ({} of {} files)", text, p.files_done, p.files_total);
}

bool progress_complete(const Progress& p) { return p.bytes_done >= p.bytes_total; }

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

std::vector<std::string> progress_lines(const Progress& p, std::size_t columns, std::size_t max_files) {
  std::vector<std::string> out;
  const auto text = progress_summary(p);
  if (text.empty()) return out;
  const std::size_t bar = std::clamp<std::size_t>(columns / 4, 12, 32);
  out.push_back(fmt::format("  {} {}", progress_bar(p.bytes_done, p.bytes_total, bar), text));
  std::size_t name_width = 0;
  for (const auto& f : p.files) name_width = std::max(name_width, width(esc(f.path)));
  name_width = std::min<std::size_t>(name_width, 40);
  std::size_t shown = 0;
  for (const auto& f : p.files) {
    if (shown == max_files) {
      out.push_back(fmt::format("    ... and {} more", p.files.size() - shown));
      break;
    }
    ++shown;
    std::string line = fmt::format("    {} {} {}", pad(elide_front(esc(f.path), name_width), name_width),
                                   progress_bar(f.bytes_done, f.bytes_total, bar), progress_line(f));
    if (f.connections > 1) line += fmt::format(" over {} connections", f.connections);
    out.push_back(std::move(line));
  }
  return out;
}

std::string switch_text(const Record& d) {
  if (!d.switch_report) return "";
  const auto& s = *d.switch_report;
  return modeld::wire::describe_switch(s.downtime_s, s.stop_s, s.launch_s, s.start_to_port_s, s.port_to_ready_s);
}

std::vector<std::string> deployment_lines(const Record& d, const Style& style, std::size_t columns) {
  std::vector<std::string> out;
  const auto state = named(d.state);
  const bool running = !d.ended();
  out.push_back(fmt::format("{} {}{} of {} (commit {})", running ? "Deployment: " : "Last deployment:", kind_prefix(d),
                            esc(d.id), style.bold(esc(d.model)), short_commit(d.commit)));
  if (running) {
    out.push_back(fmt::format("  Phase:     {}, {}", named(d.phase), style.state(state)));
    for (auto& line : progress_lines(d.progress, columns)) out.push_back(std::move(line));
  } else {
    out.push_back(fmt::format("  Result:    {} in phase {}", style.state(state), named(d.phase)));
  }
  if (d.error) out.push_back(fmt::format("  Error:     {}: {}", named(d.error->code), esc(d.error->message)));
  if (auto s = switch_text(d); !s.empty()) out.push_back("  Switch:    " + s);
  // A record known only from its events (watch) has no start time.
  out.push_back(fmt::format("  Started:   {}", d.started_at.empty() ? "-" : esc(d.started_at)));
  if (auto f = esc_or(d.finished_at, ""); !f.empty()) out.push_back(fmt::format("  Finished:  {}", f));
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
const ServiceInfo* service_of(const std::vector<ServiceInfo>& services, const std::string& model) {
  for (const auto& s : services)
    if (s.model == model) return &s;
  return nullptr;
}

// The "Active:" line: the model put into service last, with its GPUs when "services" has it.
std::string active_line(const Status& status) {
  if (!status.active) return "Active:      none\n";
  const auto& a = *status.active;
  const auto* service = service_of(status.services, a.model);
  const std::string gpus = service ? ", GPUs " + gpu_text(service->gpu_ids) : "";
  return fmt::format("Active:      {} (commit {}), {} on port {}{}, since {}\n", esc(a.model), short_commit(a.commit),
                     esc(a.unit), a.port, gpus, esc(a.since));
}

// A watchdog record as the "Watchdog:" line and, after a restart, a "Restarted:" line.
std::string watchdog_lines(const std::optional<WatchdogStatus>& watchdog) {
  if (!watchdog) return "";
  const auto& w = *watchdog;
  std::string line =
      fmt::format("Watchdog:    {}, {} restart{}", esc(w.state), w.restarts, w.restarts == 1 ? "" : "s");
  if (auto n = w.consecutive_failures; n > 0) line += fmt::format(", {} failed probe{} in a row", n, n == 1 ? "" : "s");
  if (w.last_probe_ok)
    line += fmt::format(", last probe {} at {}", *w.last_probe_ok ? "ok" : "failed", esc_or(w.last_probe_at));
  std::string out = line + "\n";
  if (auto at = esc_or(w.last_restart_at, ""); !at.empty())
    out += fmt::format("  Restarted: {}: {}\n", at, esc_or(w.last_restart_reason));
  return out;
}

// A service's watchdog in one table cell: "-" when not watched, else its state and restarts.
std::string watchdog_cell(const std::optional<WatchdogStatus>& w) {
  if (!w) return "-";
  std::string out = esc(w->state);
  if (auto n = w->restarts; n > 0) out += fmt::format(", {} restart{}", n, n == 1 ? "" : "s");
  return out;
}

// Every service in a table, when more than one serves (one is the "Active:" line already).
std::string services_table(const std::vector<ServiceInfo>& services) {
  if (services.size() < 2) return "";
  std::vector<std::vector<std::string>> rows{{"MODEL", "COMMIT", "UNIT", "PORT", "GPUS", "SINCE", "WATCHDOG"}};
  for (const auto& s : services)
    rows.push_back({esc(s.model), short_commit(s.commit), esc(s.unit), std::to_string(s.port), gpu_text(s.gpu_ids),
                    esc(s.since), watchdog_cell(s.watchdog)});
  return fmt::format("Services:    {} in service (the last put into service is the active one)\n", services.size()) +
         aligned(rows, "  ");
}

// The download's progress of GET /v1/status's deployment: the whole, then each file in flight.
std::string progress_block(const Progress& p) {
  auto line = progress_line(p);
  if (line.empty()) return "";
  std::string out = fmt::format("  Progress:  {} ({} of {} files)\n", line, p.files_done, p.files_total);
  for (const auto& f : p.files) {
    std::string file = fmt::format("    {}: {}", esc(f.path), progress_line(f));
    if (f.connections > 1) file += fmt::format(" over {} connections", f.connections);
    out += file + "\n";
  }
  return out;
}

// The deployment of GET /v1/status: its id (after its kind when it is no deploy), model, phase,
// state, progress, times, error, switch and benchmark.
std::string deployment_text(const std::optional<Record>& deployment, const Style& style) {
  if (!deployment) return "Deployment:  none\n";
  const auto& d = *deployment;
  std::string out = fmt::format("Deployment:  {}{}\n", kind_prefix(d), esc(d.id));
  out += fmt::format("  Model:     {} (commit {})\n", esc(d.model), short_commit(d.commit));
  out += fmt::format("  Phase:     {}\n", named(d.phase));
  out += fmt::format("  State:     {}\n", style.state(named(d.state)));
  out += progress_block(d.progress);
  out += fmt::format("  Started:   {}\n", esc(d.started_at));
  if (auto f = esc_or(d.finished_at, ""); !f.empty()) out += fmt::format("  Finished:  {}\n", f);
  if (d.error) out += fmt::format("  Error:     {}: {}\n", named(d.error->code), esc(d.error->message));
  if (auto sw = switch_text(d); !sw.empty()) out += "  Switch:    " + sw + "\n";
  if (d.benchmark_ttft_s)
    out += fmt::format("  Benchmark: first token {:.2f} s, {:.1f} tokens/s\n", *d.benchmark_ttft_s,
                       d.benchmark_decode_tokens_per_s.value_or(0));
  return out;
}

}  // namespace

std::string services_line(const std::vector<ServiceInfo>& services) {
  if (services.size() < 2) return "";
  std::vector<std::string> each;
  for (const auto& s : services)
    each.push_back(fmt::format("{} (port {}, GPUs {})", esc(s.model), s.port, gpu_text(s.gpu_ids)));
  return fmt::format("{}", fmt::join(each, ", "));
}

std::string status_text(const Status& s, const Style& style) {
  auto uptime = std::chrono::seconds(static_cast<long long>(s.uptime_s));
  std::string out = fmt::format("{} {}, up {}\n", style.bold("modeld"), esc(s.version),
                                modeld::util::format_duration(uptime));
  out += active_line(s);
  out += watchdog_lines(s.watchdog);
  out += services_table(s.services);
  return out + deployment_text(s.deployment, style);
}

namespace {

using modeld::wire::ModelInfo;
using modeld::wire::PlanReport;

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
                    m.size_bytes ? modeld::util::format_bytes(m.size_bytes) : "-", short_commit(m.commit),
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
                                esc(p.revision), short_commit(p.commit), p.allow_downtime ? ", downtime allowed" : "");
  if (p.already_serving)
    out += fmt::format("  {} already serves commit {} with the same settings: deploying it changes nothing\n",
                       esc(p.model), short_commit(p.commit));
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
  std::string out = fmt::format("{} at {}: {}, {}: {}\n", esc(r.model), short_commit(r.commit), files(r.files),
                                bytes(r.bytes), summary);
  for (const auto& p : problems) out += fmt::format("  {}: {}\n", esc(p.code), esc(p.message));
  return out;
}

std::string removal_text(const modeld::wire::Removal& r) {
  return fmt::format("Removed {}: {} revision{}, {} freed\n", esc(r.model), r.commits.size(),
                     r.commits.size() == 1 ? "" : "s", bytes(r.bytes_freed));
}

}  // namespace modelctl
