// modelctl watch. The event stream is opened before the first GET /v1/status, so nothing that
// happens between the two is missed; events then patch that picture, and the phase and state
// changes (a handful per deployment) re-read the deployment and the active model, which the
// events do not carry in full (commit, finish time, the model that serves now).

#include "modelctl/watch.hpp"

#include "modelctl/format.hpp"
#include "modelctl/live.hpp"
#include "util/json.hpp"
#include "util/text.hpp"
#include "wire/event.hpp"
#include "wire/models.hpp"
#include "wire/record.hpp"
#include "wire/status.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <ctime>
#include <optional>

namespace modelctl {
namespace {

using nlohmann::json;
namespace wire = modeld::wire;

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

std::string active_text(const std::optional<wire::Active>& active) {
  if (!active) return "none";
  // The unit is modeld-serve@MODEL.service: left out, the line fits a narrow terminal.
  return fmt::format("{} (commit {}) on port {}, since {}", esc(active->model), short_commit(active->commit),
                     active->port, esc(active->since));
}

// A finished deployment in one line: "ID of MODEL succeeded" or "... failed in phase P: code: message"
// ("pull ID ...", "stop ID ..." for a record of another kind).
std::string result_text(const wire::Record& d) {
  std::string out = fmt::format("{}{} of {} {}", kind_prefix(d), esc(d.id), esc(d.model), wire::to_string(d.state));
  if (d.state != wire::State::succeeded) out += fmt::format(" in phase {}", wire::to_string(d.phase));
  if (d.error) out += fmt::format(": {}: {}", modeld::to_string(d.error->code), esc(d.error->message));
  return out;
}

// "deployment " or the record's kind ("pull ", "stop "), to go before its id.
std::string noun_before_id(const wire::Record& d) {
  auto kind = kind_prefix(d);
  return kind.empty() ? "deployment " : kind;
}

// What the view shows of a deployment known only from its event `e` (the daemon did not answer
// for its record): its id, model and phase, running.
wire::Record placeholder(const wire::Event& e) {
  wire::Record r;
  r.id = e.id;
  r.model = e.model;
  r.phase = e.phase;
  return r;
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
    if (auto r = load(); !r) return fail(r.error());
    if (o_.json) emit_json("status", status_body_);
    else if (o_.tty) draw();
    else plain_snapshot();
    std::optional<modeld::Error> failed;
    auto r = events.follow([&](const Event& e) {
      if (auto h = handle(e); !h) {
        failed = h.error();
        return false;
      }
      return true;
    });
    // The stream never ends on its own: either it broke, a re-read failed (both mean the daemon
    // went away or stopped answering) or what it sent did not read.
    return fail(failed ? *failed : r ? modeld::Error{modeld::Errc::network_error, "connection closed"} : r.error());
  }

 private:
  // The exit code and line of `e`: the daemon unreachable (network_error), else an answer or
  // event modelctl cannot read.
  int fail(const modeld::Error& e) {
    if (o_.tty && !o_.json) block_.keep();
    return e.code == modeld::Errc::network_error ? report_unreachable(daemon_, e) : report_unreadable(e);
  }

  // exit_refused with a message when the model is not configured; exit_ok when it is.
  int check_model() {
    auto r = daemon_.call("GET", "/v1/models");
    if (!r) return report_unreachable(daemon_, r.error());
    auto models = wire::models_from_json(json::parse(r->body, nullptr, false));
    if (r->status == 200 && models)
      for (const auto& m : *models)
        if (m.name == o_.model) return exit_ok;
    fmt::print(stderr, "modelctl: unknown model {}\n", o_.model);
    return exit_refused;
  }

  // The JSON answer to GET `target`; nullopt when the daemon answers anything but 200 with a
  // JSON object (the view then keeps what it has); an error only when it cannot be reached.
  modeld::Result<std::optional<json>> get(const std::string& target) {
    auto r = daemon_.call("GET", target);
    if (!r) return r.error();
    auto j = json::parse(r->body, nullptr, false);
    if (r->status != 200 || !j.is_object()) return std::optional<json>();
    return std::optional<json>(std::move(j));
  }

  // GET `target` read as T by `parse`: nullopt as get() has it; bad_request when it does not read.
  template <class T>
  modeld::Result<std::optional<T>> get_as(const std::string& target, modeld::Result<T> (*parse)(const json&)) {
    auto j = get(target);
    if (!j) return j.error();
    if (!*j) return std::optional<T>();
    auto v = parse(**j);
    if (!v) return v.error();
    return std::optional<T>(std::move(*v));
  }

  // Takes the body of GET /v1/status `body` as the picture's status.
  modeld::Result<void> take_status(json body) {
    auto s = wire::status_from_json(body);
    if (!s) return s.error();
    status_ = std::move(*s);
    status_body_ = std::move(body);
    return {};
  }

  // The snapshot: status, and the deployment to show (the status's, or with a model the newest
  // of that model).
  modeld::Result<void> load() {
    auto s = get("/v1/status");
    if (!s) return s.error();
    if (!*s) return modeld::make_error(modeld::Errc::network_error, "GET /v1/status failed");
    if (auto t = take_status(std::move(**s)); !t) return t;
    deployment_ = status_.deployment;
    if (!o_.model.empty() && (!deployment_ || deployment_->model != o_.model)) {
      deployment_.reset();
      auto list = get_as("/v1/deployments", wire::deployments_from_json);
      if (!list) return list.error();
      if (*list)
        for (auto& d : **list)
          if (d.model == o_.model) {
            deployment_ = std::move(d);
            break;
          }
    }
    return {};
  }

  // Re-reads the active model and the deployment of event `e` after a phase or state change.
  modeld::Result<void> refresh(const wire::Event& e) {
    auto s = get("/v1/status");
    if (!s) return s.error();
    if (*s) {
      if (auto t = take_status(std::move(**s)); !t) return t;
    }
    auto d = get_as("/v1/deployments/" + modeld::util::url_encode_segment(e.id), wire::record_from_json);
    if (!d) return d.error();
    if (*d)
      deployment_ = std::move(**d);
    else if (!deployment_ || deployment_->id != e.id)
      deployment_ = placeholder(e);
    return {};
  }

  modeld::Result<void> handle(const Event& raw) {
    auto read = read_event(raw);
    if (!read) return read.error();
    // An event of a kind this modelctl does not know (a newer daemon may send more) is not ours
    // to understand: --json passes it on as it is, unless a model filters what it cannot tell.
    if (!*read) {
      if (auto data = json::parse(raw.data, nullptr, false); o_.json && o_.model.empty() && data.is_object())
        emit_json(raw.kind, data);
      return {};
    }
    const wire::Event& e = **read;
    if (!o_.model.empty() && e.model != o_.model) return {};
    if (o_.json) {
      emit_json(raw.kind, json::parse(raw.data));
      return {};
    }
    if (e.kind == wire::EventKind::progress) {
      if (!deployment_ || deployment_->id != e.id) {
        if (auto r = refresh(e); !r) return r;
      }
      deployment_->progress = e.progress;
      progress(deployment_->progress);
      return {};
    }
    if (e.kind != wire::EventKind::phase && e.kind != wire::EventKind::state) return {};
    const std::string active_before = active_text(status_.active);
    if (auto r = refresh(e); !r) return r;
    apply(e);
    if (!o_.tty) {
      if (auto active = active_text(status_.active); active != active_before) plain("active: " + active);
    }
    return {};
  }

  // Shows phase or state event `e`, the newer word on what it carries (the re-read may even be a
  // step ahead; then the next event catches it up).
  void apply(const wire::Event& e) {
    deployment_->phase = e.phase;
    if (e.kind == wire::EventKind::state) {
      deployment_->state = e.state;
      deployment_->error = e.error;
    }
    if (o_.tty) draw();
    else if (e.kind == wire::EventKind::phase) plain(fmt::format("{} {} phase {}", esc(e.id), esc(e.model), wire::to_string(e.phase)));
    else plain_result("");
  }

  void progress(const wire::Progress& p) {
    const bool complete = progress_complete(p);
    if (o_.tty) {
      // The key is the whole view's text: a file's own bar moving counts too.
      std::string key;
      for (const auto& line : progress_lines(p, terminal_size(STDOUT_FILENO).columns)) key += line;
      if (throttle_.due(key, complete)) draw();
      return;
    }
    if (auto text = progress_summary(p); throttle_.due(text, complete))
      plain(fmt::format("{} {} progress {}", esc(deployment_->id), esc(deployment_->model), text));
  }

  // The snapshot as plain lines: the daemon, the active model, the services and the deployment.
  void plain_snapshot() {
    plain(fmt::format("modeld {} at {}{}", esc(status_.version), daemon_.socket_path(),
                      o_.model.empty() ? "" : ", model " + o_.model));
    plain("active: " + active_text(status_.active));
    if (auto services = services_line(status_.services); !services.empty()) plain("services: " + services);
    if (!deployment_)
      plain("no deployment yet");
    else if (!deployment_->ended())
      plain(fmt::format("{}{} of {} running, phase {}", noun_before_id(*deployment_), esc(deployment_->id),
                        esc(deployment_->model), wire::to_string(deployment_->phase)));
    else
      plain_result("last deployment ");
  }

  void draw() {
    const auto columns = terminal_size(STDOUT_FILENO).columns;
    std::vector<std::string> lines;
    lines.push_back(fmt::format("{} {} at {}{}", o_.style.bold("modeld"), esc(status_.version),
                                daemon_.socket_path(), o_.model.empty() ? "" : ", model " + o_.model));
    lines.push_back("Active:      " + active_text(status_.active));
    if (auto services = services_line(status_.services); !services.empty()) lines.push_back("Services:    " + services);
    const bool running = deployment_ && !deployment_->ended();
    if (deployment_) {
      for (auto& line : deployment_lines(*deployment_, o_.style, columns)) lines.push_back(std::move(line));
    } else {
      lines.push_back("Deployment:  none yet");
    }
    lines.push_back(running ? "Following the deployment; Ctrl-C to quit"
                            : "Nothing running; waiting for the next deployment; Ctrl-C to quit");
    block_.draw(lines);
  }

  // The ended deployment's result_text() after `prefix`, then its switch when it has one.
  void plain_result(const std::string& prefix) {
    plain(prefix + result_text(*deployment_));
    if (auto s = switch_text(*deployment_); !s.empty()) plain(fmt::format("{} switch {}", esc(deployment_->id), s));
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
  wire::Status status_;
  json status_body_;  ///< status_ as the daemon sent it, for --json
  std::optional<wire::Record> deployment_;
};

}  // namespace

int watch(Daemon& daemon, const WatchOptions& options) { return Watcher(daemon, options).run(); }

}  // namespace modelctl
