// Redrawing in place uses only "cursor up", "carriage return" and "erase below" (ECMA-48), which
// every terminal emulator and tmux understand; nothing is drawn on an alternate screen, so the
// last view stays readable after Ctrl-C.

#include "modelctl/live.hpp"

#include "modelctl/format.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>

#include <algorithm>

namespace modelctl {

TerminalSize terminal_size(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0) return {};
  return {ws.ws_col, ws.ws_row};
}

void LiveBlock::draw(const std::vector<std::string>& lines) {
  const auto size = terminal_size(fd_);
  std::string out;
  if (drawn_ > 0) out += fmt::format("\x1b[{}A", drawn_);  // up to the block's first line
  out += "\r\x1b[J";
  // One row stays free for the cursor, or the terminal would scroll and the block move.
  std::size_t max_rows = size.rows > 1 ? size.rows - 1 : lines.size();
  std::size_t n = std::min(lines.size(), max_rows);
  // A line exactly as wide as the terminal leaves the cursor at its end on some terminals and
  // wraps on others; one column less is the same everywhere.
  const std::size_t columns = size.columns > 1 ? size.columns - 1 : 0;
  for (std::size_t i = 0; i < n; ++i) {
    out += fit_width(lines[i], columns);
    out += '\n';
  }
  std::fputs(out.c_str(), out_);
  std::fflush(out_);
  drawn_ = n;
}

bool Throttle::due(const std::string& text, bool force) {
  auto now = std::chrono::steady_clock::now();
  if (text.empty() || text == last_) return false;
  if (!force && now - last_time_ < every_) return false;
  last_ = text;
  last_time_ = now;
  return true;
}

}  // namespace modelctl
