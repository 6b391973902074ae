#include "sys/journal.hpp"

#include "unit/http/catch_result.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <unistd.h>

using namespace modeld;
using namespace modeld::sys;

TEST_CASE("a journal line loses its trailing newline and control characters") {
  CHECK(journal_line_text("INFO loading\tshard 1\x1b[0m\n", 300) == "INFO loading shard 1 [0m");
  CHECK(journal_line_text("  kept leading space \r\n", 300) == "  kept leading space");
  CHECK(journal_line_text("", 300).empty());
}

TEST_CASE("a long journal line is cut at the limit with an ellipsis") {
  std::string line(400, 'x');
  auto out = journal_line_text(line, 300);
  CHECK(out == std::string(300, 'x') + "...");
  CHECK(journal_line_text(std::string(300, 'y'), 300) == std::string(300, 'y'));
}

TEST_CASE("a journal line is never cut inside a UTF-8 character") {
  // "é" is two bytes; a cut after 4 bytes of "aaaé" would fall between them.
  std::string line = "aaa\xc3\xa9zzz";
  CHECK(journal_line_text(line, 4) == "aaa...");
  CHECK(journal_line_text(line, 5) == "aaa\xc3\xa9...");
}

TEST_CASE("a journal folder without files gives a unit no lines and no cursor") {
  auto dir = std::filesystem::temp_directory_path() / ("modeld-journal-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  UnitJournalQuery q;
  q.unit = "modeld-serve@kimi.service";
  q.invocation_id = "0123456789abcdef0123456789abcdef";
  q.directory = dir;
  auto journal = UnitJournal::open(q);
  REQUIRE(journal);
  auto out = (*journal)->read();
  REQUIRE(out);
  CHECK(out->lines.empty());
  CHECK(out->newest_cursor.empty());
  CHECK_FALSE(out->newest_time);
  // A second read of the same open journal works the same way.
  REQUIRE((*journal)->read());
  std::filesystem::remove_all(dir);
}

TEST_CASE("a journal folder that cannot be opened is io_error naming the unit and folder") {
  UnitJournalQuery q;
  q.unit = "modeld-serve@kimi.service";
  q.directory = "/nonexistent/modeld-journal";
  auto out = read_unit_journal(q);
  REQUIRE_FALSE(out);
  CHECK(out.error().code == Errc::io_error);
  CHECK(out.error().message.find("modeld-serve@kimi.service") != std::string::npos);
  CHECK(out.error().message.find("/nonexistent/modeld-journal") != std::string::npos);
}
