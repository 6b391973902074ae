// modelctl watch. The event stream is opened before the first GET /v1/status, so nothing that
// happens between the two is missed; events then patch that picture, and the phase and state
// changes (a handful per deployment) re-read the deployment and the active model, which the
// events do not carry in full (commit, finish time, the model that serves now).

#include "modelctl/watch.hpp"

#include "modelctl/format.hpp"
#include "modelctl/live.hpp"
#include "util/json.hpp"
#include "util/text.hpp"
#include "wire/models.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <ctime>
#include <optional>

namespace modelctl {
namespace {

using nlohmann::json;

bool interrupt_on_terminal = false;

// Ctrl-C is how a watch ends: exit 0. On a terminal the cursor goes below the "^C" the
// terminal echoed, so the shell's prompt does not land on the view's last line.
void on_interrupt(int) {
  if (interrupt_on_terminal) {
    const char nl = '\n';
    [[maybe_unused]] auto n = ::write(STDOUT_FILENO, &nl, 1);
  }
  ::_exit(exit_ok);
}

void exit_on_interrupt(bool tty) {
  interrupt_on_terminal = tty;
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
}

std::string clock_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

std::string active_text(const json& active) {
  if (!active.is_object()) return "none";
  // The unit is modeld-serve@MODEL.service: left out, the line fits a narrow terminal.
  return fmt::format("{} (commit {}) on port {}, since {}", str(active, "model"),
                     short_commit(active.value("commit", json())), active.value("port", 0), str(active, "since"));
}

// A finished deployment in one line: "ID of MODEL succeeded" or "... failed in phase P: code: message"
// ("pull ID ...", "stop ID ..." for a record of another kind).
std::string result_text(const json& d) {
  std::string state = str(d, "state");
  std::string out = fmt::format("{}{} of {} {}", kind_prefix(d), str(d, "id"), str(d, "model"), state);
  if (state != "succeeded") out += fmt::format(" in phase {}", str(d, "phase"));
  if (const auto& e = d.value("error", json()); e.is_object())
    out += fmt::format(": {}: {}", str(e, "code"), str(e, "message"));
  return out;
}

// "deployment " or the record's kind ("pull ", "stop "), to go before its id.
std::string noun_before_id(const json& d) {
  auto kind = kind_prefix(d);
  return kind.empty() ? "deployment " : kind;
}

class Watcher {
 public:
  Watcher(Daemon& daemon, const WatchOptions& o)
      : daemon_(daemon), o_(o), throttle_(o.tty ? live_progress_interval : plain_progress_interval) {}

  int run() {
    exit_on_interrupt(o_.tty && !o_.json);
    // Subscribe first: whatever happens after the snapshot below arrives as an event.
    EventStream events(daemon_);
    if (auto r = events.open(); !r) return report_unreachable(daemon_, r.error());
    if (!o_.model.empty()) {
      if (int code = check_model(); code != exit_ok) return code;
    }
    if (auto r = load(); !r) return report_unreachable(daemon_, r.error());
    if (o_.json) {
      emit_json("status", status_);
    } else if (o_.tty) {
      draw();
    } else {
      plain(fmt::format("modeld {} at {}{}", str(status_.value("daemon", json()), "version"), daemon_.socket_path(),
                        o_.model.empty() ? "" : ", model " + o_.model));
      plain("active: " + active_text(status_.value("active", json())));
      if (auto services = services_line(status_.value("services", json())); !services.empty())
        plain("services: " + services);
      if (!deployment_.is_object())
        plain("no deployment yet");
      else if (str(deployment_, "state") == "running")
        plain(fmt::format("{}{} of {} running, phase {}", noun_before_id(deployment_), str(deployment_, "id"),
                          str(deployment_, "model"), str(deployment_, "phase")));
      else
        plain_result("last deployment ");
    }
    std::optional<modeld::Error> failed;
    auto r = events.follow([&](const Event& e) {
      if (auto h = handle(e); !h) {
        failed = h.error();
        return false;
      }
      return true;
    });
    // The stream never ends on its own: either it broke or a re-read failed. Both mean the
    // daemon went away (or stopped answering).
    if (o_.tty && !o_.json) block_.keep();
    return report_unreachable(daemon_, failed ? *failed : r ? modeld::Error{modeld::Errc::network_error, "connection closed"}
                                                            : r.error());
  }

 private:
  // exit_refused with a message when the model is not configured; exit_ok when it is.
  int check_model() {
    auto r = daemon_.call("GET", "/v1/models");
    if (!r) return report_unreachable(daemon_, r.error());
    auto models = modeld::wire::models_from_json(json::parse(r->body, nullptr, false));
    if (r->status == 200 && models)
      for (const auto& m : *models)
        if (m.name == o_.model) return exit_ok;
    fmt::print(stderr, "modelctl: unknown model {}\n", o_.model);
    return exit_refused;
  }

  // The JSON answer to GET `target`; null when the daemon answers anything but 200 with JSON
  // (the view then keeps what it has); an error only when the daemon cannot be reached.
  modeld::Result<json> get(const std::string& target) {
    auto r = daemon_.call("GET", target);
    if (!r) return r.error();
    auto j = json::parse(r->body, nullptr, false);
    // json converts from anything, so the result is built explicitly as a value.
    if (r->status != 200 || !j.is_object()) return modeld::Result<json>(boost::system::in_place_value, json());
    return modeld::Result<json>(boost::system::in_place_value, std::move(j));
  }

  // The snapshot: status, and the deployment to show (the status's, or with a model the newest
  // of that model).
  modeld::Result<void> load() {
    auto s = get("/v1/status");
    if (!s) return s.error();
    if (!s->is_object()) return modeld::make_error(modeld::Errc::network_error, "GET /v1/status failed");
    status_ = std::move(*s);
    deployment_ = status_.value("deployment", json());
    if (!o_.model.empty() && (!deployment_.is_object() || str(deployment_, "model") != o_.model)) {
      deployment_ = json();
      auto list = get("/v1/deployments");
      if (!list) return list.error();
      if (list->is_object())
        for (const auto& d : list->value("deployments", json::array()))
        if (str(d, "model") == o_.model) {
          deployment_ = d;
          break;
        }
    }
    return {};
  }

  // Re-reads the active model and deployment `id` (of `model`) after a phase or state change.
  modeld::Result<void> refresh(const std::string& id, const std::string& model) {
    auto s = get("/v1/status");
    if (!s) return s.error();
    if (s->is_object()) status_ = std::move(*s);
    auto d = get("/v1/deployments/" + modeld::util::url_encode_segment(id));
    if (!d) return d.error();
    if (d->is_object())
      deployment_ = std::move(*d);
    else if (str(deployment_, "id", "") != id)
      deployment_ = json{{"id", id}, {"model", model}, {"state", "running"}, {"phase", json()}, {"progress", json::object()}};
    return {};
  }

  modeld::Result<void> handle(const Event& e) {
    auto data = json::parse(e.data, nullptr, false);
    if (!data.is_object()) return {};  // not ours to understand; a newer daemon may send more
    const std::string id = str(data, "id", ""), model = str(data, "model", "");
    if (!o_.model.empty() && model != o_.model) return {};
    if (o_.json) {
      emit_json(e.kind, data);
      return {};
    }
    const bool same = deployment_.is_object() && str(deployment_, "id", "") == id;
    const std::string active_before = active_text(status_.value("active", json()));
    if (e.kind == "progress") {
      if (!same) {
        if (auto r = refresh(id, model); !r) return r;
      }
      deployment_["progress"] = data.value("progress", json::object());
      progress(deployment_["progress"]);
      return {};
    }
    if (e.kind != "phase" && e.kind != "state") return {};
    if (auto r = refresh(id, model); !r) return r;
    // The event is the newer word on what it carries (the re-read may even be a step ahead;
    // then the next event catches it up).
    if (e.kind == "phase") {
      deployment_["phase"] = data.value("phase", json());
      if (o_.tty) draw();
      else plain(fmt::format("{} {} phase {}", id, model, str(data, "phase")));
    } else {
      for (const char* key : {"state", "phase", "error"})
        if (data.contains(key)) deployment_[key] = data[key];
      if (o_.tty) draw();
      else plain_result("");
    }
    if (!o_.tty) {
      if (auto active = active_text(status_.value("active", json())); active != active_before) plain("active: " + active);
    }
    return {};
  }

  void progress(const json& p) {
    const bool complete = progress_complete(p);
    if (o_.tty) {
      // The key is the whole view's text: a file's own bar moving counts too.
      std::string key;
      for (const auto& line : progress_lines(p, terminal_size(STDOUT_FILENO).columns)) key += line;
      if (throttle_.due(key, complete)) draw();
      return;
    }
    if (auto text = progress_summary(p); throttle_.due(text, complete))
      plain(fmt::format("{} {} progress {}", str(deployment_, "id"), str(deployment_, "model"), text));
  }

  void draw() {
    const auto columns = terminal_size(STDOUT_FILENO).columns;
    std::vector<std::string> lines;
    lines.push_back(fmt::format("{} {} at {}{}", o_.style.bold("modeld"), str(status_.value("daemon", json()), "version"),
                                daemon_.socket_path(), o_.model.empty() ? "" : ", model " + o_.model));
    lines.push_back("Active:      " + active_text(status_.value("active", json())));
    if (auto services = services_line(status_.value("services", json())); !services.empty())
      lines.push_back("Services:    " + services);
    const bool running = deployment_.is_object() && str(deployment_, "state") == "running";
    if (deployment_.is_object()) {
      for (auto& line : deployment_lines(deployment_, o_.style, columns)) lines.push_back(std::move(line));
    } else {
      lines.push_back("Deployment:  none yet");
    }
    lines.push_back(running ? "Following the deployment; Ctrl-C to quit"
                            : "Nothing running; waiting for the next deployment; Ctrl-C to quit");
    block_.draw(lines);
  }

  // The ended deployment's result_text() after `prefix`, then its switch when it has one.
  void plain_result(const std::string& prefix) {
    plain(prefix + result_text(deployment_));
    if (auto s = switch_text(deployment_); !s.empty()) plain(fmt::format("{} switch {}", str(deployment_, "id"), s));
  }

  void plain(const std::string& line) {
    fmt::print("{} {}\n", clock_now(), line);
    std::fflush(stdout);
  }

  void emit_json(const std::string& kind, const json& data) {
    fmt::print("{}\n", modeld::util::dump_json(json{{"event", kind}, {"data", data}}));
    std::fflush(stdout);
  }

  Daemon& daemon_;
  const WatchOptions& o_;
  Throttle throttle_;
  LiveBlock block_;
  json status_;
  json deployment_;
};

}  // namespace

int watch(Daemon& daemon, const WatchOptions& options) { return Watcher(daemon, options).run(); }

}  // namespace modelctl
