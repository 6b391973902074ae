#pragma once
// Small text helpers: hex, globs, time stamps, URL path encoding, escaping control characters.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::util {

/// `s` with ASCII letters lower-cased (hex digests, URL schemes and hosts, header names).
std::string ascii_lower(std::string_view s);

/// Whether `a` and `b` are equal but for the case of ASCII letters (header names, units).
bool iequals(std::string_view a, std::string_view b) noexcept;

/// `s` without leading and trailing white space (isspace in the C locale).
std::string_view trim(std::string_view s);

/// `t` as a compact UTC stamp, "YYYYMMDDTHHMMSSZ" (whole seconds), for ids and folder names.
std::string compact_utc_stamp(std::chrono::system_clock::time_point t);

/// Lower-case hex of `bytes` (two characters per byte).
std::string to_hex(std::span<const unsigned char> bytes);

/// Whether `path` matches the glob `pattern` as huggingface_hub's fnmatch does: '*' also
/// matches '/', '?' one character, '[...]' a set (fnmatch(3) without FNM_PATHNAME).
bool glob_match(std::string_view pattern, std::string_view path);

/// Whether `path` passes the filters: matches one of `include` (or include is empty) and none of
/// `exclude`.
bool passes_filters(std::string_view path, const std::vector<std::string>& include,
                    const std::vector<std::string>& exclude);

/// Formats a time point as RFC 3339 UTC with seconds, e.g. "2026-11-29T19:39:42Z".
std::string rfc3339(std::chrono::system_clock::time_point t);

/// Parses an RFC 3339 UTC time written by rfc3339(); returns the epoch on bad input.
std::chrono::system_clock::time_point parse_rfc3339(std::string_view s);

/// Percent-encodes one URL path segment (RFC 3986 unreserved characters stay as they are).
std::string url_encode_segment(std::string_view segment);

/// Percent-encodes a path, keeping '/' separators ("a b/c" -> "a%20b/c").
std::string url_encode_path(std::string_view path);

/// Decodes the %XX escapes of `text` (Boost.URL; '+' stays '+'); nullopt when a '%' is not
/// followed by two hex digits.
std::optional<std::string> percent_decode(std::string_view text);

/// `text` with its control characters escaped as JSON writes them: "\n", "\r", "\t", "\b", "\f",
/// the other C0 characters and DEL as "\u001b" style escapes, and the C1 controls U+0080..U+009F
/// (UTF-8 C2 80..C2 9F) as "\u0085" style escapes; every other byte, UTF-8 or not, is kept, and
/// backslashes are not doubled. For text a Hub, a server or a file name put into a line meant
/// for people (journal MESSAGE, STATUS=, modelctl's terminal output): it stays one line and
/// cannot move a terminal's cursor or change its state. Returns `text` unchanged when it holds
/// no control character.
std::string escape_control(std::string_view text);

/// A piece of text from elsewhere (a server's or a Hub's answer, a file name) fit for one line of
/// a message: its first `limit` bytes with control characters escaped (escape_control), and
/// "..." after them when `text` is longer.
std::string excerpt(std::string_view text, std::size_t limit);

/// Whether a repository-relative path is safe to place under a folder: relative, no "..", no
/// empty or "." segments, no NUL or backslash.
bool safe_relative_path(std::string_view path);

}  // namespace modeld::util
