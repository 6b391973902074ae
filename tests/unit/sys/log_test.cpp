#include "sys/log.hpp"
#include "unit/sys/captured_stderr.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <string>
#include <unistd.h>

using namespace modeld::sys;
using modeld::sys::test::CapturedStderr;

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool has_name(const std::vector<std::string>& v, const std::string& name) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& f) { return f.rfind(name + "=", 0) == 0; });
}

}  // namespace

TEST_CASE("a journal entry carries the message, priority, identifier and only the fields that are set") {
  Fields f;
  f.model = "kimi";
  f.phase = "downloading";
  auto j = journal_fields(Level::info, f, "Got 37% of kimi.");
  REQUIRE(j.size() == 5);
  CHECK(j[0] == "MESSAGE=Got 37% of kimi.");
  CHECK(j[1] == "PRIORITY=6");
  CHECK(j[2] == "SYSLOG_IDENTIFIER=modeld");
  CHECK(has(j, "MODELD_MODEL=kimi"));
  CHECK(has(j, "MODELD_PHASE=downloading"));
  CHECK_FALSE(has_name(j, "MODELD_DEPLOYMENT"));
  CHECK_FALSE(has_name(j, "MODELD_STATE"));
  CHECK_FALSE(has_name(j, "MESSAGE_ID"));
}

TEST_CASE("every structured field that is set reaches the journal entry") {
  Fields f{"d-42", "kimi", "launching", "succeeded", "0123456789abcdef0123456789abcdef",
           {{"MODELD_FILE", "x.safetensors"}}};
  auto j = journal_fields(Level::notice, f, "done");
  CHECK(has(j, "MODELD_DEPLOYMENT=d-42"));
  CHECK(has(j, "MODELD_MODEL=kimi"));
  CHECK(has(j, "MODELD_PHASE=launching"));
  CHECK(has(j, "MODELD_STATE=succeeded"));
  CHECK(has(j, "MESSAGE_ID=0123456789abcdef0123456789abcdef"));
  CHECK(has(j, "MODELD_FILE=x.safetensors"));
  CHECK(j.size() == 9);
}

TEST_CASE("levels map to syslog priorities, notice included") {
  CHECK(journal_fields(Level::debug, {}, "m")[1] == "PRIORITY=7");
  CHECK(journal_fields(Level::info, {}, "m")[1] == "PRIORITY=6");
  CHECK(journal_fields(Level::notice, {}, "m")[1] == "PRIORITY=5");
  CHECK(journal_fields(Level::warning, {}, "m")[1] == "PRIORITY=4");
  CHECK(journal_fields(Level::error, {}, "m")[1] == "PRIORITY=3");
}

TEST_CASE("extra field names are made valid journal field names") {
  Fields f;
  f.extra = {{"modeld_file", "a"},       {"my-field.x", "b"},  {"_TRUSTED", "c"},
             {"9lives", "d"},            {"", "e"},            {"---", "f"},
             {"MODELD_EMPTY", ""},       {"message", "spoof"}, {"modeld_model", "spoof"},
             {std::string(80, 'k'), "g"}};
  auto j = journal_fields(Level::info, f, "m");
  CHECK(has(j, "MODELD_FILE=a"));
  CHECK(has(j, "MY_FIELD_X=b"));
  CHECK(has(j, "TRUSTED=c"));
  CHECK(has(j, "MODELD_9LIVES=d"));
  CHECK(has(j, std::string(64, 'K') + "=g"));
  CHECK_FALSE(has_name(j, "MODELD_EMPTY"));
  CHECK_FALSE(has(j, "MESSAGE=spoof"));
  CHECK_FALSE(has(j, "MODELD_MODEL=spoof"));
  CHECK(j.size() == 3 + 5);
  for (const auto& field : j) {
    auto name = field.substr(0, field.find('='));
    CHECK(name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == std::string::npos);
    CHECK(name.size() <= 64);
    CHECK(name[0] != '_');
  }
}

TEST_CASE("a message is one journal line: a Hub's newline or ESC in it is escaped, extra fields keep the bytes") {
  // A file name from a Hub listing that would forge a line in `journalctl -o cat` and recolour
  // the terminal.
  const std::string file = "notes\n\x1b[32mmodeld: deployment succeeded\x1b[0m.json";
  Fields f;
  f.extra = {{"MODELD_FILE", file}};
  auto j = journal_fields(Level::error, f, "checksum mismatch in " + file + "\r\x7f");
  CHECK(j[0] == "MESSAGE=checksum mismatch in notes\\n\\u001b[32mmodeld: deployment succeeded\\u001b[0m.json\\r\\u007f");
  CHECK(j.back() == "MODELD_FILE=" + file);
  auto multi = journal_fields(Level::error, {}, "first\nsecond");
  CHECK(multi[0] == "MESSAGE=first\\nsecond");
}

TEST_CASE("stderr lines escape control characters of the message too") {
  CHECK(stderr_line(Level::info, {}, "a\nINFO b\x1b[2J", false) == "INFO a\\nINFO b\\u001b[2J\n");
  CHECK(stderr_line(Level::error, {}, "boom", true).find("boom\n") != std::string::npos);
}

TEST_CASE("stderr lines show the level, then model and phase in brackets when set") {
  Fields f;
  f.model = "kimi";
  f.phase = "downloading";
  CHECK(stderr_line(Level::info, f, "Got 37%", false) == "INFO [kimi downloading] Got 37%\n");
  CHECK(stderr_line(Level::error, {}, "boom", false) == "ERROR boom\n");
  Fields p;
  p.phase = "planning";
  CHECK(stderr_line(Level::warning, p, "x", false) == "WARNING [planning] x\n");
  Fields m;
  m.model = "qwen";
  CHECK(stderr_line(Level::notice, m, "x", false) == "NOTICE [qwen] x\n");
}

TEST_CASE("colour wraps only the level name in ANSI escapes") {
  auto line = stderr_line(Level::error, {}, "boom", true);
  CHECK(line.find("\033[") == 0);
  CHECK(line.find("ERROR\033[0m boom\n") != std::string::npos);
  CHECK(stderr_line(Level::error, {}, "boom", false).find('\033') == std::string::npos);
}

TEST_CASE("the stderr sink writes plain lines to a file and drops debug lines unless verbose") {
  Fields f;
  f.model = "kimi";
  f.phase = "verifying";
  std::string text;
  {
    CapturedStderr cap;  // a regular file, not a terminal: no colour
    init_logging(Sink::stderr_only, false);
    log(Level::notice, f, "checked {} files");  // braces are text, not a format string
    log(Level::debug, f, "hidden");
    text = cap.text();
  }
  CHECK(text == "NOTICE [kimi verifying] checked {} files\n");
  {
    CapturedStderr cap;
    init_logging(Sink::stderr_only, true);
    logf(Level::debug, "shown {}", 1);
    text = cap.text();
  }
  CHECK(text == "DEBUG shown 1\n");
}

TEST_CASE("automatic logging goes to stderr when $JOURNAL_STREAM names another stream") {
  std::string text;
  {
    CapturedStderr cap;
    ::setenv("JOURNAL_STREAM", "1:1", 1);
    init_logging(Sink::automatic, false);
    ::unsetenv("JOURNAL_STREAM");
    log(Level::warning, {}, "to stderr");
    text = cap.text();
  }
  CHECK(text == "WARNING to stderr\n");
}
