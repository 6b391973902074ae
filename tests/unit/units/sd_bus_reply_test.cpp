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
#include <map>
#include <string>
#include <vector>

using namespace modeld;
using namespace modeld::units;

namespace {

const std::string kUnit = "modeld-serve@new.service";

using Append = std::function<int(sd_bus_message*)>;

// A bus object over a socketpair, started, on which messages are built; nothing is ever sent.
class TestBus {
 public:
  TestBus() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_) == 0);
    REQUIRE(sd_bus_new(&bus_) >= 0);
    REQUIRE(sd_bus_set_fd(bus_, fds_[0], fds_[0]) >= 0);
    REQUIRE(sd_bus_start(bus_) >= 0);  // a message needs a bus that has started
  }
  ~TestBus() {
    ::close(fds_[1]);
    sd_bus_close_unref(bus_);  // closes fds_[0]; no flush, which would wait for the handshake
  }
  TestBus(const TestBus&) = delete;
  TestBus& operator=(const TestBus&) = delete;

  // A message whose body `append` writes, sealed and rewound for reading as a reply would be;
  // the caller owns it.
  sd_bus_message* message(const Append& append) const {
    sd_bus_message* m = nullptr;
    REQUIRE(sd_bus_message_new_method_call(bus_, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                                           "org.freedesktop.systemd1.Manager", "Test") >= 0);
    REQUIRE(append(m) >= 0);
    REQUIRE(sd_bus_message_seal(m, 1, 0) >= 0);
    REQUIRE(sd_bus_message_rewind(m, 1) >= 0);
    return m;
  }

 private:
  int fds_[2] = {-1, -1};
  sd_bus* bus_ = nullptr;
};

// A message whose body `append` writes, on a bus of its own.
class Message {
 public:
  explicit Message(const Append& append) : m_(bus_.message(append)) {}
  ~Message() { sd_bus_message_unref(m_); }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  sd_bus_message* get() const { return m_; }

 private:
  TestBus bus_;
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

TEST_CASE("ListUnitsByPatterns' reply gives the units that are up, in systemd's order") {
  const std::string pattern = "modeld-serve@*.service";
  Message four([](sd_bus_message* m) {
    const char* o = "/org/freedesktop/systemd1/unit/x";
    return sd_bus_message_append(m, "a(ssssssouso)", 4,  //
                                 "modeld-serve@a.service", "a", "loaded", "active", "running", "", o, 0u, "", "/",
                                 "modeld-serve@b.service", "b", "loaded", "failed", "failed", "", o, 0u, "", "/",
                                 "modeld-serve@c.service", "c", "loaded", "activating", "start", "", o, 7u, "start", o,
                                 "modeld-serve@d.service", "d", "loaded", "inactive", "dead", "", o, 0u, "", "/");
  });
  auto up = detail::read_units_up(four.get(), pattern);
  REQUIRE(up.has_value());
  CHECK(*up == std::vector<std::string>{"modeld-serve@a.service", "modeld-serve@c.service"});

  Message strings([](sd_bus_message* m) { return sd_bus_message_append(m, "as", 1, "modeld-serve@a.service"); });
  auto bad = detail::read_units_up(strings.get(), pattern);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == Errc::unit_failed);
  CHECK_THAT(bad.error().message, Catch::StartsWith(pattern + ": ListUnitsByPatterns reply: "));
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

namespace {

const std::vector<std::uint8_t> kInvocation = {0x5e, 0x1f, 0x00, 0x42, 0x8d, 0x3c, 0x4b, 0x7a,
                                               0x9e, 0x2d, 0x61, 0xf0, 0x13, 0xc4, 0xb8, 0x07};

// Properties.Get's reply holding `value` as D-Bus type `type` ("s", "u", "i"...) in a variant.
template <class T>
Append variant(const char* type, T value) {
  return [type, value](sd_bus_message* m) { return sd_bus_message_append(m, "v", type, value); };
}
Append text(const char* value) { return variant("s", value); }
Append u32(std::uint32_t value) { return variant("u", value); }
Append i32(std::int32_t value) { return variant("i", value); }
Append byte_array(const std::vector<std::uint8_t>& b) {
  return [b](sd_bus_message* m) {
    int r = sd_bus_message_open_container(m, 'v', "ay");
    if (r >= 0) r = sd_bus_message_append_array(m, 'y', b.data(), b.size());
    if (r >= 0) r = sd_bus_message_close_container(m);
    return r;
  };
}

// One unit's properties as systemd's Properties.Get answers them, by "Unit.NAME" or
// "Service.NAME" (the interface org.freedesktop.systemd1.Unit or .Service); any other is
// UnknownProperty. Records what was asked, in order.
class FakeProperties {
 public:
  explicit FakeProperties(std::map<std::string, Append> v) : values(std::move(v)) {}
  FakeProperties(const FakeProperties&) = delete;
  FakeProperties& operator=(const FakeProperties&) = delete;

  std::map<std::string, Append> values;
  std::vector<std::string> asked;

  detail::PropertyGetter getter() {
    return [this](const char* iface, const char* name, sd_bus_error* error, sd_bus_message** reply) {
      const std::string prefix = "org.freedesktop.systemd1.";
      std::string key = std::string(iface).starts_with(prefix) ? std::string(iface).substr(prefix.size()) : iface;
      key += std::string(".") + name;
      asked.push_back(key);
      auto it = values.find(key);
      if (it == values.end())
        return sd_bus_error_set(error, "org.freedesktop.DBus.Error.UnknownProperty", "Unknown property or interface.");
      *reply = bus_.message(it->second);
      return 1;
    };
  }

 private:
  TestBus bus_;
};

// A loaded service that runs again after its last run exited with status 3: every property has
// a value of its own.
std::map<std::string, Append> running_service() {
  return {{"Unit.LoadState", text("loaded")},      {"Unit.ActiveState", text("active")},
              {"Unit.SubState", text("running")},      {"Service.ExecMainPID", u32(4242)},
              {"Service.ExecMainStatus", i32(3)},      {"Service.Result", text("exit-code")},
              {"Unit.InvocationID", byte_array(kInvocation)}};
}

const std::vector<std::string> kServiceProperties = {"Unit.LoadState",      "Unit.ActiveState",       "Unit.SubState",
                                                     "Service.ExecMainPID", "Service.ExecMainStatus", "Service.Result",
                                                     "Unit.InvocationID"};

}  // namespace

TEST_CASE("a loaded service's status has each property, read from its own interface, in its own field") {
  FakeProperties p(running_service());
  auto st = detail::read_unit_status(kUnit, p.getter());
  REQUIRE(st.has_value());
  CHECK(st->loaded);
  CHECK(st->active_state == ActiveState::active);
  CHECK(st->sub_state == "running");
  CHECK(st->main_pid == 4242);
  CHECK(st->exec_main_status == 3);
  CHECK(st->result == "exit-code");
  CHECK(st->invocation_id == "5e1f00428d3c4b7a9e2d61f013c4b807");
  CHECK(p.asked == kServiceProperties);

  p.values["Unit.ActiveState"] = text("failed");
  p.values["Unit.SubState"] = text("failed");
  p.values["Service.ExecMainPID"] = u32(0);
  p.values["Service.ExecMainStatus"] = i32(-9);
  p.values["Service.Result"] = text("signal");
  auto failed = detail::read_unit_status(kUnit, p.getter());
  REQUIRE(failed.has_value());
  CHECK(failed->active_state == ActiveState::failed);
  CHECK(failed->sub_state == "failed");
  CHECK(failed->main_pid == 0);
  CHECK(failed->exec_main_status == -9);
  CHECK(failed->result == "signal");
}

TEST_CASE("a property of another type, or that cannot be fetched, fails naming the unit and the property") {
  const std::vector<std::pair<std::string, Append>> wrong = {
      {"Unit.LoadState", u32(1)},           {"Unit.ActiveState", u32(1)},  {"Unit.SubState", variant("o", "/x")},
      {"Service.ExecMainPID", i32(4242)},   {"Service.ExecMainStatus", u32(3)}, {"Service.Result", u32(0)}};
  for (const auto& [key, value] : wrong) {
    INFO(key);
    FakeProperties p(running_service());
    p.values[key] = value;
    auto st = detail::read_unit_status(kUnit, p.getter());
    REQUIRE_FALSE(st.has_value());
    CHECK(st.error().code == Errc::unit_failed);
    const auto property = key.substr(key.find('.') + 1);
    CHECK(st.error().message == kUnit + ": " + property + ": " + std::strerror(ENXIO));
    CHECK(p.asked.back() == key);  // nothing read after it
  }

  FakeProperties p(running_service());
  p.values.erase("Service.ExecMainPID");
  auto st = detail::read_unit_status(kUnit, p.getter());
  REQUIRE_FALSE(st.has_value());
  CHECK(st.error().code == Errc::unit_failed);
  CHECK(st.error().message == kUnit + ": ExecMainPID: Unknown property or interface.");
  CHECK(p.asked == std::vector<std::string>(kServiceProperties.begin(), kServiceProperties.begin() + 4));
}

TEST_CASE("InvocationID is best effort: of another type or not there, the status has none") {
  FakeProperties p(running_service());
  p.values["Unit.InvocationID"] = text("5e1f00428d3c4b7a9e2d61f013c4b807");
  auto st = detail::read_unit_status(kUnit, p.getter());
  REQUIRE(st.has_value());
  CHECK(st->invocation_id.empty());
  CHECK(st->main_pid == 4242);

  p.values.erase("Unit.InvocationID");
  st = detail::read_unit_status(kUnit, p.getter());
  REQUIRE(st.has_value());
  CHECK(st->invocation_id.empty());
  CHECK(st->sub_state == "running");
}

TEST_CASE("a unit without a unit file is not loaded and only its Unit states are read") {
  FakeProperties p(running_service());  // Service properties and InvocationID there, with values
  p.values["Unit.LoadState"] = text("not-found");
  p.values["Unit.ActiveState"] = text("inactive");
  p.values["Unit.SubState"] = text("dead");
  auto st = detail::read_unit_status(kUnit, p.getter());
  REQUIRE(st.has_value());
  CHECK_FALSE(st->loaded);
  CHECK(st->active_state == ActiveState::inactive);
  CHECK(st->sub_state == "dead");
  CHECK(st->main_pid == 0);
  CHECK(st->exec_main_status == 0);
  CHECK(st->result.empty());
  CHECK(st->invocation_id.empty());
  CHECK(p.asked == std::vector<std::string>{"Unit.LoadState", "Unit.ActiveState", "Unit.SubState"});

  // A loaded unit that is not a service has no Service properties, but an invocation.
  FakeProperties socket(running_service());
  auto loaded = detail::read_unit_status("modeld.socket", socket.getter());
  REQUIRE(loaded.has_value());
  CHECK(loaded->loaded);
  CHECK(loaded->main_pid == 0);
  CHECK(loaded->invocation_id == "5e1f00428d3c4b7a9e2d61f013c4b807");
  CHECK(socket.asked == std::vector<std::string>{"Unit.LoadState", "Unit.ActiveState", "Unit.SubState",
                                                 "Unit.InvocationID"});
}

TEST_CASE("LoadUnit's reply gives the unit's object path, and a reply of another type names the unit") {
  Message path([](sd_bus_message* m) {
    return sd_bus_message_append(m, "o", "/org/freedesktop/systemd1/unit/modeld_2dserve_40new_2eservice");
  });
  auto object = detail::read_unit_path(path.get(), kUnit);
  REQUIRE(object.has_value());
  CHECK(*object == "/org/freedesktop/systemd1/unit/modeld_2dserve_40new_2eservice");

  Message other([](sd_bus_message* m) { return sd_bus_message_append(m, "s", "/org/freedesktop/systemd1/unit/x"); });
  auto wrong = detail::read_unit_path(other.get(), kUnit);
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code == Errc::unit_failed);
  CHECK(wrong.error().message == kUnit + ": LoadUnit reply: " + std::strerror(ENXIO));
}
