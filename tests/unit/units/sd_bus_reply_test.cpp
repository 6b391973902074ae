// How the systemd backend reads systemd's answers (units/sd_bus_reply.hpp), on messages built here
// on a bus object over a socketpair: no bus daemon and no systemd are involved. The calls
// themselves are tested end to end against a namespaced systemd (test_units_systemd.py).

#include "units/sd_bus_reply.hpp"

#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

using namespace modeld;
using namespace modeld::units;

namespace {

const std::string kUnit = "modeld-serve@new.service";

// A message whose body `append` writes, sealed and rewound for reading as a reply would be.
class Message {
 public:
  explicit Message(const std::function<int(sd_bus_message*)>& append) {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_) == 0);
    REQUIRE(sd_bus_new(&bus_) >= 0);
    REQUIRE(sd_bus_set_fd(bus_, fds_[0], fds_[0]) >= 0);
    REQUIRE(sd_bus_start(bus_) >= 0);  // a message needs a bus that has started
    REQUIRE(sd_bus_message_new_method_call(bus_, &m_, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "Test") >= 0);
    REQUIRE(append(m_) >= 0);
    REQUIRE(sd_bus_message_seal(m_, 1, 0) >= 0);
    REQUIRE(sd_bus_message_rewind(m_, 1) >= 0);
  }
  ~Message() {
    sd_bus_message_unref(m_);
    ::close(fds_[1]);
    sd_bus_close_unref(bus_);  // closes fds_[0]; no flush, which would wait for the handshake
  }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  sd_bus_message* get() const { return m_; }

 private:
  int fds_[2] = {-1, -1};
  sd_bus* bus_ = nullptr;
  sd_bus_message* m_ = nullptr;
};

Message bytes(const std::vector<std::uint8_t>& b) {
  return Message([&](sd_bus_message* m) { return sd_bus_message_append_array(m, 'y', b.data(), b.size()); });
}

}  // namespace

TEST_CASE("GetUnitProcesses' reply gives every PID in systemd's order") {
  Message three([](sd_bus_message* m) {
    return sd_bus_message_append(m, "a(sus)", 3, "/system.slice/modeld-serve@new.service", 12u, "vllm serve",
                                 "/system.slice/modeld-serve@new.service", 4242u, "VLLM::Worker",
                                 "/system.slice/modeld-serve@new.service/x", 7u, "");
  });
  auto pids = detail::read_unit_processes(three.get(), kUnit);
  REQUIRE(pids.has_value());
  CHECK(*pids == std::vector<std::uint32_t>{12, 4242, 7});

  Message none([](sd_bus_message* m) { return sd_bus_message_append(m, "a(sus)", 0); });
  auto empty = detail::read_unit_processes(none.get(), kUnit);
  REQUIRE(empty.has_value());
  CHECK(empty->empty());
}

TEST_CASE("a GetUnitProcesses reply of another type is unit_failed naming the unit and the reply") {
  Message strings([](sd_bus_message* m) { return sd_bus_message_append(m, "as", 1, "12"); });
  auto pids = detail::read_unit_processes(strings.get(), kUnit);
  REQUIRE_FALSE(pids.has_value());
  CHECK(pids.error().code == Errc::unit_failed);
  CHECK_THAT(pids.error().message, Catch::StartsWith(kUnit + ": GetUnitProcesses reply: "));
  CHECK(pids.error().message.size() > (kUnit + ": GetUnitProcesses reply: ").size());  // with the reason
}

TEST_CASE("InvocationID's 16 bytes read as 32 hex digits and the null ID or any other length as none") {
  CHECK(detail::read_invocation_id(bytes({0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb,
                                          0xcc, 0xdd, 0xee, 0xff})
                                       .get()) == "00112233445566778899aabbccddeeff");
  CHECK(detail::read_invocation_id(bytes(std::vector<std::uint8_t>(16, 0)).get()).empty());
  CHECK(detail::read_invocation_id(bytes({0xab, 0xcd}).get()).empty());
  Message text([](sd_bus_message* m) { return sd_bus_message_append(m, "s", "0123456789abcdef"); });
  CHECK(detail::read_invocation_id(text.get()).empty());
}

TEST_CASE("NoSuchUnit is success only for the calls that allow it and other answers name the unit and call and why") {
  const sd_bus_error no_such =
      SD_BUS_ERROR_MAKE_CONST("org.freedesktop.systemd1.NoSuchUnit", "Unit modeld-serve@new.service not loaded.");
  CHECK(detail::manager_call_result(kUnit, "StopUnit", -ENOENT, no_such, true).has_value());
  auto start = detail::manager_call_result(kUnit, "StartUnit", -ENOENT, no_such, false);
  REQUIRE_FALSE(start.has_value());
  CHECK(start.error().code == Errc::unit_failed);
  CHECK(start.error().message == kUnit + ": StartUnit: Unit modeld-serve@new.service not loaded.");

  const sd_bus_error denied =
      SD_BUS_ERROR_MAKE_CONST("org.freedesktop.DBus.Error.AccessDenied", "Access denied");
  auto stop = detail::manager_call_result(kUnit, "StopUnit", -EACCES, denied, true);
  REQUIRE_FALSE(stop.has_value());
  CHECK(stop.error().message == kUnit + ": StopUnit: Access denied");

  const sd_bus_error none = SD_BUS_ERROR_NULL;  // no answer at all: the errno says why
  auto lost = detail::manager_call_result(kUnit, "StopUnit", -ECONNRESET, none, true);
  REQUIRE_FALSE(lost.has_value());
  CHECK(lost.error().message == kUnit + ": StopUnit: " + std::strerror(ECONNRESET));
  CHECK(detail::manager_call_result(kUnit, "StartUnit", 1, none, false).has_value());
}
