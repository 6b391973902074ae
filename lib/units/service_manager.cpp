// What every backend shares: unit states, the journal default, reset-failed-then-start, and
// waiting for a unit to stop.
#include "units/service_manager.hpp"

#include "util/name_table.hpp"
#include "util/poll.hpp"

#include <fmt/format.h>


namespace modeld::units {

namespace asio = boost::asio;

namespace {
constexpr util::NameTable<ActiveState, 9> kStates{{
    {ActiveState::inactive, "inactive"},
    {ActiveState::active, "active"},
    {ActiveState::activating, "activating"},
    {ActiveState::deactivating, "deactivating"},
    {ActiveState::reloading, "reloading"},
    {ActiveState::failed, "failed"},
    {ActiveState::maintenance, "maintenance"},
    {ActiveState::refreshing, "refreshing"},
    {ActiveState::unknown, "unknown"},
}};
}  // namespace

std::string_view to_string(ActiveState state) { return util::name_in(kStates, state).value_or("unknown"); }

ActiveState parse_active_state(std::string_view text) {
  return util::value_in(kStates, text).value_or(ActiveState::unknown);
}

bool is_stopped(ActiveState state) { return state == ActiveState::inactive || state == ActiveState::failed; }

bool is_up(ActiveState state) {
  return state == ActiveState::active || state == ActiveState::activating || state == ActiveState::reloading;
}

JournalSource ServiceManager::journal_of(const std::string&) const { return JournalSource{}; }

asio::awaitable<Result<void>> reset_failed_and_start(ServiceManager& manager, std::string unit) {
  auto reset = co_await manager.reset_failed(unit);  // best effort: StartUnit reports the real problem
  (void)reset;
  co_return co_await manager.start(unit);
}

asio::awaitable<Result<void>> wait_inactive(ServiceManager& manager, std::string unit,
                                            std::chrono::milliseconds timeout) {
  Result<UnitStatus> st = make_error(Errc::internal, unit + ": not asked");
  auto end = co_await util::poll_until(std::chrono::steady_clock::now() + timeout, std::chrono::milliseconds(200),
                                       [&]() -> asio::awaitable<bool> {
                                         st = co_await manager.status(unit);
                                         co_return !st || is_stopped(st->active_state);
                                       });
  if (end == util::PollEnd::cancelled)
    co_return make_error(Errc::cancelled, fmt::format("{}: cancelled while waiting for it to stop", unit));
  if (!st) co_return st.error();
  if (end == util::PollEnd::deadline)
    co_return make_error(Errc::stop_timeout, fmt::format("{} did not stop within {} ms (still {}/{})", unit,
                                                         timeout.count(), to_string(st->active_state), st->sub_state));
  co_return Result<void>{};
}

}  // namespace modeld::units
