#include "sys/threads.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <catch2/catch.hpp>

#include <latch>
#include <mutex>
#include <set>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace {

int nice_of_this_thread() {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
}

}  // namespace

TEST_CASE("set_pool_niceness re-nices every thread of the pool and no other") {
  const int before = nice_of_this_thread();
  boost::asio::thread_pool pool(3);
  REQUIRE(modeld::sys::set_pool_niceness(pool, 3, before + 7) == 0);

  // One job per thread again (the latch keeps a thread from taking two), each reporting its nice.
  std::latch all_there(3);
  std::mutex m;
  std::vector<int> seen;
  std::set<pid_t> tids;
  for (int i = 0; i < 3; ++i) {
    boost::asio::post(pool, [&] {
      all_there.arrive_and_wait();
      std::lock_guard lock(m);
      seen.push_back(nice_of_this_thread());
      tids.insert(::gettid());
    });
  }
  pool.join();
  CHECK(tids.size() == 3);
  CHECK(seen == std::vector<int>{before + 7, before + 7, before + 7});
  CHECK(nice_of_this_thread() == before);
}
