#pragma once
// One cancellation that reaches many tasks: Asio's cancellation_signal has one slot, so a
// signal that fans out to every task of the daemon (the control server, the metrics listener,
// the deployer and what it runs) is a list of them emitted together.

#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_type.hpp>

#include <list>

namespace modeld::util {

/// The root of a cancellation tree: each child() is the slot of a signal of its own, and emit()
/// emits every one of them. Not thread-safe: use it on the thread its tasks run on.
class CancelTree {
 public:
  CancelTree() = default;
  CancelTree(const CancelTree&) = delete;
  CancelTree& operator=(const CancelTree&) = delete;

  /// A new slot that emit() reaches: bind a co_spawned task to it (bind_cancellation_slot), or
  /// assign it a handler of one's own (a component's stop). A child made after emit() is never
  /// emitted: callers that may come late check emitted() first.
  boost::asio::cancellation_slot child() { return children_.emplace_back().slot(); }

  /// Emits `type` on every child, in the order they were made; only the first call does anything.
  /// Handlers run inside this call.
  void emit(boost::asio::cancellation_type type = boost::asio::cancellation_type::terminal) {
    if (emitted_) return;
    emitted_ = true;
    for (auto& signal : children_) signal.emit(type);
  }

  /// Whether emit() was called.
  bool emitted() const { return emitted_; }

 private:
  std::list<boost::asio::cancellation_signal> children_;  // a list: slots keep their signal's address
  bool emitted_ = false;
};

}  // namespace modeld::util
