#pragma once
// A bound on the read routes that cost the daemon Hub requests and memory
// (GET /v1/models/{name}/plan lists the repository): each local user may have only a few of them
// in progress, and root and control.group members keep a reserve, as the socket's connection
// limits do (server.hpp Limits).

#include "control/routes.hpp"
#include "util/error.hpp"
#include "util/throttle.hpp"

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <map>

namespace modeld::control {

/// How many Hub-costing read requests may be in progress at once.
struct HubReadLimits {
  std::size_t per_user = 2;  ///< of one uid that is neither root nor in control.group
  std::size_t total = 8;     ///< of all users together, before only the reserve is left
  std::size_t reserved = 8;  ///< beyond `total`, for root and control.group members only
};

/// Counts the Hub-costing read requests in progress per uid; used on the event loop only.
class HubReads {
 public:
  /// One request's place; it is given back when the Slot is destroyed. Move-only.
  class Slot {
   public:
    Slot(HubReads* owner, uid_t uid) : owner_(owner), uid_(uid) {}
    Slot(Slot&& other) noexcept : owner_(other.owner_), uid_(other.uid_) { other.owner_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    HubReads* owner_;
    uid_t uid_;
  };

  /// Makes a counter with these limits.
  explicit HubReads(HubReadLimits limits = {}) : limits_(limits) {}

  /// A place for one request of `peer`, or too_many_requests naming the uid and the limit it hit.
  /// `privileged` (root or control.group; it may read the group database) is asked only when
  /// the limits for everyone else would refuse. Never blocks otherwise.
  Result<Slot> enter(const Peer& peer, const std::function<bool()>& privileged);

  /// Requests in progress now, all users together.
  std::size_t in_progress() const { return total_; }

  /// Refusals, for one journal line per 10 s at most.
  util::LogThrottle refusals{std::chrono::seconds(10)};

 private:
  void leave(uid_t uid);

  HubReadLimits limits_;
  std::map<uid_t, std::size_t> per_uid_;
  std::size_t total_ = 0;
};

}  // namespace modeld::control
