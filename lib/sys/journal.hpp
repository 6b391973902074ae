#pragma once
// Reading a unit's own lines back from the journal (sd-journal): whether a loading inference
// server still writes (a 40-minute load is alive as long as it logs), and what a server that died
// said last. The only other libsystemd use in lib/sys besides sd-daemon and journal sending.

#include "util/error.hpp"

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::sys {

/// Which journal entries count as a unit's output.
struct UnitJournalQuery {
  std::string unit;           ///< matched as _SYSTEMD_UNIT (the unit's own stdout/stderr and syslog lines)
  /// 32 hex digits: only this run of the unit (_SYSTEMD_INVOCATION_ID, or none: a line that reached
  /// journald after its process exited, read up to the first line of an earlier run); empty: any run.
  std::string invocation_id;
  /// Not empty: match SYSLOG_IDENTIFIER=identifier instead of the unit and invocation (the
  /// process backend's servers write to journald as "modeld-serve@NAME" from modeld's own unit).
  std::string identifier;
  /// Entries older than this are left out (realtime); a journal shared by several boots of a
  /// namespaced systemd holds earlier runs' lines of the same unit. Unset: no lower bound.
  std::optional<std::chrono::system_clock::time_point> since;
  std::size_t lines = 10;      ///< how many of the newest lines to return
  std::size_t max_line = 300;  ///< each line is cut to this many bytes, with "..." appended
  /// Empty: the local journal (SD_JOURNAL_LOCAL_ONLY: this machine's system and runtime files).
  /// Otherwise the journal files in this folder only (for tests).
  std::filesystem::path directory;
};

/// The newest output of a unit.
struct UnitOutput {
  std::vector<std::string> lines;  ///< the newest lines, oldest first, cleaned by journal_line_text()
  /// The newest entry's cursor; empty when the unit has written nothing yet. It changes whenever
  /// the unit writes a line, which is what tells a loading server from a silent one.
  std::string newest_cursor;
  std::optional<std::chrono::system_clock::time_point> newest_time;  ///< the newest entry's realtime
};

/// One journal MESSAGE fit for one line of an error or log message: control characters become
/// spaces, trailing white space goes, and text past `max_line` bytes is cut (at a UTF-8
/// character boundary) and followed by "...". Pure.
std::string journal_line_text(std::string_view message, std::size_t max_line);

/// An open journal, kept between reads so a poll every second does not re-open dozens of journal
/// files. Blocking: opening and reading touch journal files, so call it from a thread pool; one
/// thread at a time (sd_journal is not thread-safe), which a caller that awaits each read gives.
class UnitJournal {
 public:
  /// Opens the journal for `query`. io_error naming the unit (and folder) when it cannot be opened.
  static Result<std::unique_ptr<UnitJournal>> open(UnitJournalQuery query);
  ~UnitJournal();
  UnitJournal(const UnitJournal&) = delete;
  UnitJournal& operator=(const UnitJournal&) = delete;

  /// The newest `query.lines` lines of the unit, taking in journal files added or rotated since
  /// the last read. io_error naming the unit when the journal cannot be read.
  Result<UnitOutput> read();

  /// The query it was opened with.
  const UnitJournalQuery& query() const { return query_; }

 private:
  struct Handle;
  static Result<std::unique_ptr<Handle>> open_handle(const UnitJournalQuery& q);
  UnitJournal(UnitJournalQuery query, std::unique_ptr<Handle> handle);
  UnitJournalQuery query_;
  std::unique_ptr<Handle> handle_;
};

/// One-shot: opens the journal for `query`, reads it and closes it. Blocking; errors as
/// UnitJournal::open() and read().
Result<UnitOutput> read_unit_journal(const UnitJournalQuery& query);

}  // namespace modeld::sys
