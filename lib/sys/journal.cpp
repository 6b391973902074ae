#include "sys/journal.hpp"

#include <systemd/sd-journal.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace modeld::sys {

namespace {

std::string why(int r) { return std::strerror(r < 0 ? -r : r); }

std::string where(const UnitJournalQuery& q) {
  return q.directory.empty() ? std::string("the journal") : fmt::format("the journal in {}", q.directory.string());
}

}  // namespace

std::string journal_line_text(std::string_view message, std::size_t max_line) {
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r' || message.back() == ' ' ||
                              message.back() == '\t'))
    message.remove_suffix(1);
  bool cut = message.size() > max_line;
  if (cut) {
    std::size_t end = max_line;
    // Never split a UTF-8 sequence: back up over continuation bytes to the start of a character.
    while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
    message = message.substr(0, end);
  }
  std::string out;
  out.reserve(message.size() + 3);
  for (char c : message) {
    auto u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7F ? ' ' : c);
  }
  if (cut) out += "...";
  return out;
}

struct UnitJournal::Handle {
  sd_journal* j = nullptr;
  // Whether sd_journal_get_fd() set up inotify: only then does sd_journal_process() notice
  // journal files added by a rotation. Without it every read re-opens the journal, or the newest
  // lines of a long load would go unseen once journald rotates, and the server would look silent.
  bool watching = false;
  ~Handle() { sd_journal_close(j); }
};

namespace {

// Whether the entry under the journal's cursor is from an earlier run of the unit than the one
// `q` asks for: another _SYSTEMD_INVOCATION_ID. A line without one (it reached journald after its
// process exited) counts as the newest run's.
bool from_earlier_run(sd_journal* j, const UnitJournalQuery& q) {
  if (!q.identifier.empty() || q.invocation_id.empty()) return false;
  const void* data = nullptr;
  std::size_t len = 0;
  if (sd_journal_get_data(j, "_SYSTEMD_INVOCATION_ID", &data, &len) < 0) return false;
  std::string_view field(static_cast<const char*>(data), len);
  constexpr std::string_view prefix = "_SYSTEMD_INVOCATION_ID=";
  if (field.substr(0, prefix.size()) == prefix) field.remove_prefix(prefix.size());
  return field != q.invocation_id;
}

}  // namespace

UnitJournal::UnitJournal(UnitJournalQuery query, std::unique_ptr<Handle> handle)
    : query_(std::move(query)), handle_(std::move(handle)) {}

UnitJournal::~UnitJournal() = default;

Result<std::unique_ptr<UnitJournal::Handle>> UnitJournal::open_handle(const UnitJournalQuery& q) {
  auto h = std::make_unique<UnitJournal::Handle>();
  int r = q.directory.empty() ? sd_journal_open(&h->j, SD_JOURNAL_LOCAL_ONLY)
                              : sd_journal_open_directory(&h->j, q.directory.c_str(), 0);
  if (r < 0) {
    h->j = nullptr;
    return make_error(Errc::io_error, fmt::format("cannot open {} to read {}'s lines: {}", where(q), q.unit, why(r)));
  }
  // By unit only: the run is told apart while reading (from_earlier_run), since a line that reaches
  // journald after its process exited carries the unit but no _SYSTEMD_INVOCATION_ID, and such
  // lines (a server failing at once: bad arguments, out of memory) are the ones that matter.
  std::string unit_match = q.identifier.empty() ? "_SYSTEMD_UNIT=" + q.unit : "SYSLOG_IDENTIFIER=" + q.identifier;
  r = sd_journal_add_match(h->j, unit_match.data(), unit_match.size());
  if (r < 0)
    return make_error(Errc::io_error, fmt::format("cannot filter {} for {}: {}", where(q), q.unit, why(r)));
  h->watching = sd_journal_get_fd(h->j) >= 0;
  return h;
}

Result<std::unique_ptr<UnitJournal>> UnitJournal::open(UnitJournalQuery query) {
  auto h = open_handle(query);
  if (!h) return h.error();
  return std::unique_ptr<UnitJournal>(new UnitJournal(std::move(query), std::move(*h)));
}

Result<UnitOutput> UnitJournal::read() {
  if (handle_->watching) {
    // Takes in files added (rotation) or removed since the last read; the answer (nothing new,
    // appended, invalidated) does not matter, as every read seeks to the tail again.
    (void)sd_journal_process(handle_->j);
  } else {
    auto h = open_handle(query_);
    if (!h) return h.error();
    handle_ = std::move(*h);
  }
  sd_journal* j = handle_->j;
  const auto& q = query_;
  int r = sd_journal_seek_tail(j);
  if (r < 0) return make_error(Errc::io_error, fmt::format("cannot read {} for {}: {}", where(q), q.unit, why(r)));

  UnitOutput out;
  std::uint64_t since_us = 0;
  if (q.since)
    since_us = static_cast<std::uint64_t>(std::max<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(q.since->time_since_epoch()).count()));
  std::vector<std::string> newest_first;
  while (newest_first.size() < q.lines || out.newest_cursor.empty()) {
    r = sd_journal_previous(j);
    if (r < 0) return make_error(Errc::io_error, fmt::format("cannot read {} for {}: {}", where(q), q.unit, why(r)));
    if (r == 0) break;
    std::uint64_t t = 0;
    if (sd_journal_get_realtime_usec(j, &t) < 0) continue;
    if (t < since_us) break;
    // Reading newest first: once an earlier run's line shows, everything further back is older.
    if (from_earlier_run(j, q)) break;
    if (out.newest_cursor.empty()) {
      char* cursor = nullptr;
      if (sd_journal_get_cursor(j, &cursor) >= 0 && cursor) {
        out.newest_cursor = cursor;
        out.newest_time = std::chrono::system_clock::time_point(
            std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::microseconds(t)));
      }
      std::free(cursor);
    }
    if (newest_first.size() >= q.lines) break;
    const void* data = nullptr;
    std::size_t len = 0;
    if (sd_journal_get_data(j, "MESSAGE", &data, &len) < 0) continue;
    std::string_view field(static_cast<const char*>(data), len);
    constexpr std::string_view prefix = "MESSAGE=";
    if (field.substr(0, prefix.size()) == prefix) field.remove_prefix(prefix.size());
    newest_first.push_back(journal_line_text(field, q.max_line));
  }
  out.lines.assign(newest_first.rbegin(), newest_first.rend());
  return out;
}

Result<UnitOutput> read_unit_journal(const UnitJournalQuery& query) {
  auto journal = UnitJournal::open(query);
  if (!journal) return journal.error();
  return (*journal)->read();
}

}  // namespace modeld::sys
