// The TCP /metrics listener's choice of the connection to close for room, and the journal's
// summary of those closed, with times given (no sockets, no clock).

#include "control/metrics_room.hpp"

#include <boost/asio/ip/address.hpp>
#include <catch2/catch.hpp>

#include <optional>

using namespace modeld::control;
using detail::ClosedNotes;
using detail::MetricsRoom;
using namespace std::chrono_literals;

namespace {

const auto t0 = MetricsRoom::Clock::time_point() + 1h;

MetricsRoom::Address ip(const char* text) { return boost::asio::ip::make_address(text); }

std::optional<std::uint64_t> id(std::uint64_t n) { return n; }

}  // namespace

TEST_CASE("a new connection fits below both limits, and names the limit it hits when it does not") {
  MetricsRoom room(MetricsLimits{3, 2});
  CHECK_FALSE(room.full(ip("127.0.0.2"), t0));
  room.add(1, ip("127.0.0.2"), t0);
  room.add(2, ip("127.0.0.2"), t0);
  auto own = room.full(ip("127.0.0.2"), t0);
  REQUIRE(own);
  CHECK_THAT(own->why, Catch::Contains("127.0.0.2 has 2 connections open"));
  CHECK_THAT(own->why, Catch::Contains("metrics.per_address_connections"));
  CHECK_FALSE(room.full(ip("127.0.0.3"), t0));
  room.add(3, ip("127.0.0.3"), t0);
  auto all = room.full(ip("127.0.0.4"), t0);
  REQUIRE(all);
  CHECK_THAT(all->why, Catch::Contains("3 connections are open"));
  CHECK_THAT(all->why, Catch::Contains("metrics.max_connections"));
}

TEST_CASE("at the per-address limit the victim is that address's connection longest without progress, in any state") {
  MetricsRoom room(MetricsLimits{16, 3});
  room.add(1, ip("127.0.0.2"), t0);
  room.add(2, ip("127.0.0.2"), t0);
  room.add(3, ip("127.0.0.2"), t0);
  room.add(4, ip("127.0.0.3"), t0 - 30s);  // another address's, older still: never this one's room
  room.set_answering(2, true);
  room.progressed(1, t0 + 5s);
  room.progressed(3, t0 + 4s);
  // 2 has written nothing since t0, its answer blocked: it goes first, although it is answering.
  CHECK(room.full(ip("127.0.0.2"), t0 + 6s)->victim == id(2));
  room.remove(2);
  room.add(5, ip("127.0.0.2"), t0 + 6s);
  CHECK(room.full(ip("127.0.0.2"), t0 + 6s)->victim == id(3));
}

TEST_CASE("at the per-address limit a fresh connection being answered outlives fresh ones waiting for a request") {
  // Stallers that send a request line and stop, reopened as soon as they are closed, beside a
  // scrape whose request was read: every new staller takes a staller's place, not the scrape's.
  MetricsRoom room(MetricsLimits{16, 4});
  room.add(1, ip("127.0.0.1"), t0);  // the scrape, oldest of the four
  room.set_answering(1, true);
  for (std::uint64_t n = 2; n <= 4; ++n) room.add(n, ip("127.0.0.1"), t0 + std::chrono::milliseconds(n));
  CHECK(room.full(ip("127.0.0.1"), t0 + 100ms)->victim == id(2));
  // Once its answer stalls for a second, it goes first like any stale connection.
  CHECK(room.full(ip("127.0.0.1"), t0 + 2s)->victim == id(1));
}

TEST_CASE("the pipelining attack: connections whose answers are never read make room for a scrape") {
  // 4 addresses x 4 connections (the defaults' 16), each blocked writing an answer its peer does
  // not read; the old rule closed only connections waiting for a request, and refused the scrape.
  MetricsRoom room(MetricsLimits{16, 4});
  std::uint64_t n = 0;
  for (const char* a : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
    for (int i = 0; i < 4; ++i) {
      room.add(++n, ip(a), t0 + std::chrono::milliseconds(n));
      room.set_answering(n, true);
    }
  auto full = room.full(ip("127.0.0.1"), t0 + 3s);
  REQUIRE(full);
  CHECK(full->victim == id(1));  // all hold 4: the longest without progress
  CHECK_THAT(full->why, Catch::Contains("metrics.max_connections"));
}

TEST_CASE("a connection that made progress within the last second is closed only when every candidate did") {
  MetricsRoom room(MetricsLimits{3, 3});
  room.add(1, ip("127.0.0.2"), t0);
  room.add(2, ip("127.0.0.2"), t0);
  room.add(3, ip("127.0.0.3"), t0);
  room.set_answering(1, true);
  room.progressed(1, t0 + 9500ms);  // being served: bytes written half a second ago
  room.progressed(2, t0 + 9800ms);
  // 127.0.0.2 holds the most, but both of its connections are being served: 3 goes.
  CHECK(room.victim(nullptr, t0 + 10s) == id(3));
  // When every one has made progress within the second, the busiest address's stalest goes.
  room.progressed(3, t0 + 9900ms);
  CHECK(room.victim(nullptr, t0 + 10s) == id(1));
}

TEST_CASE("at max_connections the address holding the most gives up its connection longest without progress") {
  MetricsRoom room(MetricsLimits{4, 3});
  room.add(1, ip("127.0.0.3"), t0 - 10s);  // the stalest, but its address holds one
  room.add(2, ip("127.0.0.2"), t0 - 2s);
  room.add(3, ip("127.0.0.2"), t0 - 5s);
  room.add(4, ip("127.0.0.2"), t0 - 3s);
  CHECK(room.full(ip("127.0.0.4"), t0)->victim == id(3));
  room.progressed(3, t0);  // a byte read now: the next stalest of 127.0.0.2 goes instead
  CHECK(room.full(ip("127.0.0.4"), t0)->victim == id(4));
}

TEST_CASE("no victim only when no connection could make room") {
  MetricsRoom room(MetricsLimits{1, 1});
  CHECK_FALSE(room.victim(nullptr, t0));
  room.add(1, ip("::1"), t0);
  const auto other = ip("127.0.0.1");
  CHECK_FALSE(room.victim(&other, t0));
  CHECK(room.victim(nullptr, t0) == id(1));
  CHECK(room.find(1)->peer == ip("::1"));
  room.remove(1);
  CHECK(room.find(1) == nullptr);
  CHECK(room.size() == 0);
}

TEST_CASE("the journal's summary names every address whose connections were closed, at most once per 10 s") {
  ClosedNotes notes;
  CHECK(notes.closed("127.0.0.3", t0) ==
        std::optional<std::string>("1 connection(s) closed since the last line, from 127.0.0.3 (1)"));
  CHECK_FALSE(notes.closed("127.0.0.2", t0 + 1s));
  CHECK_FALSE(notes.closed("127.0.0.4", t0 + 2s));
  CHECK_FALSE(notes.closed("127.0.0.2", t0 + 3s));
  CHECK(notes.closed("127.0.0.5", t0 + 10s) ==
        std::optional<std::string>("4 connection(s) closed since the last line, from 127.0.0.2 (2), 127.0.0.4 (1), "
                                   "127.0.0.5 (1)"));
  CHECK(notes.closed("127.0.0.2", t0 + 20s) ==
        std::optional<std::string>("1 connection(s) closed since the last line, from 127.0.0.2 (1)"));
}

TEST_CASE("the journal's summary names at most 16 addresses and counts the rest") {
  ClosedNotes notes;
  REQUIRE(notes.closed("10.0.0.0", t0));
  for (int i = 1; i <= 20; ++i) CHECK_FALSE(notes.closed("10.0.0." + std::to_string(i), t0 + 1s));
  auto line = notes.closed("10.0.0.1", t0 + 10s);
  REQUIRE(line);
  CHECK_THAT(*line, Catch::StartsWith("21 connection(s) closed since the last line, from 10.0.0.1 (2), "));
  CHECK_THAT(*line, Catch::EndsWith(", and 4 from other addresses"));
}

TEST_CASE("within one address's room a connection that sent part of a request and stopped goes before one that has sent nothing yet") {
  MetricsRoom room(MetricsLimits{16, 2});
  room.add(1, ip("127.0.0.1"), t0);       // a scrape connected first, its request not in yet
  room.add(2, ip("127.0.0.1"), t0 + 100ms);  // a staller: its request line read, then nothing
  room.spoke(2);
  room.progressed(2, t0 + 200ms);
  auto full = room.full(ip("127.0.0.1"), t0 + 300ms);
  REQUIRE(full);
  CHECK(full->victim == id(2));
  room.spoke(1);  // the scrape's bytes arrived too: the staler one goes
  CHECK(room.full(ip("127.0.0.1"), t0 + 300ms)->victim == id(1));
  room.set_answering(1, true);  // and once its whole request is in, it is kept
  CHECK(room.full(ip("127.0.0.1"), t0 + 300ms)->victim == id(2));
}
