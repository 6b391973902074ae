#pragma once
// Single-flight: one computation per key at a time, whose result every caller that asked for
// the key meanwhile shares (concurrent plans of one model cost one Hub listing, not sixteen).

#include "util/error.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace modeld::util {

/// Runs at most one computation of a Result<T> per key at a time on one executor (not
/// thread-safe: every caller runs on the same io_context thread). Callers that ask for a key
/// whose computation runs wait for it (on a timer: nothing blocks) and get a copy of its result;
/// T should be cheap to copy (a shared_ptr, a small report). The object must outlive every call.
template <class T>
class SingleFlight {
 public:
  using Make = std::function<boost::asio::awaitable<Result<T>>()>;

  /// Returns make()'s result for `key`, or that of the computation of `key` already running.
  /// When the computation that ran ends `cancelled` (its own caller was cancelled), a waiter
  /// starts over instead of sharing that; a waiter cancelled itself gets `cancelled`. An
  /// exception from make() reaches its caller, and the waiters start over.
  boost::asio::awaitable<Result<T>> run(std::string key, Make make) {
    for (;;) {
      auto it = flights_.find(key);
      if (it == flights_.end()) co_return co_await lead(key, make);
      std::shared_ptr<Flight> flight = it->second;
      co_await flight->done.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
      auto state = co_await boost::asio::this_coro::cancellation_state;
      if (flight->result && !(flight->result->has_error() && flight->result->error().code == Errc::cancelled))
        co_return *flight->result;
      if (state.cancelled() != boost::asio::cancellation_type::none)
        co_return make_error(Errc::cancelled, "cancelled while waiting for the same request of another caller");
    }
  }

  /// How many keys have a computation running now (for tests).
  std::size_t in_flight() const { return flights_.size(); }

 private:
  struct Flight {
    explicit Flight(const boost::asio::any_io_executor& ex) : done(ex) {
      done.expires_at(boost::asio::steady_timer::time_point::max());
    }
    boost::asio::steady_timer done;   // cancelled when the result is in
    std::optional<Result<T>> result;  // empty when make() threw
  };

  boost::asio::awaitable<Result<T>> lead(const std::string& key, const Make& make) {
    auto flight = std::make_shared<Flight>(co_await boost::asio::this_coro::executor);
    flights_.emplace(key, flight);
    struct Finish {
      SingleFlight& self;
      const std::string& key;
      Flight& flight;
      ~Finish() {
        self.flights_.erase(key);
        flight.done.cancel();
      }
    } finish{*this, key, *flight};
    flight->result = co_await make();
    co_return *flight->result;
  }

  std::map<std::string, std::shared_ptr<Flight>> flights_;
};

}  // namespace modeld::util
