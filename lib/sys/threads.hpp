#pragma once
// Scheduling of modeld's own threads.

namespace boost::asio { class thread_pool; }

namespace modeld::sys {

/// Gives each of the `threads` threads of `pool` the nice value `nice` (setpriority(2) on the
/// thread's id; Linux schedules threads one by one), so that on a host short of CPU the event
/// loop, which answers the control socket and feeds the downloads, runs before hashing and disk
/// jobs. Blocks until every thread of the pool has taken it; `threads` must be the pool's size
/// (more would wait forever). A thread that cannot be re-niced keeps its value and the first
/// failure is returned as an errno value (0: all done).
int set_pool_niceness(boost::asio::thread_pool& pool, unsigned threads, int nice);

}  // namespace modeld::sys
