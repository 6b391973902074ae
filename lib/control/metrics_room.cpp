// Which connection of the TCP /metrics listener to close for room, and the journal's summary.

#include "control/metrics_room.hpp"

#include <fmt/format.h>

#include <tuple>

namespace modeld::control::detail {

void MetricsRoom::add(std::uint64_t id, const Address& peer, Clock::time_point now) {
  conns_.insert_or_assign(id, Conn{peer, now, false});
}

void MetricsRoom::progressed(std::uint64_t id, Clock::time_point now) {
  if (auto it = conns_.find(id); it != conns_.end()) it->second.progress = now;
}

void MetricsRoom::set_answering(std::uint64_t id, bool answering) {
  if (auto it = conns_.find(id); it != conns_.end()) it->second.answering = answering;
}

void MetricsRoom::spoke(std::uint64_t id) {
  if (auto it = conns_.find(id); it != conns_.end()) it->second.spoke = true;
}

void MetricsRoom::remove(std::uint64_t id) { conns_.erase(id); }

auto MetricsRoom::find(std::uint64_t id) const -> const Conn* {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

std::size_t MetricsRoom::held_by(const Address& peer) const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.peer == peer ? 1 : 0;
  return n;
}

auto MetricsRoom::full(const Address& peer, Clock::time_point now) const -> std::optional<Full> {
  const std::size_t mine = held_by(peer);
  const bool address_full = mine >= limits_.per_address_connections;
  if (!address_full && conns_.size() < limits_.max_connections) return std::nullopt;
  Full f;
  f.why = address_full ? fmt::format("{} has {} connections open, the most one address may hold "
                                     "(metrics.per_address_connections)", peer.to_string(), mine)
                       : fmt::format("{} connections are open, the most the listener serves at once "
                                     "(metrics.max_connections)", conns_.size());
  f.victim = victim(address_full ? &peer : nullptr, now);
  return f;
}

std::optional<std::uint64_t> MetricsRoom::victim(const Address* peer, Clock::time_point now) const {
  std::map<Address, std::size_t> held;
  for (const auto& [id, c] : conns_) ++held[c.peer];
  // Larger is closed first: stale (no progress for served_recently), then, within one address's
  // room and among fresh ones, waiting for a request before being answered (a scrape whose request was read outlives
  // connections that reopen and stall as fast as they are closed), and of those first one that sent
  // part of a request and stopped (a scrape connected a moment ago may not have sent its request
  // yet), then address holding more, staler.
  auto rank = [&](const Conn& c) {
    const auto idle = now - c.progress;
    const bool stale = idle >= served_recently;
    const bool waiting = peer != nullptr && !stale && !c.answering;
    return std::tuple(stale, waiting, waiting && c.spoke, held[c.peer], idle);
  };
  std::optional<std::uint64_t> best;
  std::tuple<bool, bool, bool, std::size_t, Clock::duration> best_rank{};
  for (const auto& [id, c] : conns_) {
    if (peer && c.peer != *peer) continue;
    const auto r = rank(c);
    if (!best || r > best_rank || (r == best_rank && id < *best)) {
      best = id;
      best_rank = r;
    }
  }
  return best;
}

std::optional<std::string> ClosedNotes::closed(const std::string& from, Clock::time_point now) {
  if (by_address_.count(from) || by_address_.size() < named) ++by_address_[from];
  else ++unnamed_;
  const auto n = rate_.count(now);
  if (!n) return std::nullopt;
  std::vector<std::string> items;
  for (const auto& [address, count] : by_address_) items.push_back(fmt::format("{} ({})", address, count));
  std::string s = fmt::format("{} connection(s) closed since the last line, from {}", *n, fmt::join(items, ", "));
  if (unnamed_) s += fmt::format(", and {} from other addresses", unnamed_);
  by_address_.clear();
  unnamed_ = 0;
  return s;
}

}  // namespace modeld::control::detail
