// The systemd backend of ServiceManager: org.freedesktop.systemd1 over sd-bus.
//
// An sd_bus connection is not thread-safe and every call on it blocks until systemd answers, so
// the connection lives on one private thread (a thread_pool of 1): it is opened, used and closed
// only there. Each method posts its bus work to that thread with co_spawn and co_awaits the
// result, which use_awaitable delivers back on the caller's executor; the event loop never waits
// on systemd.

#include "units/service_manager.hpp"
#include "units/sd_bus_reply.hpp"

#include "util/files.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <chrono>
#include <thread>
#include <systemd/sd-bus.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <stdexcept>
#include <system_error>

namespace modeld::units {

namespace asio = boost::asio;

std::string serve_unit(const std::string& model) { return "modeld-serve@" + model + ".service"; }

namespace {

constexpr const char* kDestination = "org.freedesktop.systemd1";
constexpr const char* kManagerPath = "/org/freedesktop/systemd1";
constexpr const char* kManager = "org.freedesktop.systemd1.Manager";
constexpr const char* kUnit = "org.freedesktop.systemd1.Unit";
constexpr const char* kService = "org.freedesktop.systemd1.Service";
constexpr const char* kNoSuchUnit = "org.freedesktop.systemd1.NoSuchUnit";

// Owners of libsystemd's C objects, so that every return path frees them.
struct BusError {
  sd_bus_error e = SD_BUS_ERROR_NULL;
  BusError() = default;
  BusError(const BusError&) = delete;
  BusError& operator=(const BusError&) = delete;
  ~BusError() { sd_bus_error_free(&e); }
};
struct Reply {
  sd_bus_message* m = nullptr;
  Reply() = default;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  ~Reply() { sd_bus_message_unref(m); }
};

using detail::bus_error;

// A Manager method taking the unit name (and, for jobs, the mode "replace"). When
// `not_loaded_ok`, systemd's NoSuchUnit answer counts as success: there is nothing to stop or reset.
Result<void> manager_unit_call(sd_bus* bus, const char* method, const std::string& unit, bool job,
                               bool not_loaded_ok) {
  BusError err;
  Reply reply;
  int r = job ? sd_bus_call_method(bus, kDestination, kManagerPath, kManager, method, &err.e, &reply.m,
                                   "ss", unit.c_str(), "replace")
              : sd_bus_call_method(bus, kDestination, kManagerPath, kManager, method, &err.e, &reply.m,
                                   "s", unit.c_str());
  return detail::manager_call_result(unit, method, r, err.e, not_loaded_ok);
}

// The unit's object path. LoadUnit (unlike GetUnit) answers for units systemd has not loaded
// yet, with LoadState "not-found" when no unit file exists.
Result<std::string> load_unit(sd_bus* bus, const std::string& unit) {
  BusError err;
  Reply reply;
  int r = sd_bus_call_method(bus, kDestination, kManagerPath, kManager, "LoadUnit", &err.e, &reply.m, "s",
                             unit.c_str());
  if (r < 0) return bus_error(unit, "LoadUnit", r, err.e);
  return detail::read_unit_path(reply.m, unit);
}

// Reads the string property `name` of interface `iface` of the unit at `object` into `out`.
Result<void> get_string(sd_bus* bus, const std::string& unit, const std::string& object, const char* iface,
                        const char* name, std::string& out) {
  BusError err;
  char* value = nullptr;
  int r = sd_bus_get_property_string(bus, kDestination, object.c_str(), iface, name, &err.e, &value);
  if (r < 0) return bus_error(unit, name, r, err.e);
  out = value ? value : "";
  std::free(value);
  return {};
}

// The unit's User=, Group= and DynamicUser= as systemd has them loaded.
Result<ExecIdentity> unit_identity(sd_bus* bus, const std::string& unit) {
  auto object = load_unit(bus, unit);
  if (!object) return object.error();
  ExecIdentity id;
  if (auto r = get_string(bus, unit, *object, kService, "User", id.user); !r) return r.error();
  if (auto r = get_string(bus, unit, *object, kService, "Group", id.group); !r) return r.error();
  BusError err;
  int dynamic = 0;
  int r = sd_bus_get_property_trivial(bus, kDestination, object->c_str(), kService, "DynamicUser", &err.e, 'b',
                                      &dynamic);
  if (r < 0) return bus_error(unit, "DynamicUser", r, err.e);
  id.dynamic = dynamic != 0;
  return id;
}

Result<UnitStatus> unit_status(sd_bus* bus, const std::string& unit) {
  auto object = load_unit(bus, unit);
  if (!object) return object.error();
  return detail::read_unit_status(unit, [&](const char* iface, const char* name, sd_bus_error* e,
                                            sd_bus_message** m) {
    return sd_bus_call_method(bus, kDestination, object->c_str(), "org.freedesktop.DBus.Properties", "Get", e, m,
                              "ss", iface, name);
  });
}

Result<std::vector<std::uint32_t>> unit_pids(sd_bus* bus, const std::string& unit) {
  BusError err;
  Reply reply;
  int r = 0;
  // systemd answers EIO now and then while processes of the unit exit under its enumeration
  // (seen with systemd 252 during stops): a transient answer, asked again a few times.
  for (int attempt = 0;; ++attempt) {
    sd_bus_error_free(&err.e);  // leaves it SD_BUS_ERROR_NULL for the next call
    reply.m = sd_bus_message_unref(reply.m);
    r = sd_bus_call_method(bus, kDestination, kManagerPath, kManager, "GetUnitProcesses", &err.e, &reply.m, "s",
                           unit.c_str());
    if (r >= 0) break;
    if (sd_bus_error_has_name(&err.e, kNoSuchUnit)) return std::vector<std::uint32_t>{};
    if (attempt >= 4) return bus_error(unit, "GetUnitProcesses", r, err.e);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return detail::read_unit_processes(reply.m, unit);
}

// Every state is asked for (an empty list) and is_up() decides, so a state systemd adds later is
// not silently left out of the request.
Result<std::vector<std::string>> list_units_up(sd_bus* bus, const std::string& pattern) {
  BusError err;
  Reply request, reply;
  int r = sd_bus_message_new_method_call(bus, &request.m, kDestination, kManagerPath, kManager, "ListUnitsByPatterns");
  if (r >= 0) r = sd_bus_message_append_strv(request.m, nullptr);
  const char* patterns[] = {pattern.c_str(), nullptr};
  if (r >= 0) r = sd_bus_message_append_strv(request.m, const_cast<char**>(patterns));
  if (r >= 0) r = sd_bus_call(bus, request.m, 0, &err.e, &reply.m);
  if (r < 0) return bus_error(pattern, "ListUnitsByPatterns", r, err.e);
  return detail::read_units_up(reply.m, pattern);
}

class SystemdManager final : public ServiceManager {
 public:
  SystemdManager(asio::any_io_executor executor, std::filesystem::path unit_dir)
      : executor_(std::move(executor)), unit_dir_(std::move(unit_dir)) {
    std::packaged_task<Result<void>()> open([this] { return ensure_open(); });
    auto opened = open.get_future();
    asio::post(pool_, std::move(open));
    if (auto r = opened.get(); !r) throw std::runtime_error(r.error().message);
  }

  ~SystemdManager() override {
    asio::post(pool_, [this] { bus_ = sd_bus_flush_close_unref(bus_); });
    pool_.join();
  }

  SystemdManager(const SystemdManager&) = delete;
  SystemdManager& operator=(const SystemdManager&) = delete;

  asio::awaitable<Result<void>> start(const std::string& unit) override {
    return on_bus<void>([unit](sd_bus* bus) { return manager_unit_call(bus, "StartUnit", unit, true, false); });
  }

  asio::awaitable<Result<void>> stop(const std::string& unit) override {
    return on_bus<void>([unit](sd_bus* bus) { return manager_unit_call(bus, "StopUnit", unit, true, true); });
  }

  asio::awaitable<Result<UnitStatus>> status(const std::string& unit) override {
    return on_bus<UnitStatus>([unit](sd_bus* bus) { return unit_status(bus, unit); });
  }

  asio::awaitable<Result<std::vector<std::uint32_t>>> pids(const std::string& unit) override {
    return on_bus<std::vector<std::uint32_t>>([unit](sd_bus* bus) { return unit_pids(bus, unit); });
  }

  asio::awaitable<Result<ExecIdentity>> identity(const std::string& unit) override {
    return on_bus<ExecIdentity>([unit](sd_bus* bus) { return unit_identity(bus, unit); });
  }

  // A unit that is not loaded has no failed state to reset, hence NoSuchUnit is success.
  asio::awaitable<Result<void>> reset_failed(const std::string& unit) override {
    return on_bus<void>(
        [unit](sd_bus* bus) { return manager_unit_call(bus, "ResetFailedUnit", unit, false, true); });
  }

  // systemd answers Reload only after it has re-read the unit files, so a StartUnit that follows
  // sees the new drop-ins.
  asio::awaitable<Result<void>> reload() override {
    return on_bus<void>([](sd_bus* bus) -> Result<void> {
      BusError err;
      Reply reply;
      int r = sd_bus_call_method(bus, kDestination, kManagerPath, kManager, "Reload", &err.e, &reply.m, "");
      if (r < 0) return bus_error("systemd", "Reload", r, err.e);
      return {};
    });
  }

  Result<void> write_dropin(const std::string& unit, const std::string& name,
                            const std::string& content) override {
    return write_dropin_file(unit_dir_, unit, name, content);
  }

  asio::awaitable<Result<std::vector<std::string>>> units_up(const std::string& pattern) override {
    return on_bus<std::vector<std::string>>([pattern](sd_bus* bus) { return list_units_up(bus, pattern); });
  }

  Result<std::optional<std::string>> read_dropin(const std::string& unit, const std::string& name) const override {
    auto text = util::read_file(unit_dir_ / (unit + ".d") / name, 1 << 20);
    if (!text && text.error().code == Errc::not_found) return std::optional<std::string>{};
    if (!text) return text.error();
    return std::optional<std::string>(std::move(*text));
  }

 private:
  // Runs `work(bus)` on the bus thread and resumes the caller on its own executor with the result.
  // Deliberately not a coroutine itself: GCC 12 destroys a by-value parameter of a coroutine
  // twice when it was moved from inside a co_await expression; co_spawn owns `work` instead.
  // The caller's cancellation is not forwarded: a bus call is one blocking step that cannot be
  // interrupted, and Boost 1.81's co_spawn posts the forwarded cancellation to the bus thread,
  // where it ran after the call had finished and its state was gone (modeld crashed on a cancel
  // during launching). A cancel reaches the caller when the call returns.
  template <class T, class F>
  asio::awaitable<Result<T>> on_bus(F work) {
    return asio::co_spawn(
        pool_,
        [this, work = std::move(work)]() -> asio::awaitable<Result<T>> {
          if (auto r = ensure_open(); !r) co_return r.error();
          auto result = work(bus_);
          // The bus daemon may have dropped the connection since the last call (restarted, or
          // systemd re-executed): reconnect and try once more rather than fail a deployment.
          if (!result && sd_bus_is_open(bus_) <= 0) {
            if (auto r = ensure_open(); !r) co_return r.error();
            result = work(bus_);
          }
          co_return result;
        },
        asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  }

  // systemd re-executing or the bus daemon restarting drops the connection; open a new one
  // rather than failing every later call. Runs on the bus thread.
  Result<void> ensure_open() {
    if (bus_ && sd_bus_is_open(bus_) > 0) return {};
    bus_ = sd_bus_flush_close_unref(bus_);
    if (int r = sd_bus_open_system(&bus_); r < 0) {
      bus_ = nullptr;
      return make_error(Errc::unit_failed,
                        fmt::format("cannot connect to the system bus: {}", std::strerror(-r)));
    }
    // sd_bus_open_system() only starts the handshake; a connection left idle before it completes
    // is closed by dbus-daemon after its auth_timeout (30 s), so complete it now with a call
    // every client may make (GetId on the bus driver).
    BusError err;
    Reply reply;
    if (int r = sd_bus_call_method(bus_, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                   "GetId", &err.e, &reply.m, "");
        r < 0) {
      bus_ = sd_bus_flush_close_unref(bus_);
      return bus_error("the system bus", "GetId", r, err.e);
    }
    return {};
  }

  asio::any_io_executor executor_;  // the event loop this manager serves; results resume there
  std::filesystem::path unit_dir_;
  asio::thread_pool pool_{1};
  sd_bus* bus_ = nullptr;  // touched only on pool_'s thread
};

}  // namespace

Result<void> write_dropin_file(const std::filesystem::path& unit_dir, const std::string& unit,
                               const std::string& name, const std::string& content) {
  auto dir = unit_dir / (unit + ".d");
  if (unit.empty() || name.empty() || unit.find('/') != std::string::npos ||
      name.find('/') != std::string::npos || name == "." || name == "..")
    return make_error(Errc::internal, fmt::format("{}: not a drop-in path", (dir / name).string()));
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec)) {
    // create_directories applies the umask; systemd only needs to read, but people look here too.
    using std::filesystem::perms;
    std::filesystem::permissions(dir, perms::owner_all | perms::group_read | perms::group_exec |
                                          perms::others_read | perms::others_exec, ec);
  }
  if (ec) return util::errno_error(ec.value(), dir, "create directory");
  return util::write_file_atomically(dir / name, content, 0644);
}

namespace detail {

Error bus_error(const std::string& unit, std::string_view what, int r, const sd_bus_error& e) {
  std::string why = e.message && *e.message ? e.message : std::strerror(-r);
  return make_error(Errc::unit_failed, fmt::format("{}: {}: {}", unit, what, why));
}

Result<void> manager_call_result(const std::string& unit, const char* method, int r, const sd_bus_error& e,
                                 bool not_loaded_ok) {
  if (r >= 0) return {};
  if (not_loaded_ok && sd_bus_error_has_name(&e, kNoSuchUnit)) return {};
  return bus_error(unit, method, r, e);
}

Result<std::vector<std::uint32_t>> read_unit_processes(sd_bus_message* reply, const std::string& unit) {
  const sd_bus_error none = SD_BUS_ERROR_NULL;
  std::vector<std::uint32_t> pids;
  int r = sd_bus_message_enter_container(reply, 'a', "(sus)");
  if (r < 0) return bus_error(unit, "GetUnitProcesses reply", r, none);
  for (;;) {
    const char* cgroup = nullptr;
    std::uint32_t pid = 0;
    const char* cmdline = nullptr;
    r = sd_bus_message_read(reply, "(sus)", &cgroup, &pid, &cmdline);
    if (r < 0) return bus_error(unit, "GetUnitProcesses reply", r, none);
    if (r == 0) break;
    pids.push_back(pid);
  }
  return pids;
}

Result<std::vector<std::string>> read_units_up(sd_bus_message* reply, const std::string& what) {
  const sd_bus_error none = SD_BUS_ERROR_NULL;
  std::vector<std::string> names;
  int r = sd_bus_message_enter_container(reply, 'a', "(ssssssouso)");
  if (r < 0) return bus_error(what, "ListUnitsByPatterns reply", r, none);
  for (;;) {
    const char *name = nullptr, *description = nullptr, *load = nullptr, *active = nullptr, *sub = nullptr,
               *following = nullptr, *path = nullptr, *job_type = nullptr, *job_path = nullptr;
    std::uint32_t job = 0;
    r = sd_bus_message_read(reply, "(ssssssouso)", &name, &description, &load, &active, &sub, &following, &path, &job,
                            &job_type, &job_path);
    if (r < 0) return bus_error(what, "ListUnitsByPatterns reply", r, none);
    if (r == 0) break;
    if (is_up(parse_active_state(active))) names.emplace_back(name);
  }
  return names;
}

namespace {

// The value of a property's reply, a variant of type `type` holding a `T`; r < 0 (ENXIO) when
// it holds another type.
template <class T>
int read_variant(sd_bus_message* reply, char type, T& out) {
  const char contents[] = {type, '\0'};
  int r = sd_bus_message_enter_container(reply, 'v', contents);
  if (r >= 0) r = sd_bus_message_read_basic(reply, type, &out);
  return r;
}

int read_value(sd_bus_message* reply, std::uint32_t& out) { return read_variant(reply, 'u', out); }
int read_value(sd_bus_message* reply, std::int32_t& out) { return read_variant(reply, 'i', out); }
int read_value(sd_bus_message* reply, std::string& out) {
  const char* value = nullptr;
  int r = read_variant(reply, 's', value);
  if (r >= 0) out = value ? value : "";
  return r;
}

// Property `name` of `iface` into `out` through `get`; unit_failed "UNIT: NAME: why".
template <class T>
Result<void> read_property(const std::string& unit, const PropertyGetter& get, const char* iface, const char* name,
                           T& out) {
  BusError err;
  Reply reply;
  int r = get(iface, name, &err.e, &reply.m);
  if (r >= 0) r = read_value(reply.m, out);
  if (r < 0) return bus_error(unit, name, r, err.e);
  return {};
}

// Best effort: without it, readers of the unit's journal fall back to a time bound.
std::string read_invocation_property(const PropertyGetter& get) {
  BusError err;
  Reply reply;
  if (get(kUnit, "InvocationID", &err.e, &reply.m) < 0 || sd_bus_message_enter_container(reply.m, 'v', "ay") < 0)
    return {};
  return read_invocation_id(reply.m);
}

}  // namespace

Result<std::string> read_unit_path(sd_bus_message* reply, const std::string& unit) {
  const sd_bus_error none = SD_BUS_ERROR_NULL;
  const char* path = nullptr;
  int r = sd_bus_message_read(reply, "o", &path);
  if (r < 0) return bus_error(unit, "LoadUnit reply", r, none);
  return std::string(path ? path : "");
}

Result<UnitStatus> read_unit_status(const std::string& unit, const PropertyGetter& get) {
  // The properties are read one call each, so they are not one atomic snapshot: a caller that
  // waits for a state polls again anyway.
  UnitStatus st;
  std::string load_state;
  if (auto r = read_property(unit, get, kUnit, "LoadState", load_state); !r) return r.error();
  st.loaded = load_state == "loaded";
  std::string active_state;
  if (auto r = read_property(unit, get, kUnit, "ActiveState", active_state); !r) return r.error();
  st.active_state = parse_active_state(active_state);
  if (auto r = read_property(unit, get, kUnit, "SubState", st.sub_state); !r) return r.error();
  if (st.loaded && unit.ends_with(".service")) {
    if (auto r = read_property(unit, get, kService, "ExecMainPID", st.main_pid); !r) return r.error();
    std::int32_t status = 0;
    if (auto r = read_property(unit, get, kService, "ExecMainStatus", status); !r) return r.error();
    st.exec_main_status = status;
    if (auto r = read_property(unit, get, kService, "Result", st.result); !r) return r.error();
  }
  if (st.loaded) st.invocation_id = read_invocation_property(get);
  return st;
}

std::string read_invocation_id(sd_bus_message* reply) {
  const void* bytes = nullptr;
  std::size_t size = 0;
  if (sd_bus_message_read_array(reply, 'y', &bytes, &size) < 0 || size != 16) return {};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (std::size_t i = 0; i < size; ++i) {
    auto b = static_cast<const unsigned char*>(bytes)[i];
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 0xF]);
  }
  // A unit that never ran has the null ID.
  if (id.find_first_not_of('0') == std::string::npos) id.clear();
  return id;
}

}  // namespace detail

std::unique_ptr<ServiceManager> make_systemd_manager(asio::any_io_executor executor,
                                                     std::filesystem::path unit_dir) {
  return std::make_unique<SystemdManager>(std::move(executor), std::move(unit_dir));
}

}  // namespace modeld::units
