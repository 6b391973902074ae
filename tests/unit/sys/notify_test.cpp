#include "sys/notify.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

using namespace modeld::sys;
using namespace std::chrono_literals;

namespace {

// A datagram socket standing in for the service manager's $NOTIFY_SOCKET.
class FakeNotifySocket {
 public:
  FakeNotifySocket() {
    char tmpl[] = "/tmp/modeld-notify-XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    dir_ = tmpl;
    path_ = dir_ + "/notify";
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~FakeNotifySocket() {
    ::close(fd_);
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }

  // The next datagram, or nullopt when none arrives within `wait`.
  std::optional<std::string> receive(std::chrono::milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return std::nullopt;
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<std::size_t>(n));
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

// Sets or unsets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("notifications are sent nowhere without $NOTIFY_SOCKET") {
  FakeNotifySocket sock;
  ScopedEnv env("NOTIFY_SOCKET", nullptr);
  notify_ready();
  notify_status("planning");
  notify_stopping();
  notify_reloading();
  notify_watchdog();
  // A datagram would already be queued: sd_notify sends synchronously.
  CHECK_FALSE(sock.receive(0ms));
}

TEST_CASE("readiness, status and the other states reach $NOTIFY_SOCKET") {
  FakeNotifySocket sock;
  ScopedEnv env("NOTIFY_SOCKET", sock.path().c_str());
  notify_ready();
  CHECK(sock.receive(5s) == "READY=1");
  notify_status("Got 37% of kimi");
  CHECK(sock.receive(5s) == "STATUS=Got 37% of kimi");
  notify_stopping();
  CHECK(sock.receive(5s) == "STOPPING=1");
  notify_reloading();
  CHECK(sock.receive(5s) == "RELOADING=1");
  notify_watchdog();
  CHECK(sock.receive(5s) == "WATCHDOG=1");
}

TEST_CASE("a status with newlines or terminal escapes is sent as one line, escaped") {
  FakeNotifySocket sock;
  ScopedEnv env("NOTIFY_SOCKET", sock.path().c_str());
  notify_status("first\nREADY=1");
  CHECK(sock.receive(5s) == "STATUS=first\\nREADY=1");
  notify_status("serving \x1b]0;owned\x07kimi\r");
  CHECK(sock.receive(5s) == "STATUS=serving \\u001b]0;owned\\u0007kimi\\r");
  notify_ready("ready\nSTOPPING=1");
  CHECK(sock.receive(5s) == "READY=1\nSTATUS=ready\\nSTOPPING=1");
}

TEST_CASE("the watchdog interval is half of WatchdogSec, and absent when the watchdog is off") {
  {
    ScopedEnv usec("WATCHDOG_USEC", nullptr);
    ScopedEnv pid("WATCHDOG_PID", nullptr);
    CHECK_FALSE(watchdog_interval());
  }
  {
    auto me = std::to_string(::getpid());
    ScopedEnv usec("WATCHDOG_USEC", "4000000");
    ScopedEnv pid("WATCHDOG_PID", me.c_str());
    CHECK(watchdog_interval() == std::chrono::microseconds(2'000'000));
  }
  {
    // The watchdog belongs to another process (a parent that forgot to unset the variables).
    auto other = std::to_string(::getpid() + 1);
    ScopedEnv usec("WATCHDOG_USEC", "4000000");
    ScopedEnv pid("WATCHDOG_PID", other.c_str());
    CHECK_FALSE(watchdog_interval());
  }
}
