#include "util/text.hpp"

#include <boost/url/pct_string_view.hpp>
#include <fmt/format.h>

#include <cctype>
#include <ctime>
#include <fnmatch.h>

namespace modeld::util {

std::string to_hex(std::span<const unsigned char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

bool glob_match(std::string_view pattern, std::string_view path) {
  std::string p(pattern), s(path);
  return ::fnmatch(p.c_str(), s.c_str(), 0) == 0;
}

bool passes_filters(std::string_view path, const std::vector<std::string>& include,
                    const std::vector<std::string>& exclude) {
  bool included = include.empty();
  for (const auto& g : include)
    if (glob_match(g, path)) { included = true; break; }
  if (!included) return false;
  for (const auto& g : exclude)
    if (glob_match(g, path)) return false;
  return true;
}

namespace {
std::string utc_format(std::chrono::system_clock::time_point t, const char* format) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}
}  // namespace

std::string rfc3339(std::chrono::system_clock::time_point t) { return utc_format(t, "%Y-%m-%dT%H:%M:%SZ"); }

std::string compact_utc_stamp(std::chrono::system_clock::time_point t) { return utc_format(t, "%Y%m%dT%H%M%SZ"); }

namespace {
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = lower(c);
  return out;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::chrono::system_clock::time_point parse_rfc3339(std::string_view s) {
  std::tm tm{};
  std::string str(s);
  if (!::strptime(str.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm)) return {};
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

std::string url_encode_segment(std::string_view segment) {
  std::string out;
  for (unsigned char c : segment) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') out.push_back(static_cast<char>(c));
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string url_encode_path(std::string_view path) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    auto slash = path.find('/', start);
    out += url_encode_segment(path.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) break;
    out.push_back('/');
    start = slash + 1;
  }
  return out;
}

std::optional<std::string> percent_decode(std::string_view text) {
  auto escaped = boost::urls::make_pct_string_view(text);
  if (!escaped) return std::nullopt;
  return escaped->decode();
}

bool safe_relative_path(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  if (path.find('\0') != std::string_view::npos || path.find('\\') != std::string_view::npos) return false;
  std::size_t start = 0;
  for (;;) {
    auto slash = path.find('/', start);
    auto seg = path.substr(start, slash == std::string_view::npos ? slash : slash - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

namespace {

// The escape of one control character, JSON's short form where it has one.
void append_escape(std::string& out, unsigned code) {
  switch (code) {
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\b': out += "\\b"; return;
    case '\f': out += "\\f"; return;
    default: out += fmt::format("\\u{:04x}", code);
  }
}

bool is_c0_or_del(unsigned char c) { return c < 0x20 || c == 0x7f; }

// Whether `text` holds a C1 control encoded as UTF-8 (C2 80..C2 9F) at `i`.
bool is_c1_at(std::string_view text, std::size_t i) {
  return static_cast<unsigned char>(text[i]) == 0xc2 && i + 1 < text.size() &&
         static_cast<unsigned char>(text[i + 1]) >= 0x80 && static_cast<unsigned char>(text[i + 1]) <= 0x9f;
}

}  // namespace

std::string escape_control(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && !is_c0_or_del(static_cast<unsigned char>(text[i])) && !is_c1_at(text, i)) ++i;
  if (i == text.size()) return std::string(text);
  std::string out(text.substr(0, i));
  out.reserve(text.size() + 16);
  for (; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (is_c0_or_del(c)) {
      append_escape(out, c);
    } else if (is_c1_at(text, i)) {
      append_escape(out, static_cast<unsigned char>(text[i + 1]));
      ++i;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string excerpt(std::string_view text, std::size_t limit) {
  std::string out = escape_control(text.substr(0, limit));
  if (text.size() > limit) out += "...";
  return out;
}

}  // namespace modeld::util
