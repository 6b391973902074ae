// modelctl: the command-line client of modeld (interface.md "Programs"). Each command is one
// or two requests over the control socket; exit codes follow the contract's table, and 3
// always means the daemon could not be reached.

#include "modelctl/client.hpp"
#include "modelctl/format.hpp"
#include "modelctl/live.hpp"
#include "modelctl/watch.hpp"
#include "util/json.hpp"

#include "repo/ids.hpp"
#include "util/text.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using modelctl::Daemon;
using modelctl::exit_failed;
using modelctl::exit_ok;
using modelctl::exit_refused;
using modelctl::exit_unreachable;

struct Context {
  Daemon& daemon;
  bool json = false;
  modelctl::Style style;
  bool tty = false;
};

int unreachable(const Daemon& d, const modeld::Error& e) { return modelctl::report_unreachable(d, e); }

std::optional<json> parse_body(const modelctl::Reply& r) {
  auto j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) {
    fmt::print(stderr, "modelctl: modeld answered {} with a body that is not JSON\n", r.status);
    return std::nullopt;
  }
  return j;
}

// The answer `j` read as the wire type T by `parse`; nullopt, with the contract's one line on
// stderr, when it is not one (a daemon of another version).
template <class T>
std::optional<T> read_answer(const json& j, modeld::Result<T> (*parse)(const json&)) {
  auto v = parse(j);
  if (!v) {
    modelctl::report_unreadable(v.error());
    return std::nullopt;
  }
  return std::move(*v);
}

// The answer `r` read as the wire type T by `parse`: nullopt, with the contract's one line on
// stderr, when it is not JSON or not a T.
template <class T>
std::optional<T> read_reply(const modelctl::Reply& r, modeld::Result<T> (*parse)(const json&)) {
  auto j = parse_body(r);
  if (!j) return std::nullopt;
  return read_answer(*j, parse);
}

void print_raw(const std::string& body) {
  std::fputs(body.c_str(), stdout);
  if (body.empty() || body.back() != '\n') std::fputc('\n', stdout);
}

// Prints an error answer: as it is with --json, else its message.
void print_error(const Context& c, const modelctl::Reply& r) {
  if (c.json) {
    print_raw(r.body);
    return;
  }
  auto j = json::parse(r.body, nullptr, false);
  std::string message = fmt::format("modeld answered {}", r.status);
  if (j.is_object() && j.contains("error") && j["error"].is_object())
    message = modelctl::str(j["error"], "message", message);
  fmt::print(stderr, "modelctl: {}\n", message);
}

// GETs `path` and prints the answer: as it is with --json, else read as T by `parse` and
// shown through `render` (exit 1 when it does not read).
template <class T>
int show(Context& c, const char* path, modeld::Result<T> (*parse)(const json&),
         std::string (*render)(const T&, const modelctl::Style&)) {
  auto r = c.daemon.call("GET", path);
  if (!r) return unreachable(c.daemon, r.error());
  if (r->status != 200) {
    print_error(c, *r);
    return exit_failed;
  }
  if (c.json) {
    print_raw(r->body);
    return exit_ok;
  }
  auto answer = read_reply(*r, parse);
  if (!answer) return exit_failed;
  std::fputs(render(*answer, c.style).c_str(), stdout);
  return exit_ok;
}

int cmd_status(Context& c) { return show(c, "/v1/status", modeld::wire::status_from_json, modelctl::status_text); }

int cmd_models(Context& c) { return show(c, "/v1/models", modeld::wire::models_from_json, modelctl::models_table); }

// Shows a deployment's phases and download progress: phases as lines that stay; progress on a
// terminal as a block (the whole download and each file in flight, with bars) redrawn in place
// below the last phase, otherwise as a plain line every plain_progress_interval.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool tty)
      : tty_(tty), throttle_(tty ? modelctl::live_progress_interval : modelctl::plain_progress_interval) {}

  void progress(const modeld::wire::Progress& p) {
    const bool complete = modelctl::progress_complete(p);
    if (tty_) {
      auto lines = modelctl::progress_lines(p, modelctl::terminal_size(STDOUT_FILENO).columns);
      std::string key;
      for (const auto& l : lines) key += l;
      if (throttle_.due(key, complete)) block_.draw(lines);
      return;
    }
    if (auto text = modelctl::progress_summary(p); throttle_.due(text, complete)) {
      fmt::print("  {}\n", text);
      std::fflush(stdout);
    }
  }

  void line(const std::string& text) {
    block_.keep();
    fmt::print("{}\n", text);
    std::fflush(stdout);
  }

 private:
  bool tty_;
  modelctl::Throttle throttle_;
  modelctl::LiveBlock block_;
};

// Shows event `e` of the followed deployment (nothing with --json, where only the end counts):
// phases as lines, the download's progress through `out`; true when it says the deployment ended.
bool show_event(const Context& c, const modeld::wire::Event& e, ProgressPrinter& out) {
  using modeld::wire::EventKind;
  if (e.kind == EventKind::state) return e.state != modeld::wire::State::running;
  if (c.json) return false;
  if (e.kind == EventKind::phase)
    out.line(fmt::format("phase: {}", modeld::wire::to_string(e.phase)));
  else if (e.kind == EventKind::progress && e.phase != modeld::wire::Phase::warming)  // the download's
    out.progress(e.progress);
  return false;
}

// Follows deployment `id` on `events` until it ends: exit_ok, else the exit code of a daemon that
// became unreachable or sent what modelctl cannot read (the message is printed).
int follow_deployment(Context& c, const std::string& id, modelctl::EventStream& events) {
  ProgressPrinter out(c.tty);
  constexpr int max_reconnects = 10;
  for (int attempt = 0;; ++attempt) {
    bool ended = false;
    std::optional<modeld::Error> unreadable;
    auto r = events.follow([&](const modelctl::Event& raw) {
      auto e = modelctl::read_event(raw);
      if (!e) unreadable = e.error();
      else if (*e && (*e)->id == id) ended = show_event(c, **e, out);
      return !ended && !unreadable;
    });
    if (unreadable) return modelctl::report_unreadable(*unreadable);
    if (r || ended) return exit_ok;
    // The stream broke (a daemon restart continues the deployment): reconnect, then ask
    // whether it ended while no one listened.
    if (attempt >= max_reconnects) return unreachable(c.daemon, r.error());
    if (auto reopened = events.open(); !reopened) return unreachable(c.daemon, reopened.error());
    auto d = c.daemon.call("GET", "/v1/deployments/" + modeld::util::url_encode_segment(id));
    if (!d) return unreachable(c.daemon, d.error());
    auto j = json::parse(d->body, nullptr, false);
    if (d->status != 200 || !j.is_object()) continue;
    auto record = read_answer(j, modeld::wire::record_from_json);
    if (!record) return exit_failed;
    if (record->ended()) return exit_ok;
  }
}

// What deploy, pull and stop start: POST `body` to `target`, a record called `noun` ("deployment",
// "pull", "stop") whose progress is announced as `doing` ("Deploying", "Pulling", "Stopping").
struct Start {
  std::string target, body;
  std::string noun, doing;
};

int report_end(Context& c, const std::string& name, const std::string& id, const std::string& noun_of_kind);

// Starts the record `s` of model `name` and, with `wait`, follows it to its end.
int start_record(Context& c, const std::string& name, bool wait, const Start& s) {
  // Subscribe first, so that no event of the new deployment can slip by.
  std::optional<modelctl::EventStream> events;
  if (wait) {
    events.emplace(c.daemon);
    if (auto r = events->open(); !r) return unreachable(c.daemon, r.error());
  }
  auto r = c.daemon.call("POST", s.target, s.body);
  if (!r) return unreachable(c.daemon, r.error());
  if (r->status != 202) {
    print_error(c, *r);
    return r->status >= 400 && r->status < 500 ? exit_refused : exit_failed;
  }
  auto d = read_reply(*r, modeld::wire::record_from_json);
  if (!d) return exit_failed;
  const std::string id = d->id;
  if (!wait) {
    if (c.json)
      print_raw(r->body);
    else
      fmt::print("Started {} {} of {}\n", s.noun, id, name);
    return exit_ok;
  }
  if (!c.json) fmt::print("{} {} ({} {})\n", s.doing, name, s.noun, id);
  std::fflush(stdout);
  if (int code = follow_deployment(c, id, *events); code != exit_ok) return code;
  return report_end(c, name, id, s.noun);
}

// Prints how record `d`, `id` of model `name` (a `noun_of_kind`: "deployment", "pull", "stop"),
// ended, as deploy --wait does.
void print_end(const Context& c, const std::string& name, const std::string& id, const modeld::wire::Record& d,
               const std::string& noun_of_kind) {
  std::string noun = noun_of_kind;
  noun[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(noun[0])));
  const std::string state(modeld::wire::to_string(d.state));
  const bool succeeded = d.state == modeld::wire::State::succeeded;
  // The switch first: the result stays the last line, which scripts read.
  if (auto sw = modelctl::switch_text(d); !sw.empty()) fmt::print("Switch: {}\n", sw);
  if (succeeded && !d.changed && noun_of_kind == "deployment")
    fmt::print("{} {} {}: {} already serving, nothing to do\n", noun, id, c.style.state(state), name);
  else if (succeeded && !d.changed && noun_of_kind == "stop")
    fmt::print("{} {} {}: {} was not in service, nothing to do\n", noun, id, c.style.state(state), name);
  else if (succeeded)
    fmt::print("{} {} {}{}\n", noun, id, c.style.state(state),
               noun_of_kind == "pull" && !d.changed ? " (already on disk and verified)" : "");
  else
    fmt::print("{} {} {} in phase {}\n", noun, id, c.style.state(state), modeld::wire::to_string(d.phase));
  if (d.error)
    fmt::print(stderr, "modelctl: {}: {}\n", modeld::to_string(d.error->code), modelctl::esc(d.error->message));
}

// Prints how record `id` of model `name` (a `noun`: "deployment", "pull", "stop") ended, as
// deploy --wait does; its exit code.
int report_end(Context& c, const std::string& name, const std::string& id, const std::string& noun_of_kind) {
  auto final = c.daemon.call("GET", "/v1/deployments/" + modeld::util::url_encode_segment(id));
  if (!final) return unreachable(c.daemon, final.error());
  if (final->status != 200) {
    print_error(c, *final);
    return exit_failed;
  }
  if (c.json) print_raw(final->body);
  auto d = read_reply(*final, modeld::wire::record_from_json);
  if (!d) return exit_failed;
  if (!c.json) print_end(c, name, id, *d, noun_of_kind);
  return d->state == modeld::wire::State::succeeded ? exit_ok : exit_failed;
}

// What `modelctl deploy` asks for besides the model.
struct DeployOptions {
  bool allow_downtime = false;
  bool restart = false;
  std::string commit;  ///< empty: the configured revision
};

int cmd_deploy(Context& c, const std::string& name, bool wait, const DeployOptions& o) {
  json body{{"model", name}, {"allow_downtime", o.allow_downtime}};
  if (o.restart) body["restart"] = true;
  if (!o.commit.empty()) body["commit"] = o.commit;
  return start_record(c, name, wait, {"/v1/deployments", modeld::util::dump_json(body), "deployment", "Deploying"});
}

int cmd_pull(Context& c, const std::string& name, bool wait, const std::string& commit) {
  const std::string body = commit.empty() ? std::string() : modeld::util::dump_json(json{{"commit", commit}});
  return start_record(c, name, wait,
                      {"/v1/models/" + modeld::util::url_encode_segment(name) + "/pull", body, "pull", "Pulling"});
}

// The noun of a record's kind, as start_record names it.
std::string noun_of(const modeld::wire::Record& d) {
  return d.kind == modeld::wire::Kind::deploy ? "deployment" : std::string(modeld::wire::to_string(d.kind));
}

// `modelctl deployment ID [--wait]`: one record; with `wait`, followed to its end first.
int cmd_deployment(Context& c, const std::string& id, bool wait) {
  std::optional<modelctl::EventStream> events;
  if (wait) {  // subscribed before reading the record, so that its end cannot slip by
    events.emplace(c.daemon);
    if (auto r = events->open(); !r) return unreachable(c.daemon, r.error());
  }
  auto r = c.daemon.call("GET", "/v1/deployments/" + modeld::util::url_encode_segment(id));
  if (!r) return unreachable(c.daemon, r.error());
  if (r->status != 200) {
    print_error(c, *r);
    return r->status == 404 ? exit_refused : exit_failed;
  }
  auto d = read_reply(*r, modeld::wire::record_from_json);
  if (!d) return exit_failed;
  const std::string name = d->model;
  if (!wait) {
    if (c.json)
      print_raw(r->body);
    else
      fmt::print("{} {} of {}: {} in phase {}\n", noun_of(*d), id, name, modeld::wire::to_string(d->state),
                 modeld::wire::to_string(d->phase));
    return exit_ok;
  }
  if (!d->ended()) {
    if (!c.json) fmt::print("Following {} {} of {}\n", noun_of(*d), id, name);
    std::fflush(stdout);
    if (int code = follow_deployment(c, id, *events); code != exit_ok) return code;
  }
  return report_end(c, name, id, noun_of(*d));
}

int cmd_stop(Context& c, const std::string& name, bool wait) {
  return start_record(c, name, wait,
                      {"/v1/models/" + modeld::util::url_encode_segment(name) + "/stop", "", "stop", "Stopping"});
}

int cmd_cancel(Context& c) {
  auto s = c.daemon.call("GET", "/v1/status");
  if (!s) return unreachable(c.daemon, s.error());
  if (s->status != 200) {
    print_error(c, *s);
    return exit_failed;
  }
  auto status = read_reply(*s, modeld::wire::status_from_json);
  if (!status) return exit_failed;
  if (!status->deployment || status->deployment->ended()) {
    fmt::print(stderr, "modelctl: no deployment is running\n");
    return exit_failed;
  }
  const auto& d = *status->deployment;
  const std::string& id = d.id;
  auto r = c.daemon.call("POST", "/v1/deployments/" + modeld::util::url_encode_segment(id) + "/cancel");
  if (!r) return unreachable(c.daemon, r.error());
  if (r->status == 200) {
    if (c.json)
      print_raw(r->body);
    else {
      // A pull or a stop is named by its kind, as status names it.
      fmt::print("Cancelling {} {} of {}\n", noun_of(d), id, modelctl::esc(d.model));
    }
    return exit_ok;
  }
  print_error(c, *r);
  // 409 or 404: it ended between the two requests, so nothing runs any more.
  if (r->status == 409 || r->status == 404) return exit_failed;
  return r->status == 403 ? exit_refused : exit_failed;
}

// A model name as the contract spells it ([a-z0-9][a-z0-9._-]{0,63}); anything else is bad usage
// (exit 2) before any request, quoted with control bytes escaped so a terminal shows them.
const CLI::Validator kModelName(
    [](std::string& name) -> std::string {
      if (modeld::repo::valid_model_name(name)) return {};
      std::string shown;
      for (unsigned char ch : name)
        shown += (ch < 0x20 || ch == 0x7f || ch >= 0x80) ? fmt::format("\\x{:02x}", ch) : std::string(1, static_cast<char>(ch));
      return fmt::format("\"{}\" is not a model name (lower-case letters, digits, '.', '_', '-'; at most 64)", shown);
    },
    "NAME");

// A commit id as the Hub writes it (40 lowercase hex digits); anything else is bad usage (exit 2).
const CLI::Validator kCommit(
    [](std::string& commit) -> std::string {
      return modeld::repo::is_commit_id(commit) ? std::string() : "a commit is 40 lowercase hex digits";
    },
    "COMMIT");

int cmd_logs(bool follow, const std::string& name) {
  if (!name.empty() && !modeld::repo::valid_model_name(name)) {
    fmt::print(stderr, "modelctl: \"{}\" is not a valid model name\n", name);
    return exit_refused;
  }
  std::string unit = name.empty() ? "modeld.service" : "modeld-serve@" + name + ".service";
  std::vector<std::string> args{"journalctl", "-u", unit};
  if (follow) args.emplace_back("-f");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp("journalctl", argv.data());
  fmt::print(stderr, "modelctl: cannot run journalctl: {}\n", std::strerror(errno));
  return exit_failed;
}

// Plan, verify and rm wait for the Hub, for hashing a whole checkpoint or for deleting one:
// their answers may take far longer than the usual per-read deadline.
constexpr auto slow_timeout = std::chrono::hours(24);

// The exit code of a refused or failed model request: 2 for an unknown model (404) or a caller
// who may not (403), as for deploy; 1 otherwise (a conflict, the Hub, the disk).
int model_request_failed(const Context& c, const modelctl::Reply& r) {
  print_error(c, r);
  return r.status == 404 || r.status == 403 ? exit_refused : exit_failed;
}

// plan, verify and rm: one request that may take long (verify hashes the whole checkpoint), the
// answer read as T by `parse` and printed raw (--json) or as `text`; exit 0 when `ok` says the
// answer is good.
template <class T>
int model_command(Context& c, const char* method, const std::string& target,
                  modeld::Result<T> (*parse)(const json&), const std::function<std::string(const T&)>& text,
                  const std::function<bool(const T&)>& ok) {
  Daemon slow(c.daemon.socket_path(), slow_timeout);
  auto r = slow.call(method, target);
  if (!r) return unreachable(c.daemon, r.error());
  if (r->status != 200) return model_request_failed(c, *r);
  auto j = parse_body(*r);
  if (!j) return exit_failed;
  auto answer = read_answer(*j, parse);
  if (!answer) return exit_failed;
  if (c.json)
    print_raw(r->body);
  else
    std::fputs(text(*answer).c_str(), stdout);
  return ok(*answer) ? exit_ok : exit_failed;
}

std::string model_target(const std::string& name) { return "/v1/models/" + modeld::util::url_encode_segment(name); }

int cmd_plan(Context& c, const std::string& name, bool allow_downtime, const std::string& commit) {
  std::vector<std::string> params;
  if (allow_downtime) params.emplace_back("allow_downtime=true");
  if (!commit.empty()) params.push_back("commit=" + commit);
  using modeld::wire::PlanReport;
  return model_command<PlanReport>(
      c, "GET", model_target(name) + "/plan" + (params.empty() ? "" : fmt::format("?{}", fmt::join(params, "&"))),
      modeld::wire::plan_from_json, [&](const PlanReport& p) { return modelctl::plan_text(p, c.style); },
      [](const PlanReport& p) { return p.fits && modelctl::preflight_passed(p); });
}

int cmd_verify(Context& c, const std::string& name) {
  using modeld::wire::VerifyReport;
  return model_command<VerifyReport>(
      c, "POST", model_target(name) + "/verify", modeld::wire::verify_from_json,
      [&](const VerifyReport& r) { return modelctl::verify_text(r, c.style); },
      [](const VerifyReport& r) { return r.ok(); });
}

int cmd_rm(Context& c, const std::string& name, const std::string& commit) {
  using modeld::wire::Removal;
  return model_command<Removal>(
      c, "DELETE", model_target(name) + (commit.empty() ? "" : "?commit=" + commit), modeld::wire::removal_from_json,
      [](const Removal& r) { return modelctl::removal_text(r); }, [](const Removal&) { return true; });
}

// The command line: global options, the subcommand given and its arguments.
struct CommandLine {
  std::string socket;
  bool json_output = false;
  CLI::App *status = nullptr, *models = nullptr, *deploy = nullptr, *cancel = nullptr, *plan = nullptr,
           *verify = nullptr, *rm = nullptr, *watch = nullptr, *logs = nullptr, *pull = nullptr, *stop = nullptr,
           *deployment = nullptr;
  std::string deploy_name, plan_name, verify_name, rm_name, watch_name, logs_name, pull_name, stop_name;
  std::string deploy_commit, rm_commit, pull_commit, plan_commit, deployment_id;
  bool wait = false, allow_downtime = false, restart = false, follow = false;
};

// Declares the options and subcommands of `app`, parsed into `cl`.
void define_commands(CLI::App& app, CommandLine& cl) {
  app.set_version_flag("--version", "modelctl " MODELD_VERSION);
  app.add_option("--socket", cl.socket,
                 "control socket (default: $MODELD_SOCKET, else /run/modeld/modeld.sock)");
  app.add_flag("--json", cl.json_output, "print the API's JSON as it is");
  app.require_subcommand(1);

  auto sub = [&](const char* name, const char* what) {
    auto* s = app.add_subcommand(name, what);
    s->fallthrough();  // global options may also come after the command
    return s;
  };
  cl.status = sub("status", "show the daemon, the models in service and the current deployment");
  cl.models = sub("models", "list configured models and their on-disk state");
  cl.deploy = sub("deploy", "start a deployment of a model");
  cl.deploy->add_option("NAME", cl.deploy_name, "model to deploy")->required()->check(kModelName);
  cl.deploy->add_flag("--wait", cl.wait, "follow the deployment to its end");
  cl.deploy->add_flag("--allow-downtime", cl.allow_downtime,
                      "stop the active model before freeing disk when it must be evicted");
  cl.deploy->add_flag("--restart", cl.restart,
                      "restart the model even when it already serves that commit with the same settings");
  cl.deploy->add_option("--commit", cl.deploy_commit, "deploy exactly this commit (e.g. one pulled ahead)")
      ->check(kCommit);
  cl.pull = sub("pull", "download and verify a model ahead, touching no service");
  cl.pull->add_option("NAME", cl.pull_name, "model to pull")->required()->check(kModelName);
  cl.pull->add_flag("--wait", cl.wait, "follow the pull to its end");
  cl.pull->add_option("--commit", cl.pull_commit, "pull exactly this commit, not what the branch names now")
      ->check(kCommit);
  cl.stop = sub("stop", "take a model out of service, keeping its files and every other service");
  cl.stop->add_option("NAME", cl.stop_name, "model to stop")->required()->check(kModelName);
  cl.stop->add_flag("--wait", cl.wait, "follow the stop to its end");
  cl.cancel = sub("cancel", "cancel the running deployment");
  cl.plan = sub("plan", "dry run: what a deployment would fetch and evict");
  cl.plan->add_option("NAME", cl.plan_name, "model")->required()->check(kModelName);
  cl.plan->add_flag("--allow-downtime", cl.allow_downtime, "plan as deploy --allow-downtime would");
  cl.plan->add_option("--commit", cl.plan_commit, "plan exactly this commit, as deploy --commit would")->check(kCommit);
  cl.deployment = sub("deployment", "show one deployment, pull or stop record by its id");
  cl.deployment->add_option("ID", cl.deployment_id, "the record's id")->required();
  cl.deployment->add_flag("--wait", cl.wait, "follow it to its end");
  cl.verify = sub("verify", "re-hash and re-check a model on disk");
  cl.verify->add_option("NAME", cl.verify_name, "model")->required()->check(kModelName);
  cl.rm = sub("rm", "delete a model's files");
  cl.rm->add_option("NAME", cl.rm_name, "model")->required()->check(kModelName);
  cl.rm->add_option("--commit", cl.rm_commit, "delete only this revision")->check(kCommit);
  cl.watch = sub("watch", "follow the daemon live: active model, deployment phases and progress");
  cl.watch->add_option("NAME", cl.watch_name, "only deployments of this model")->check(kModelName);
  cl.logs = sub("logs", "show the daemon's journal, or a model service's");
  cl.logs->add_flag("-f,--follow", cl.follow, "keep following new lines");
  cl.logs->add_option("NAME", cl.logs_name, "model whose service journal to show")->check(kModelName);
}

// Runs the subcommand `cl` names; its exit code.
int run_command(CommandLine& cl) {
  if (cl.logs->parsed()) return cmd_logs(cl.follow, cl.logs_name);

  if (cl.socket.empty()) {
    const char* env = std::getenv("MODELD_SOCKET");
    cl.socket = env && *env ? env : "/run/modeld/modeld.sock";
  }
  Daemon daemon(cl.socket);
  Context c{daemon};
  c.json = cl.json_output;
  c.tty = ::isatty(STDOUT_FILENO) == 1;
  const char* no_color = std::getenv("NO_COLOR");
  c.style.color = c.tty && !(no_color && *no_color);

  if (cl.status->parsed()) return cmd_status(c);
  if (cl.models->parsed()) return cmd_models(c);
  if (cl.deploy->parsed())
    return cmd_deploy(c, cl.deploy_name, cl.wait, {cl.allow_downtime, cl.restart, cl.deploy_commit});
  if (cl.pull->parsed()) return cmd_pull(c, cl.pull_name, cl.wait, cl.pull_commit);
  if (cl.deployment->parsed()) return cmd_deployment(c, cl.deployment_id, cl.wait);
  if (cl.stop->parsed()) return cmd_stop(c, cl.stop_name, cl.wait);
  if (cl.cancel->parsed()) return cmd_cancel(c);
  if (cl.plan->parsed()) return cmd_plan(c, cl.plan_name, cl.allow_downtime, cl.plan_commit);
  if (cl.verify->parsed()) return cmd_verify(c, cl.verify_name);
  if (cl.rm->parsed()) return cmd_rm(c, cl.rm_name, cl.rm_commit);
  if (cl.watch->parsed()) return modelctl::watch(daemon, {cl.watch_name, c.json, c.tty, c.style});
  return exit_refused;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"modelctl: the client of modeld, which deploys language models as systemd units"};
  CommandLine cl;
  define_commands(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? exit_ok : exit_refused;  // bad usage is exit 2 by the contract
  }
  return run_command(cl);
}
