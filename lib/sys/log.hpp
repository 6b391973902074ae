#pragma once
// Logging for the daemon: spdlog in front, journald behind. Each line carries the contract's
// structured fields (interface.md "Journal": SYSLOG_IDENTIFIER=modeld, MODELD_DEPLOYMENT,
// MODELD_MODEL, MODELD_PHASE, MODELD_STATE) plus any extra MODELD_* fields.

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::sys {

/// Severity, mapped to syslog priorities in the journal (debug=7, info=6, notice=5, warning=4, error=3).
enum class Level { debug, info, notice, warning, error };

/// Structured journal fields attached to one line; empty values are left out.
struct Fields {
  std::string deployment;  ///< MODELD_DEPLOYMENT
  std::string model;       ///< MODELD_MODEL
  std::string phase;       ///< MODELD_PHASE
  std::string state;       ///< MODELD_STATE (terminal lines)
  std::string message_id;  ///< MESSAGE_ID (32 hex digits), for catalogued events
  std::vector<std::pair<std::string, std::string>> extra;  ///< e.g. {"MODELD_FILE", "x.safetensors"}
};

/// Where log lines go.
enum class Sink {
  automatic,  ///< journald only when stderr is the journal ($JOURNAL_STREAM names stderr's device
              ///< and inode, systemd.exec(5)), so lines are not written twice; else stderr only
  journal,    ///< journald only (sd_journal_sendv)
  stderr_only ///< stderr only, with the phase and model in brackets
};

/// Sets up the process-wide logger; call once before logging. `verbose` enables debug lines.
void init_logging(Sink sink, bool verbose);

/// Writes one line with `fields`; never throws; the message must not contain secrets.
/// Before init_logging() it sets up Sink::automatic without debug lines.
void log(Level level, const Fields& fields, std::string_view message);

/// The journal entry log() sends for one line, as "NAME=value" strings in order: MESSAGE (with
/// control characters escaped by util::escape_control, so that a file name or a server's text
/// quoted in it cannot add a line to `journalctl -o cat` or drive a terminal; one entry is one
/// line),
/// PRIORITY (the syslog number of `level`), SYSLOG_IDENTIFIER=modeld, then the non-empty
/// MODELD_DEPLOYMENT, MODELD_MODEL, MODELD_PHASE, MODELD_STATE, MESSAGE_ID and extra fields.
/// Extra values are sent as they are (a MODELD_FILE names the file byte for byte; journalctl shows
/// values that are not printable as blob data). Extra names are made valid journal field names (upper-case [A-Z0-9_], starting with a letter,
/// at most 64 characters); extras with an empty name or value, or that would repeat one of the
/// fields above, are left out. Pure; never throws except std::bad_alloc.
std::vector<std::string> journal_fields(Level level, const Fields& fields, std::string_view message);

/// The line the stderr sink prints for one log line, with its newline: "LEVEL [model phase]
/// message" (the bracket holds whichever of model and phase are set and is left out when neither
/// is; control characters in `message` escaped as in journal_fields()); `color` wraps the level
/// in ANSI colours. Pure.
std::string stderr_line(Level level, const Fields& fields, std::string_view message, bool color);

/// Formats and writes one line with `fields`.
template <class... Args>
void logf(Level level, const Fields& fields, fmt::format_string<Args...> f, Args&&... args) {
  log(level, fields, fmt::format(f, std::forward<Args>(args)...));
}

/// Writes one line without structured fields.
template <class... Args>
void logf(Level level, fmt::format_string<Args...> f, Args&&... args) {
  log(level, Fields{}, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace modeld::sys
