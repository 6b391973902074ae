#include "control/hub_reads.hpp"

#include <fmt/format.h>

namespace modeld::control {

HubReads::Slot::~Slot() {
  if (owner_) owner_->leave(uid_);
}

Result<HubReads::Slot> HubReads::enter(const Peer& peer, const std::function<bool()>& privileged) {
  const std::size_t mine = per_uid_.contains(peer.uid) ? per_uid_.at(peer.uid) : 0;
  if (total_ < limits_.total) {
    if (mine >= limits_.per_user && !privileged())
      return make_error(Errc::too_many_requests,
                        fmt::format("uid {} has {} requests that list the Hub in progress (plan), the most one user "
                                    "may have at once; try again when one has ended",
                                    peer.uid, mine));
  } else if (total_ >= limits_.total + limits_.reserved || !privileged()) {
    return make_error(Errc::too_many_requests,
                      fmt::format("{} requests that list the Hub (plan) are in progress, the most modeld runs at "
                                  "once; try again when one has ended",
                                  total_));
  }
  ++per_uid_[peer.uid];
  ++total_;
  return Slot(this, peer.uid);
}

void HubReads::leave(uid_t uid) {
  if (auto it = per_uid_.find(uid); it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
  --total_;
}

}  // namespace modeld::control
