#pragma once
// Golden files for the unit tests (tests/fixtures/golden/README.md): text a test makes is
// compared byte for byte with a committed file; a mismatch fails the check with the file's path
// and a unified diff. MODELD_UPDATE_GOLDEN=1 rewrites the files instead (a normal run never
// writes). JSON that is one line on the wire is shown pretty-printed in the diff, so that the
// field that changed stands on its own line.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::test {

/// The folder of the golden files: tests/fixtures/golden.
inline std::filesystem::path golden_dir() { return std::filesystem::path(MODELD_FIXTURES_DIR) / "golden"; }

/// Whether this run rewrites golden files (MODELD_UPDATE_GOLDEN=1) instead of comparing them.
inline bool updating_golden() {
  const char* v = std::getenv("MODELD_UPDATE_GOLDEN");
  return v && std::string_view(v) == "1";
}

namespace golden_detail {

// The lines of `text` without their '\n'; a last line without one is followed by diff's marker.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    auto nl = text.find('\n', i);
    if (nl == std::string::npos) {
      out.push_back(text.substr(i));
      out.emplace_back("\\ No newline at end of file");
      break;
    }
    out.push_back(text.substr(i, nl - i));
    i = nl + 1;
  }
  return out;
}

struct Edit {
  char op;            // ' ' kept, '-' only in the golden file, '+' only in the text made now
  std::size_t a, b;   // lines of the golden file and of the new text before this one
  std::string line;
};

// The shortest edit from `a` to `b` by longest common subsequence (golden files are small).
inline std::vector<Edit> edits(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<unsigned>> lcs(n + 1, std::vector<unsigned>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;)
    for (std::size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::vector<Edit> out;
  std::size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out.push_back({' ', i, j, a[i]});
      ++i, ++j;
    } else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) {
      out.push_back({'-', i, j, a[i]});
      ++i;
    } else {
      out.push_back({'+', i, j, b[j]});
      ++j;
    }
  }
  return out;
}

// One hunk, edits [from, to): its "@@ -a,n +b,m @@" header and lines.
inline std::string hunk(const std::vector<Edit>& e, std::size_t from, std::size_t to) {
  std::size_t na = 0, nb = 0;
  std::string body;
  for (std::size_t k = from; k < to; ++k) {
    na += e[k].op != '+';
    nb += e[k].op != '-';
    body += e[k].op + e[k].line + "\n";
  }
  std::ostringstream head;
  head << "@@ -" << e[from].a + (na ? 1 : 0) << "," << na << " +" << e[from].b + (nb ? 1 : 0) << "," << nb << " @@\n";
  return head.str() + body;
}

}  // namespace golden_detail

/// A unified diff (3 lines of context) from `expected` to `actual`, headed by the two names.
inline std::string unified_diff(const std::string& expected, const std::string& actual, const std::string& from_name,
                                const std::string& to_name) {
  const auto e = golden_detail::edits(golden_detail::lines_of(expected), golden_detail::lines_of(actual));
  constexpr std::size_t context = 3;
  std::string out = "--- " + from_name + "\n+++ " + to_name + "\n";
  std::size_t k = 0;
  while (k < e.size()) {
    while (k < e.size() && e[k].op == ' ') ++k;
    if (k == e.size()) break;
    const std::size_t from = k > context ? k - context : 0;
    std::size_t last = k;  // the last changed edit of this hunk
    for (std::size_t j = k; j < e.size() && j <= last + 2 * context; ++j)
      if (e[j].op != ' ') last = j;
    const std::size_t to = std::min(e.size(), last + context + 1);
    out += golden_detail::hunk(e, from, to);
    k = last + 1;
  }
  return out;
}

/// `text` pretty-printed (2 spaces, a newline at the end) when it is JSON, else nullopt.
inline std::optional<std::string> pretty_json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

/// Compares `actual` with tests/fixtures/golden/`name` byte for byte (a failed check with the
/// path and a unified diff when they differ or the file is missing); with MODELD_UPDATE_GOLDEN=1
/// writes `actual` there instead. Blocks (reads or writes one file).
inline void check_golden(const std::string& name, const std::string& actual) {
  const auto path = golden_dir() / name;
  if (updating_golden()) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << actual;
    WARN("golden file rewritten: " << path.string());
    SUCCEED();
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    FAIL_CHECK("golden file " << path.string() << " is missing (MODELD_UPDATE_GOLDEN=1 writes it; README.md)");
    return;
  }
  const std::string expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (expected == actual) {
    SUCCEED();
    return;
  }
  std::string note;
  std::string shown_expected = expected, shown_actual = actual;
  auto pe = pretty_json(expected), pa = pretty_json(actual);
  if (pe && pa && *pe != *pa) {
    shown_expected = *pe;
    shown_actual = *pa;
    note = "(JSON pretty-printed for the diff; the file is compared byte for byte)\n";
  }
  // The diff goes to stderr as it is: Catch2 would wrap its long lines.
  std::cerr << "output differs from golden file " << path.string() << "\n"
            << note << unified_diff(shown_expected, shown_actual, path.string(), "made now")
            << "(MODELD_UPDATE_GOLDEN=1 rewrites it, if the change is intended)\n";
  FAIL_CHECK("output differs from golden file " << path.string() << " (unified diff on stderr)");
}

}  // namespace modeld::test
