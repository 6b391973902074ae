// The systemd drop-in reader (dropin.hpp): unit-file lines, systemd's quoting and escapes,
// specifiers, time spans and $VAR expansion, as systemd 252 does them.

#include "units/dropin.hpp"

#include "util/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace modeld::units {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

using util::trim;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One C escape after a backslash at s[i] (systemd's cunescape); advances i past it.
Result<void> unescape(std::string_view s, std::size_t& i, std::string& out) {
  if (i + 1 >= s.size()) return make_error(Errc::config_invalid, "a backslash ends the value");
  char c = s[++i];
  switch (c) {
    case 'a': out += '\a'; break;
    case 'b': out += '\b'; break;
    case 'f': out += '\f'; break;
    case 'n': out += '\n'; break;
    case 'r': out += '\r'; break;
    case 't': out += '\t'; break;
    case 'v': out += '\v'; break;
    case 's': out += ' '; break;
    case '\\': case '"': case '\'': out += c; break;
    case 'x': {
      int hi = i + 1 < s.size() ? hex_value(s[i + 1]) : -1;
      int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
        return make_error(Errc::config_invalid, "invalid \\x escape");
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
      break;
    }
    default:
      if (c >= '0' && c <= '7' && i + 2 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7' && s[i + 2] >= '0' &&
          s[i + 2] <= '7') {
        int v = (c - '0') * 64 + (s[i + 1] - '0') * 8 + (s[i + 2] - '0');
        if (v == 0 || v > 255) return make_error(Errc::config_invalid, "invalid octal escape");
        out += static_cast<char>(v);
        i += 2;
        break;
      }
      return make_error(Errc::config_invalid, fmt::format("unknown escape \\{}", c));
  }
  return {};
}

// Splits a value into words the way systemd's extract_first_word(UNQUOTE|CUNESCAPE) does:
// whitespace separates words, "..." and '...' may appear anywhere in a word, backslash escapes
// work inside and outside quotes.
Result<std::vector<std::string>> split_words(std::string_view s) {
  std::vector<std::string> words;
  std::size_t i = 0;
  while (true) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i >= s.size()) break;
    std::string word;
    char quote = 0;
    for (; i < s.size(); ++i) {
      char c = s[i];
      if (quote) {
        if (c == quote) quote = 0;
        else if (c == '\\') {
          if (auto r = unescape(s, i, word); !r) return r.error();
        } else word += c;
      } else if (is_space(c)) {
        break;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '\\') {
        if (auto r = unescape(s, i, word); !r) return r.error();
      } else {
        word += c;
      }
    }
    if (quote) return make_error(Errc::config_invalid, fmt::format("unterminated {} quote", quote));
    words.push_back(std::move(word));
  }
  return words;
}

// Resolves the specifiers modeld may write (%% always; %i %I %n %N for a template's instance).
Result<std::string> specifiers(std::string_view s, const std::string& unit) {
  std::string instance;
  if (auto at = unit.find('@'); at != std::string::npos) {
    auto dot = unit.rfind('.');
    instance = unit.substr(at + 1, dot == std::string::npos || dot < at ? std::string::npos : dot - at - 1);
  }
  std::string prefix_name = unit.substr(0, unit.rfind('.') == std::string::npos ? unit.size() : unit.rfind('.'));
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 1 >= s.size()) return make_error(Errc::config_invalid, "a '%' ends the value");
    switch (s[++i]) {
      case '%': out += '%'; break;
      case 'i': case 'I': out += instance; break;
      case 'n': out += unit; break;
      case 'N': out += prefix_name; break;
      default: return make_error(Errc::config_invalid, fmt::format("unsupported specifier %{}", s[i]));
    }
  }
  return out;
}

// A systemd time span ("30s", "5min", "1h 2min", "1.5s", "infinity"; a bare number is seconds;
// 0 disables the timeout like infinity).
Result<std::chrono::milliseconds> parse_timespan(std::string_view v) {
  v = trim(v);
  if (v == "infinity") return kInfinity;
  if (v.empty()) return make_error(Errc::config_invalid, "empty time span");
  static const std::pair<std::string_view, double> kUnits[] = {
      {"usec", 1e-3}, {"us", 1e-3}, {"msec", 1}, {"ms", 1}, {"seconds", 1e3}, {"second", 1e3},
      {"sec", 1e3}, {"s", 1e3}, {"minutes", 6e4}, {"minute", 6e4}, {"min", 6e4}, {"months", 2629800e3},
      {"month", 2629800e3}, {"M", 2629800e3}, {"m", 6e4}, {"hours", 3.6e6}, {"hour", 3.6e6}, {"hr", 3.6e6},
      {"h", 3.6e6}, {"days", 8.64e7}, {"day", 8.64e7}, {"d", 8.64e7}, {"weeks", 6.048e8}, {"week", 6.048e8},
      {"w", 6.048e8}, {"years", 31557600e3}, {"year", 31557600e3}, {"y", 31557600e3}};
  double total = 0;
  std::size_t i = 0;
  while (i < v.size()) {
    while (i < v.size() && is_space(v[i])) ++i;
    if (i >= v.size()) break;
    std::size_t start = i;
    while (i < v.size() && ((v[i] >= '0' && v[i] <= '9') || v[i] == '.')) ++i;
    if (i == start) return make_error(Errc::config_invalid, fmt::format("invalid time span \"{}\"", v));
    double n = 0;
    try {
      n = std::stod(std::string(v.substr(start, i - start)));
    } catch (const std::exception&) {
      return make_error(Errc::config_invalid, fmt::format("invalid time span \"{}\"", v));
    }
    while (i < v.size() && is_space(v[i])) ++i;
    std::size_t ustart = i;
    while (i < v.size() && ((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= 'A' && v[i] <= 'Z'))) ++i;
    std::string_view unit = v.substr(ustart, i - ustart);
    double factor = 0;
    if (unit.empty()) factor = 1e3;
    for (const auto& [name, f] : kUnits)
      if (name == unit) factor = f;
    if (factor == 0) return make_error(Errc::config_invalid, fmt::format("unknown time unit \"{}\" in \"{}\"", unit, v));
    total += n * factor;
  }
  if (total <= 0) return kInfinity;
  if (total >= 9e15) return kInfinity;
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(total)));
}

}  // namespace

namespace {

// The logical line of a drop-in starting at `pos` (moved past it): a line ending in a backslash
// continues on the next one, joined by a space (systemd.syntax); `number` counts the physical
// lines read so far.
std::string next_line(std::string_view content, std::size_t& pos, int& number) {
  std::string line;
  while (pos < content.size()) {
    auto nl = content.find('\n', pos);
    std::string_view part = content.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? content.size() : nl + 1;
    ++number;
    if (!part.empty() && part.back() == '\r') part.remove_suffix(1);
    if (!part.empty() && part.back() == '\\') {
      line.append(part.substr(0, part.size() - 1));
      line += ' ';
      continue;
    }
    line.append(part);
    break;
  }
  return line;
}

// ExecStart=VALUE applied to `out` (an empty value resets the command); config_invalid with the
// message for the drop-in's line.
Result<void> set_exec_start(ProcessSpec& out, std::string_view value, const std::string& unit) {
  auto error = [](std::string message) { return make_error(Errc::config_invalid, std::move(message)); };
  if (value.empty()) {
    out.argv.clear();
    return {};
  }
  // Prefixes that change how systemd runs the command; '-' (ignore the exit status) and
  // the privilege ones have no meaning here.
  while (!value.empty() && (value.front() == '-' || value.front() == '@' || value.front() == ':' ||
                            value.front() == '+' || value.front() == '!'))
    value.remove_prefix(1);
  auto words = split_words(value);
  if (!words) return error("ExecStart=: " + words.error().message);
  if (words->empty()) return error("ExecStart= names no program");
  if (!out.argv.empty()) return error("a second ExecStart= (a Type=exec service runs one command)");
  std::vector<std::string> argv;
  for (const auto& w : *words) {
    auto s = specifiers(w, unit);
    if (!s) return error("ExecStart=: " + s.error().message);
    argv.push_back(std::move(*s));
  }
  out.argv = std::move(argv);
  return {};
}

// Environment=VALUE applied to `out` (an empty value resets the list); config_invalid with the
// message for the drop-in's line.
Result<void> add_environment(ProcessSpec& out, std::string_view value, const std::string& unit) {
  auto error = [](std::string message) { return make_error(Errc::config_invalid, std::move(message)); };
  if (value.empty()) {
    out.environment.clear();
    return {};
  }
  auto words = split_words(value);
  if (!words) return error("Environment=: " + words.error().message);
  for (const auto& w : *words) {
    auto s = specifiers(w, unit);
    if (!s) return error("Environment=: " + s.error().message);
    auto e = s->find('=');
    if (e == std::string::npos || e == 0) return error(fmt::format("Environment=: \"{}\" is not KEY=VALUE", *s));
    // '$' has no special meaning in Environment= (systemd.exec(5)): kept as written.
    out.environment.push_back(std::move(*s));
  }
  return {};
}

// KEY=VALUE of a drop-in's [Service] section applied to `out`; config_invalid with the message
// for the drop-in's line.
Result<void> apply_service_setting(ProcessSpec& out, std::string_view key, std::string_view value,
                                   const std::string& unit) {
  if (key == "ExecStart") return set_exec_start(out, value, unit);
  if (key == "Environment") return add_environment(out, value, unit);
  if (key == "WorkingDirectory") {
    // The rest of the line is the path, without quotes; '-' makes a missing folder no error.
    if (!value.empty() && value.front() == '-') value.remove_prefix(1);
    if (value.empty()) {
      out.working_directory.clear();
      return {};
    }
    auto s = specifiers(value, unit);
    if (!s) return make_error(Errc::config_invalid, "WorkingDirectory=: " + s.error().message);
    if (s->front() != '/')
      return make_error(Errc::config_invalid, fmt::format("WorkingDirectory={} is not an absolute path", *s));
    out.working_directory = *s;
  } else if (key == "TimeoutStopSec" || key == "TimeoutSec") {
    auto t = parse_timespan(value);
    if (!t) return make_error(Errc::config_invalid, std::string(key) + "=: " + t.error().message);
    out.stop_timeout = *t;
  } else if (key == "KillMode") {
    out.kill_mixed = value == "mixed";
  }
  // Every other setting (TimeoutStartSec= included: modeld enforces startup_timeout itself) is
  // systemd's business and has no meaning here.
  return {};
}

}  // namespace

Result<void> apply_dropin(ProcessSpec& spec, std::string_view content, const std::string& unit) {
  ProcessSpec out = spec;
  std::string section;
  int number = 0;
  std::size_t pos = 0;
  while (pos < content.size()) {
    int first = number + 1;
    std::string line = next_line(content, pos, number);
    auto where = [&](std::string_view message) {
      return make_error(Errc::config_invalid, fmt::format("drop-in of {}, line {}: {}", unit, first, message));
    };
    std::string_view l = trim(line);
    if (l.empty() || l.front() == '#' || l.front() == ';') continue;
    if (l.front() == '[') {
      if (l.back() != ']') return where("a section header without ']'");
      section = std::string(l.substr(1, l.size() - 2));
      continue;
    }
    auto eq = l.find('=');
    if (eq == std::string_view::npos) return where(fmt::format("\"{}\" is not KEY=VALUE", l));
    if (section != "Service") continue;
    if (auto r = apply_service_setting(out, trim(l.substr(0, eq)), trim(l.substr(eq + 1)), unit); !r)
      return where(r.error().message);
  }
  spec = std::move(out);
  return {};
}

std::vector<std::string> exec_argv(const ProcessSpec& spec, const std::vector<std::string>& environment) {
  std::map<std::string, std::string, std::less<>> env;
  for (const auto& kv : environment) {
    auto e = kv.find('=');
    if (e != std::string::npos) env[kv.substr(0, e)] = kv.substr(e + 1);
  }
  auto lookup = [&](std::string_view name) -> std::string {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  auto name_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  std::vector<std::string> out;
  for (const auto& w : spec.argv) {
    std::string r;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w[i] != '$' || i + 1 >= w.size()) {
        r += w[i];
      } else if (w[i + 1] == '$') {
        r += '$';
        ++i;
      } else if (w[i + 1] == '{') {
        auto close = w.find('}', i + 2);
        if (close == std::string::npos) {
          r += w.substr(i);
          break;
        }
        r += lookup(std::string_view(w).substr(i + 2, close - i - 2));
        i = close;
      } else if (i == 0 && std::all_of(w.begin() + 1, w.end(), name_char)) {
        // "$VAR" as a whole word (systemd would split its value into words; a model's command
        // never relies on that, so it stays one word).
        r = lookup(std::string_view(w).substr(1));
        break;
      } else {
        r += w[i];
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace modeld::units
