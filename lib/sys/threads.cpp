#include "sys/threads.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <cerrno>
#include <latch>

#include <sys/resource.h>
#include <unistd.h>

namespace modeld::sys {

int set_pool_niceness(boost::asio::thread_pool& pool, unsigned threads, int nice) {
  // Every job waits at the latch until all have arrived, so no thread of the pool can run two
  // of them: each thread runs exactly one.
  std::latch all_there(threads);
  std::latch done(threads);
  std::atomic<int> first_error{0};
  for (unsigned i = 0; i < threads; ++i) {
    boost::asio::post(pool, [&] {
      all_there.arrive_and_wait();
      if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice) != 0) {
        int expected = 0;
        first_error.compare_exchange_strong(expected, errno);
      }
      done.count_down();
    });
  }
  done.wait();
  return first_error.load();
}

}  // namespace modeld::sys
