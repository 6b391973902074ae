#pragma once
// Output that follows a deployment as it moves: a block of lines redrawn in place on a terminal,
// and a limit on how often progress is printed where each print stays (logs, CI, pipes).

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace modelctl {

/// The width of the terminal on file descriptor `fd` in columns and its height in rows; 0, 0
/// when it is not a terminal or does not say.
struct TerminalSize {
  std::size_t columns = 0;
  std::size_t rows = 0;
};
TerminalSize terminal_size(int fd);

/// A block of lines at the bottom of a terminal, redrawn in place: each draw() moves the cursor
/// back over the previous one, clears it and prints the new lines, each cut to the terminal's
/// width (a wrapped line would throw off the count) and the block to its height.
class LiveBlock {
 public:
  /// Draws on `out`, a terminal whose size is read from `fd` before every draw.
  explicit LiveBlock(std::FILE* out = stdout, int fd = 1) : out_(out), fd_(fd) {}

  /// Replaces what the previous draw() printed with `lines`, and flushes.
  void draw(const std::vector<std::string>& lines);

  /// Keeps the block drawn last on screen: the next draw() starts below it.
  void keep() { drawn_ = 0; }

  /// Whether a block is on screen that the next draw() replaces.
  bool showing() const { return drawn_ > 0; }

 private:
  std::FILE* out_;
  int fd_;
  std::size_t drawn_ = 0;
};

/// Decides when progress is worth printing again: at most once per `every`, and always when it
/// is forced (the end of a download) unless the text is the one printed last.
class Throttle {
 public:
  explicit Throttle(std::chrono::milliseconds every) : every_(every) {}

  /// Whether `text` should be printed now; when true, it counts as printed.
  bool due(const std::string& text, bool force);

 private:
  std::chrono::milliseconds every_;
  std::string last_;
  std::chrono::steady_clock::time_point last_time_{};
};

/// How often progress may be printed where every print stays (not a terminal): often enough
/// to see a download move, seldom enough that a log of a long one stays readable.
constexpr std::chrono::milliseconds plain_progress_interval{2000};

/// How often a terminal view is redrawn for progress alone (phase and state changes redraw at once).
constexpr std::chrono::milliseconds live_progress_interval{100};

}  // namespace modelctl
