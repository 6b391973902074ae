#include "sys/log.hpp"

#include "util/text.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <systemd/sd-journal.h>

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace modeld::sys {

namespace {

// What sys::log() hands to the sinks besides the text. spdlog's sink interface carries only a
// level and a payload, with no slot for key-value pairs, and spdlog has no "notice" level; the
// logger here is synchronous (no async queue), so the sinks run on the thread that called log(),
// inside that call. A thread_local pointer set around the spdlog call therefore reaches exactly
// the sinks of that one line, without encoding the fields into the text and parsing them back.
struct LineContext {
  Level level;
  const Fields* fields;
};
thread_local const LineContext* t_line = nullptr;

constexpr std::string_view kIdentifier = "modeld";

int syslog_priority(Level level) {
  switch (level) {
    case Level::debug: return 7;
    case Level::info: return 6;
    case Level::notice: return 5;
    case Level::warning: return 4;
    case Level::error: return 3;
  }
  return 6;
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::debug: return spdlog::level::debug;
    case Level::info:
    case Level::notice: return spdlog::level::info;
    case Level::warning: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// For lines that reach the sinks through spdlog directly (another library's spdlog::info call),
// where no LineContext is set.
Level from_spdlog(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug: return Level::debug;
    case spdlog::level::info: return Level::info;
    case spdlog::level::warn: return Level::warning;
    default: return Level::error;
  }
}

// The level and fields of the line being written: those log() set, else a bare line.
struct Resolved {
  Level level;
  const Fields* fields;
};
Resolved resolve(const spdlog::details::log_msg& msg) {
  static const Fields empty;
  if (t_line) return {t_line->level, t_line->fields};
  return {from_spdlog(msg.level), &empty};
}

std::string_view payload(const spdlog::details::log_msg& msg) {
  return {msg.payload.data(), msg.payload.size()};
}

// Journal field names are [A-Z0-9_], may not start with a digit or '_' (those are trusted
// fields the journal sets itself and would reject), and are at most 64 characters.
std::string sanitize_field_name(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    bool ok = (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out.push_back(ok ? c : '_');
  }
  auto first = out.find_first_not_of('_');
  if (first == std::string::npos) return {};
  out.erase(0, first);
  if (out[0] >= '0' && out[0] <= '9') out.insert(0, "MODELD_");
  if (out.size() > 64) out.resize(64);
  return out;
}

void write_stderr(std::string_view line) {
  // One fwrite per line so that lines from several threads do not interleave mid-line.
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// Sends each line to journald with the contract's structured fields. If journald cannot be
// reached (no /run/systemd/journal/socket), the line goes to stderr instead of being lost.
class JournalSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    auto r = resolve(msg);
    auto fields = journal_fields(r.level, *r.fields, payload(msg));
    std::vector<iovec> iov;
    iov.reserve(fields.size());
    for (auto& f : fields) iov.push_back(iovec{f.data(), f.size()});
    if (sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) < 0)
      write_stderr(stderr_line(r.level, *r.fields, payload(msg), false));
  }
  void flush_() override {}
};

class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit StderrSink(bool color) : color_(color) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    auto r = resolve(msg);
    write_stderr(stderr_line(r.level, *r.fields, payload(msg), color_));
  }
  void flush_() override { std::fflush(stderr); }

 private:
  bool color_;
};

// systemd.exec(5): $JOURNAL_STREAM is "DEVICE:INODE" of the stream stdout/stderr were connected
// to; it is inherited by children whose stderr may point elsewhere, so compare it with stderr.
bool stderr_is_journal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (!js || !*js) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

// https://no-color.org: NO_COLOR set to a non-empty value turns colour off.
bool stderr_wants_color() {
  const char* nc = std::getenv("NO_COLOR");
  if (nc && *nc) return false;
  return ::isatty(STDERR_FILENO) == 1;
}

std::mutex g_init_mutex;
std::shared_ptr<spdlog::logger> g_logger;  // guarded by g_init_mutex

std::shared_ptr<spdlog::logger> make_logger(Sink sink, bool verbose) {
  if (sink == Sink::automatic) sink = stderr_is_journal() ? Sink::journal : Sink::stderr_only;
  std::shared_ptr<spdlog::sinks::sink> s;
  if (sink == Sink::journal)
    s = std::make_shared<JournalSink>();
  else
    s = std::make_shared<StderrSink>(stderr_wants_color());
  auto logger = std::make_shared<spdlog::logger>(std::string(kIdentifier), std::move(s));
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  return logger;
}

std::shared_ptr<spdlog::logger> current_logger() {
  std::lock_guard lock(g_init_mutex);
  if (!g_logger) g_logger = make_logger(Sink::automatic, false);
  return g_logger;
}

}  // namespace

std::vector<std::string> journal_fields(Level level, const Fields& fields, std::string_view message) {
  std::vector<std::string> out;
  out.reserve(8 + fields.extra.size());
  out.push_back("MESSAGE=" + util::escape_control(message));
  out.push_back("PRIORITY=" + std::to_string(syslog_priority(level)));
  out.push_back("SYSLOG_IDENTIFIER=" + std::string(kIdentifier));
  static constexpr std::array<std::string_view, 8> reserved{
      "MESSAGE",      "PRIORITY",    "SYSLOG_IDENTIFIER", "MODELD_DEPLOYMENT",
      "MODELD_MODEL", "MODELD_PHASE", "MODELD_STATE",     "MESSAGE_ID"};
  auto add = [&](std::string_view name, const std::string& value) {
    if (!value.empty()) out.push_back(std::string(name) + "=" + value);
  };
  add(reserved[3], fields.deployment);
  add(reserved[4], fields.model);
  add(reserved[5], fields.phase);
  add(reserved[6], fields.state);
  add(reserved[7], fields.message_id);
  for (const auto& [name, value] : fields.extra) {
    auto clean = sanitize_field_name(name);
    if (clean.empty() || value.empty()) continue;
    bool taken = false;
    for (auto r : reserved) taken = taken || clean == r;
    if (!taken) out.push_back(clean + "=" + value);
  }
  return out;
}

std::string stderr_line(Level level, const Fields& fields, std::string_view message, bool color) {
  struct Style {
    std::string_view name, ansi;
  };
  static constexpr std::array<Style, 5> styles{{{"DEBUG", "\033[2m"},
                                                {"INFO", "\033[32m"},
                                                {"NOTICE", "\033[1m"},
                                                {"WARNING", "\033[33m"},
                                                {"ERROR", "\033[1;31m"}}};
  const auto& st = styles[static_cast<std::size_t>(level)];
  std::string out;
  out.reserve(message.size() + 48);
  if (color) out.append(st.ansi);
  out.append(st.name);
  if (color) out.append("\033[0m");
  if (!fields.model.empty() || !fields.phase.empty()) {
    out.append(" [");
    out.append(fields.model);
    if (!fields.model.empty() && !fields.phase.empty()) out.push_back(' ');
    out.append(fields.phase);
    out.push_back(']');
  }
  out.push_back(' ');
  out.append(util::escape_control(message));
  out.push_back('\n');
  return out;
}

void init_logging(Sink sink, bool verbose) {
  auto logger = make_logger(sink, verbose);
  std::lock_guard lock(g_init_mutex);
  g_logger = std::move(logger);
  // Lines other libraries write through spdlog's default logger reach the same sink.
  spdlog::set_default_logger(g_logger);
}

void log(Level level, const Fields& fields, std::string_view message) {
  LineContext ctx{level, &fields};
  const LineContext* saved = t_line;
  t_line = &ctx;
  try {
    current_logger()->log(to_spdlog(level), spdlog::string_view_t(message.data(), message.size()));
  } catch (...) {
    // Logging must never take the daemon down; spdlog already reports sink failures itself.
  }
  t_line = saved;
}

}  // namespace modeld::sys
