#pragma once
// The TCP /metrics listener's accounting of its connections against its limits: which connection
// to close to make room for a new one, and the summary of those closed that its journal lines
// carry. Internal to lib/control (it pulls in Asio); times are passed in, so that the choice is
// tested without sockets or clocks.

#include "control/metrics.hpp"
#include "util/throttle.hpp"

#include <boost/asio/ip/address.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

namespace modeld::control::detail {

/// How long a connection that made progress is kept out of harm's way: it is closed for room only
/// when every connection that could make room has made progress as recently.
inline constexpr std::chrono::seconds served_recently{1};

/// The open connections of the TCP /metrics listener by id, as its limits see them.
class MetricsRoom {
 public:
  using Clock = std::chrono::steady_clock;
  using Address = boost::asio::ip::address;

  /// One open connection as the limits see it.
  struct Conn {
    Address peer;                ///< the peer IP address (IPv4-mapped IPv6 as IPv4)
    Clock::time_point progress;  ///< accepted, or last read a request byte or wrote an answer byte
    bool answering = false;      ///< a request was read whole and its answer is not written yet
    bool spoke = false;          ///< the peer sent a byte (read, or seen waiting in the socket)
  };

  /// A new connection that does not fit: why (naming the limit's key), and the one to close.
  struct Full {
    std::string why;                      ///< "... (metrics.max_connections)" or per_address_connections
    std::optional<std::uint64_t> victim;  ///< nullopt only when no connection could make room
  };

  /// An empty room under `limits`.
  explicit MetricsRoom(MetricsLimits limits) : limits_(limits) {}

  /// Counts connection `id` from `peer`, accepted at `now` (its first progress).
  void add(std::uint64_t id, const Address& peer, Clock::time_point now);

  /// Notes that `id` read a request byte or wrote an answer byte at `now`; unknown ids are ignored.
  void progressed(std::uint64_t id, Clock::time_point now);

  /// Notes whether `id` is answering a request (true) or waiting for one (false).
  void set_answering(std::uint64_t id, bool answering);

  /// Notes that the peer of `id` sent a byte (read, or seen waiting unread); unknown ids are ignored.
  void spoke(std::uint64_t id);

  /// Stops counting `id`; unknown ids are ignored.
  void remove(std::uint64_t id);

  /// The connection `id`, or nullptr when it is not counted.
  const Conn* find(std::uint64_t id) const;

  /// Connections counted now.
  std::size_t size() const { return conns_.size(); }

  /// Connections counted now from `peer`.
  std::size_t held_by(const Address& peer) const;

  /// nullopt when one more connection from `peer` fits both limits; else why not and the victim.
  std::optional<Full> full(const Address& peer, Clock::time_point now) const;

  /// The connection to close for room at `now`, among `peer`'s when given, else among all: first
  /// those without progress for served_recently, then (among `peer`'s fresh ones) those waiting for
  /// a request before those being answered, then those of the address holding the most, then the
  /// longest without progress, whether it waits for a request or for its answer to be read.
  std::optional<std::uint64_t> victim(const Address* peer, Clock::time_point now) const;

 private:
  MetricsLimits limits_;
  std::unordered_map<std::uint64_t, Conn> conns_;
};

/// Counts the connections closed for room, by peer address, between two journal lines (at most
/// one per 10 s), so that each line names every address that lost connections since the last.
class ClosedNotes {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t named = 16;  ///< addresses named in one line; more are counted

  /// Counts one connection of `from` closed at `now`; returns the summary when a line is due now
  /// ("3 connection(s) closed since the last line, from 127.0.0.2 (2), 127.0.0.3 (1)"), else nullopt.
  std::optional<std::string> closed(const std::string& from, Clock::time_point now = Clock::now());

 private:
  util::LogThrottle rate_{std::chrono::seconds(10)};
  std::map<std::string, std::size_t> by_address_;
  std::size_t unnamed_ = 0;
};

}  // namespace modeld::control::detail
