#pragma once
// Captures what a test writes to stderr (fd 2): the stderr sink's lines.

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace modeld::sys::test {

// Points fd 2 at a temporary file for the life of the object, then reads what was written.
class CapturedStderr {
 public:
  CapturedStderr() {
    std::fflush(stderr);
    char path[] = "/tmp/modeld-log-test-XXXXXX";
    fd_ = ::mkstemp(path);
    REQUIRE(fd_ >= 0);
    ::unlink(path);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(fd_, STDERR_FILENO);
  }
  ~CapturedStderr() { restore(); ::close(fd_); }
  std::string text() {
    restore();
    std::string out;
    char buf[4096];
    ssize_t n;
    ::lseek(fd_, 0, SEEK_SET);
    while ((n = ::read(fd_, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  int fd_ = -1;
  int saved_ = -1;
};

}  // namespace modeld::sys::test
