#pragma once
// Byte ranges of a file that are on disk: the download engine writes a file in several parts at
// once, and its partial file's sidecar records which ranges hold received bytes.

#include <cstdint>
#include <vector>

namespace modeld::fetch {

/// A half-open byte range [begin, end) of a file, in bytes.
struct ByteRange {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;

  /// end - begin, in bytes.
  std::uint64_t size() const { return end - begin; }
  bool operator==(const ByteRange&) const = default;
};

/// A set of bytes kept as sorted, disjoint, non-adjacent ranges (adding merges neighbours).
class RangeSet {
 public:
  /// Adds [r.begin, r.end); an empty range is ignored.
  void add(ByteRange r);

  /// The end of the run of covered bytes that starts at `at` (== `at` when byte `at` is not
  /// covered).
  std::uint64_t contiguous_end(std::uint64_t at) const;

  /// The ranges of [0, size) not covered, in order.
  std::vector<ByteRange> gaps(std::uint64_t size) const;

  /// Keeps only the bytes below `size` (a range past a file's end cannot be data).
  void clip(std::uint64_t size);

  /// Bytes covered.
  std::uint64_t total() const;

  /// The ranges, sorted and disjoint.
  const std::vector<ByteRange>& items() const { return items_; }

  bool empty() const { return items_.empty(); }
  bool operator==(const RangeSet&) const = default;

 private:
  std::vector<ByteRange> items_;
};

}  // namespace modeld::fetch
