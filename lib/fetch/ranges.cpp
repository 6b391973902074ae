#include "fetch/ranges.hpp"

#include <algorithm>

namespace modeld::fetch {

void RangeSet::add(ByteRange r) {
  if (r.end <= r.begin) return;
  // The first range that ends at or after r.begin may touch or overlap r; merge all that do.
  auto it = std::lower_bound(items_.begin(), items_.end(), r.begin,
                             [](const ByteRange& x, std::uint64_t v) { return x.end < v; });
  auto first = it;
  while (it != items_.end() && it->begin <= r.end) {
    r.begin = std::min(r.begin, it->begin);
    r.end = std::max(r.end, it->end);
    ++it;
  }
  it = items_.erase(first, it);
  items_.insert(it, r);
}

std::uint64_t RangeSet::contiguous_end(std::uint64_t at) const {
  for (const auto& r : items_)
    if (r.begin <= at && at < r.end) return r.end;
  return at;
}

std::vector<ByteRange> RangeSet::gaps(std::uint64_t size) const {
  std::vector<ByteRange> out;
  std::uint64_t pos = 0;
  for (const auto& r : items_) {
    if (r.begin >= size) break;
    if (r.begin > pos) out.push_back({pos, r.begin});
    pos = std::max(pos, r.end);
  }
  if (pos < size) out.push_back({pos, size});
  return out;
}

void RangeSet::clip(std::uint64_t size) {
  std::vector<ByteRange> kept;
  for (auto r : items_) {
    if (r.begin >= size) break;
    r.end = std::min(r.end, size);
    kept.push_back(r);
  }
  items_ = std::move(kept);
}

std::uint64_t RangeSet::total() const {
  std::uint64_t n = 0;
  for (const auto& r : items_) n += r.size();
  return n;
}

}  // namespace modeld::fetch
