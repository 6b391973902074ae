// Loading and validating the configuration. The loader walks the parsed TOML tree once per file,
// checking every key against the contract's schema, and records a Problem (with the node's
// file:line:col) for everything wrong instead of stopping, so `modeld --check-config` can list
// all mistakes in one run.

#include "config/config.hpp"

#include <sys/stat.h>

#include "engine/engine.hpp"
#include "repo/ids.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <span>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace modeld::config {

namespace fs = std::filesystem;

const ModelConfig* Config::find_model(const std::string& name) const {
  auto it = models.find(name);
  return it == models.end() ? nullptr : &it->second;
}

std::string Problem::to_string() const {
  if (line == 0) return fmt::format("{}: {}", file.string(), message);
  return fmt::format("{}:{}:{}: {}", file.string(), line, column, message);
}

Environment environment_from_process() {
  Environment env;
  // An empty variable (HF_ENDPOINT= in a unit file) means "unset", as huggingface_hub treats it.
  if (const char* v = std::getenv("HF_ENDPOINT"); v != nullptr && *v != '\0') env.hf_endpoint = v;
  return env;
}

namespace {
// The "{word}" sequences of `arg` that are not one of expand_command's placeholders; a typo such
// as "{modeldir}" would otherwise reach the server as it is and fail only at launch.
std::vector<std::string> unknown_placeholders(std::string_view arg) {
  static constexpr std::string_view known[] = {"{model_dir}", "{name}", "{served_name}", "{port}"};
  std::vector<std::string> out;
  for (std::size_t open = arg.find('{'); open != std::string_view::npos; open = arg.find('{', open + 1)) {
    auto close = arg.find('}', open);
    if (close == std::string_view::npos) break;
    auto word = arg.substr(open, close - open + 1);
    bool is_word = word.size() > 2;
    for (char c : word.substr(1, word.size() - 2))
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) is_word = false;
    if (is_word && std::find(std::begin(known), std::end(known), word) == std::end(known)) out.emplace_back(word);
  }
  return out;
}
}  // namespace

std::vector<std::string> expand_command(const ModelConfig& model, const fs::path& model_dir) {
  const std::pair<std::string_view, std::string> values[] = {
      {"{model_dir}", model_dir.string()},
      {"{name}", model.name},
      {"{served_name}", model.serve.served_name.empty() ? model.name : model.serve.served_name},
      {"{port}", std::to_string(model.serve.port)},
  };
  std::vector<std::string> out;
  out.reserve(model.serve.command.size());
  for (const std::string& arg : model.serve.command) {
    // One left-to-right pass: substituted text is never scanned again, so a model_dir that
    // happens to contain "{name}" stays as it is.
    std::string expanded;
    std::size_t i = 0;
    while (i < arg.size()) {
      bool replaced = false;
      if (arg[i] == '{') {
        for (const auto& [placeholder, value] : values) {
          if (std::string_view(arg).substr(i, placeholder.size()) == placeholder) {
            expanded += value;
            i += placeholder.size();
            replaced = true;
            break;
          }
        }
      }
      if (!replaced) expanded += arg[i++];
    }
    out.push_back(std::move(expanded));
  }
  return out;
}

namespace {

// Keys a table may hold.
using Keys = std::span<const std::string_view>;

// The schema: every key each table may hold (interface.md "Configuration").
constexpr std::string_view kTopKeys[] = {"daemon", "control", "hub", "metrics",
                                                              "models"};
constexpr std::string_view kDaemonKeys[] = {"models_dir", "state_dir", "socket",
                                                                 "unit_dir", "disk_reserve", "warm_reserve",
                                                                 "service_manager"};
constexpr std::string_view kControlKeys[] = {"group"};
constexpr std::string_view kHubKeys[] = {"endpoint", "token_file", "parallel_files",
                                                              "max_bytes_per_s", "ca_file", "read_timeout",
                                                              "max_file_size", "listing_timeout"};
constexpr std::string_view kMetricsKeys[] = {"listen", "max_connections", "per_address_connections"};
constexpr std::string_view kModelKeys[] = {
    "repo", "revision", "include", "exclude", "pinned", "serve", "health", "benchmark"};
constexpr std::string_view kServeKeys[] = {
    "command", "port", "served_name", "environment", "startup_timeout", "stop_timeout", "gpus", "gpu_ids",
    "gpu_memory", "warm", "switch", "engine", "drain_timeout"};
constexpr std::string_view kHealthKeys[] = {
    "path", "models_path", "completion", "api_key_file", "stall_timeout", "watch_interval",
    "watch_failures"};
constexpr std::string_view kBenchmarkKeys[] = {"enabled", "prompt", "max_tokens"};

// Levenshtein distance, for "did you mean" suggestions on misspelt keys.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest known key within edit distance 2, or empty.
std::string_view closest_key(std::string_view key, Keys known) {
  std::string_view best;
  std::size_t best_distance = 3;
  for (std::string_view k : known) {
    std::size_t d = edit_distance(key, k);
    if (d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  return best;
}

std::string_view type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// A key as it must be written inside a TOML table header: bare when it can be, else quoted
// (model names may hold '.', which a bare key would split into two tables).
std::string toml_key(std::string_view key) {
  bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (bare) return std::string(key);
  return fmt::format("\"{}\"", key);
}

bool valid_env_name(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// An http(s) URL with a non-empty host and no white space; deeper checks happen when the Hub
// client first connects.
bool valid_http_url(std::string_view url) {
  std::string_view rest;
  if (url.starts_with("https://"))
    rest = url.substr(8);
  else if (url.starts_with("http://"))
    rest = url.substr(7);
  else
    return false;
  if (rest.empty() || rest[0] == '/') return false;
  if (std::any_of(url.begin(), url.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; })) return false;
  // An explicit port must be a number from 1 to 65535 ("http://host:99999" is refused here,
  // not at the first download).
  auto authority = rest.substr(0, rest.find_first_of("/?#"));
  auto host_end = authority.starts_with("[") ? authority.find(']') : 0;
  if (host_end == std::string_view::npos) return false;
  auto colon = authority.find(':', host_end);
  if (colon == std::string_view::npos) return true;
  auto port = authority.substr(colon + 1);
  unsigned value = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  return ec == std::errc() && p == port.data() + port.size() && value >= 1 && value <= 65535;
}

// Trailing slashes are dropped so that the Hub client can append "/api/..." as huggingface_hub
// does with its endpoint.
std::string strip_trailing_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/' && !s.ends_with("://")) s.pop_back();
  return s;
}

// "HOST:PORT" with a port 1..65535. HOST is an IPv4 address, an IPv6 address in brackets or a
// host name (letters, digits, '-' and '.'); an IPv6 address without brackets is refused, since
// its last group could not be told from the port.
bool valid_listen_address(std::string_view listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view host = listen.substr(0, colon);
  std::string_view port = listen.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value < 1 || value > 65535) return false;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    std::string inner(host.substr(1, host.size() - 2));
    in6_addr a6{};
    return ::inet_pton(AF_INET6, inner.c_str(), &a6) == 1;
  }
  if (host.size() > 253 || host.front() == '-' || host.front() == '.') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  });
}

// The highest NVML index serve.gpu_ids may name: 64 GPUs per host, well beyond any host built today.
constexpr std::int64_t kMaxGpuIndex = 63;

// Where a model's port is decided, kept for the check across models (check_shared_ports).
struct PortSite {
  std::string model;
  fs::path file;
  int line = 0;    // of the port key, or of the serve table when the port is the default
  int column = 0;
  bool written = false;  // serve.port is written (else the default)
  std::uint16_t port = 0;
  GpuSet gpus;
};

// Checks one file's tree and fills a Config, recording every problem with its position and, for
// each model added whose port and GPU set are valid, where its port is (`sites`).
class Checker {
 public:
  Checker(fs::path file, std::vector<Problem>& problems, std::vector<Problem>& warnings, std::vector<PortSite>& sites)
      : file_(std::move(file)), problems_(problems), warnings_(warnings), sites_(sites) {}

  void problem(const toml::source_region& where, std::string message) {
    problems_.push_back(at(where, std::move(message)));
  }

  void warning(const toml::source_region& where, std::string message) {
    warnings_.push_back(at(where, std::move(message)));
  }

  // `message` at `where` in this file.
  Problem at(const toml::source_region& where, std::string message) const {
    return Problem{file_, static_cast<int>(where.begin.line), static_cast<int>(where.begin.column),
                   std::move(message)};
  }

  // Reports every key of `table` that the schema does not know; `where` names the table in
  // messages ("[hub]"). `hint` may add advice for a key that has no close match.
  void check_keys(const toml::table& table, std::string_view where,
                  Keys known,
                  const std::function<std::string(const toml::key&, const toml::node&)>& hint = {}) {
    for (auto&& [key, node] : table) {
      std::string_view k = key.str();
      if (std::find(known.begin(), known.end(), k) != known.end()) continue;
      std::string message = fmt::format("unknown key '{}' in {}", k, where);
      if (auto suggestion = closest_key(k, known); !suggestion.empty())
        message += fmt::format("; did you mean '{}'?", suggestion);
      else if (hint)
        message += hint(key, node);
      problem(key.source(), std::move(message));
    }
  }

  // The sub-table at `key`, or nullptr when absent or (with a problem) not a table.
  const toml::table* table(const toml::table& parent, std::string_view key, const std::string& name) {
    const toml::node* node = parent.get(key);
    if (node == nullptr) return nullptr;
    if (const toml::table* t = node->as_table()) return t;
    type_problem(*node, "a table", name);
    return nullptr;
  }

  void type_problem(const toml::node& node, std::string_view expected, const std::string& name) {
    problem(node.source(), fmt::format("expected {} for {}, got {}", expected, name, type_name(node.type())));
  }

  // Each reader leaves `out` untouched when the key is absent or its value is wrong, and returns
  // whether a valid value was stored.
  bool read(const toml::table& t, std::string_view key, const std::string& name, std::string& out) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    if (const auto* s = node->as_string()) {
      out = s->get();
      return true;
    }
    type_problem(*node, "a string", name);
    return false;
  }

  bool read(const toml::table& t, std::string_view key, const std::string& name, bool& out) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    if (const auto* b = node->as_boolean()) {
      out = b->get();
      return true;
    }
    type_problem(*node, "a boolean (true or false)", name);
    return false;
  }

  // An integer within [min, max].
  template <class Int>
  bool read_int(const toml::table& t, std::string_view key, const std::string& name, Int& out,
                std::int64_t min, std::int64_t max) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    const auto* i = node->as_integer();
    if (i == nullptr) {
      type_problem(*node, "an integer", name);
      return false;
    }
    if (i->get() < min || i->get() > max) {
      problem(node->source(), fmt::format("{} must be between {} and {}, got {}", name, min, max, i->get()));
      return false;
    }
    out = static_cast<Int>(i->get());
    return true;
  }

  // A path; `absolute` requires an absolute one, `allow_empty` accepts "" as "not set".
  bool read_path(const toml::table& t, std::string_view key, const std::string& name, fs::path& out,
                 bool allow_empty) {
    std::string s;
    if (!read(t, key, name, s)) return false;
    const toml::node& node = *t.get(key);
    if (s.empty()) {
      if (allow_empty) {
        out.clear();
        return true;
      }
      problem(node.source(), fmt::format("{} must not be empty", name));
      return false;
    }
    // Relative paths would depend on the daemon's working directory, which systemd sets to "/"
    // but a manual run does not: refuse them rather than guess.
    if (!fs::path(s).is_absolute()) {
      problem(node.source(), fmt::format("{} must be an absolute path, got \"{}\"", name, s));
      return false;
    }
    out = s;
    return true;
  }

  // A path to a file modeld reads at start or launch (token, CA bundle, API key): a missing one
  // is a problem now rather than a daemon that refuses to start or a launch that fails later.
  void read_existing_file(const toml::table& t, std::string_view key, const std::string& name, fs::path& out) {
    if (!read_path(t, key, name, out, true) || out.empty()) return;
    std::error_code ec;
    auto st = fs::status(out, ec);
    if (ec || !fs::exists(st))
      problem(t.get(key)->source(), fmt::format("{} names {}, which does not exist", name, out.string()));
    else if (!fs::is_regular_file(st))
      problem(t.get(key)->source(), fmt::format("{} names {}, which is not a regular file", name, out.string()));
  }

  // A size: a string such as "20GiB" or an integer count of bytes.
  bool read_size(const toml::table& t, std::string_view key, const std::string& name, std::uint64_t& out) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    if (const auto* i = node->as_integer()) {
      if (i->get() < 0) {
        problem(node->source(), fmt::format("{} must not be negative, got {}", name, i->get()));
        return false;
      }
      out = static_cast<std::uint64_t>(i->get());
      return true;
    }
    if (const auto* s = node->as_string()) {
      if (auto size = util::parse_size(s->get())) {
        out = *size;
        return true;
      }
      problem(node->source(),
              fmt::format("bad size \"{}\" for {}; write e.g. \"20GiB\", \"500MB\" or a byte count", s->get(), name));
      return false;
    }
    type_problem(*node, "a size (\"20GiB\" or a byte count)", name);
    return false;
  }

  // A duration string such as "90s", "60m", "2h"; zero is refused because a duration here is a
  // timeout or a period, unless `zero_allowed`: "0s" then means off (serve.drain_timeout).
  bool read_duration(const toml::table& t, std::string_view key, const std::string& name, milliseconds& out,
                     bool zero_allowed = false) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    const auto* s = node->as_string();
    if (s == nullptr) {
      type_problem(*node, "a duration string (\"90s\", \"60m\", \"2h\")", name);
      return false;
    }
    auto d = util::parse_duration(s->get());
    if (!d) {
      problem(node->source(),
              fmt::format("bad duration \"{}\" for {}; write e.g. \"90s\", \"60m\" or \"2h\" (at most 100 years)", s->get(), name));
      return false;
    }
    if (d->count() == 0 && !zero_allowed) {
      problem(node->source(), fmt::format("{} must be longer than zero", name));
      return false;
    }
    out = *d;
    return true;
  }

  // An array of strings; `non_empty_items` refuses "" elements.
  bool read_strings(const toml::table& t, std::string_view key, const std::string& name,
                    std::vector<std::string>& out, bool non_empty_items) {
    const toml::node* node = t.get(key);
    if (node == nullptr) return false;
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      type_problem(*node, "an array of strings", name);
      return false;
    }
    std::vector<std::string> values;
    bool ok = true;
    for (std::size_t i = 0; i < array->size(); ++i) {
      const toml::node& item = *array->get(i);
      std::string item_name = fmt::format("{}[{}]", name, i);
      if (const auto* s = item.as_string()) {
        if (non_empty_items && s->get().empty()) {
          problem(item.source(), fmt::format("{} must not be empty", item_name));
          ok = false;
        }
        values.push_back(s->get());
      } else {
        type_problem(item, "a string", item_name);
        ok = false;
      }
    }
    if (ok) out = std::move(values);
    return ok;
  }

  void check_daemon(const toml::table& t, DaemonConfig& out) {
    check_keys(t, "[daemon]", kDaemonKeys);
    read_path(t, "models_dir", "daemon.models_dir", out.models_dir, false);
    read_path(t, "state_dir", "daemon.state_dir", out.state_dir, false);
    read_path(t, "socket", "daemon.socket", out.socket, false);
    read_path(t, "unit_dir", "daemon.unit_dir", out.unit_dir, false);
    read_size(t, "disk_reserve", "daemon.disk_reserve", out.disk_reserve);
    if (std::uint64_t reserve = 0; read_size(t, "warm_reserve", "daemon.warm_reserve", reserve))
      out.warm_reserve = reserve;
    if (read(t, "service_manager", "daemon.service_manager", out.service_manager) &&
        out.service_manager != "systemd" && out.service_manager != "process")
      problem(t.get("service_manager")->source(),
              fmt::format("daemon.service_manager must be \"systemd\" or \"process\", got \"{}\"",
                          out.service_manager));
  }

  void check_control(const toml::table& t, ControlConfig& out) {
    check_keys(t, "[control]", kControlKeys);
    if (read(t, "group", "control.group", out.group) && out.group.empty())
      problem(t.get("group")->source(), "control.group must not be empty");
  }

  // Returns whether [hub] set `endpoint` (else the environment may).
  bool check_hub(const toml::table& t, HubConfig& out) {
    check_keys(t, "[hub]", kHubKeys);
    bool endpoint_set = false;
    std::string endpoint;
    if (read(t, "endpoint", "hub.endpoint", endpoint)) {
      endpoint_set = true;
      if (valid_http_url(endpoint))
        out.endpoint = strip_trailing_slashes(endpoint);
      else
        problem(t.get("endpoint")->source(),
                fmt::format("hub.endpoint must be an http:// or https:// URL, got \"{}\"", endpoint));
    } else if (t.contains("endpoint")) {
      endpoint_set = true;  // present but wrong: already a problem; the environment must not mask it
    }
    read_existing_file(t, "token_file", "hub.token_file", out.token_file);
    if (!out.token_file.empty())
      if (auto why = shared_secret_file(out.token_file, "hub.token_file")) problem(t.get("token_file")->source(), *why);
    read_int(t, "parallel_files", "hub.parallel_files", out.parallel_files, 1, 64);
    read_size(t, "max_bytes_per_s", "hub.max_bytes_per_s", out.max_bytes_per_s);
    read_existing_file(t, "ca_file", "hub.ca_file", out.ca_file);
    if (read_duration(t, "read_timeout", "hub.read_timeout", out.read_timeout) && out.read_timeout.count() < 100)
      problem(t.get("read_timeout")->source(), "hub.read_timeout must be at least 100ms");
    if (read_size(t, "max_file_size", "hub.max_file_size", out.max_file_size) &&
        (out.max_file_size < (1ull << 20) || out.max_file_size > (1ull << 50)))
      problem(t.get("max_file_size")->source(),
              fmt::format("hub.max_file_size must be between 1MiB and 1024TiB, got {} bytes", out.max_file_size));
    if (read_duration(t, "listing_timeout", "hub.listing_timeout", out.listing_timeout) &&
        out.listing_timeout < std::chrono::seconds(1))
      problem(t.get("listing_timeout")->source(), "hub.listing_timeout must be at least 1s");
    return endpoint_set;
  }

  void check_metrics(const toml::table& t, MetricsConfig& out) {
    check_keys(t, "[metrics]", kMetricsKeys);
    std::string listen;
    if (read(t, "listen", "metrics.listen", listen)) {
      if (listen.empty() || valid_listen_address(listen))
        out.listen = listen;
      else
        problem(t.get("listen")->source(),
                fmt::format("metrics.listen must be \"HOST:PORT\" with a port 1..65535 and an IPv6 host in brackets "
                            "(e.g. \"127.0.0.1:9464\", \"[::1]:9464\") or empty, got \"{}\"",
                            listen));
    }
    read_int(t, "max_connections", "metrics.max_connections", out.max_connections, 1, 4096);
    if (read_int(t, "per_address_connections", "metrics.per_address_connections", out.per_address_connections, 1,
                 4096) &&
        out.per_address_connections > out.max_connections)
      problem(t.get("per_address_connections")->source(),
              fmt::format("metrics.per_address_connections ({}) must not exceed metrics.max_connections ({})",
                          out.per_address_connections, out.max_connections));
  }

  // serve.gpu_ids: an array of distinct NVML indices 0..63, kept in the order written (it becomes
  // CUDA device 0, 1, ...). Returns false only when the key is present and wrong.
  bool read_gpu_ids(const toml::table& t, const std::string& name, GpuSet& out) {
    const toml::node* node = t.get("gpu_ids");
    if (node == nullptr) return true;
    const toml::array* array = node->as_array();
    if (array == nullptr) {
      type_problem(*node, "an array of GPU indices (integers 0..63)", name);
      return false;
    }
    std::vector<unsigned> ids;
    std::array<std::size_t, kMaxGpuIndex + 1> first_at{};  // 1 + the array index naming each GPU
    bool ok = true;
    for (std::size_t i = 0; i < array->size(); ++i) {
      const toml::node& item = *array->get(i);
      std::string item_name = fmt::format("{}[{}]", name, i);
      const auto* v = item.as_integer();
      if (v == nullptr) {
        type_problem(item, "an integer (an NVML GPU index)", item_name);
        ok = false;
      } else if (v->get() < 0 || v->get() > kMaxGpuIndex) {
        problem(item.source(), fmt::format("{} must be an NVML GPU index between 0 and {}, got {}", item_name,
                                           kMaxGpuIndex, v->get()));
        ok = false;
      } else if (auto id = static_cast<unsigned>(v->get()); first_at[id] != 0) {
        problem(item.source(), fmt::format("{} = {} repeats {}[{}]: name each GPU once", item_name, id, name,
                                           first_at[id] - 1));
        ok = false;
      } else {
        first_at[id] = i + 1;
        ids.push_back(id);
      }
    }
    if (ok) out = std::move(ids);
    return ok;
  }

  // With gpu_ids: serve.gpus is derived from its size when not written and must equal it when
  // written, and serve.environment must not set CUDA_VISIBLE_DEVICES (modeld writes it from
  // gpu_ids). `gpus_valid`: serve.gpus is absent or was read without a problem.
  void check_gpu_set(const toml::table& t, const std::string& prefix, bool gpus_valid, ServeConfig& out) {
    if (!out.gpu_ids) return;
    const std::size_t n = out.gpu_ids->size();
    if (!t.contains("gpus"))
      out.gpus = static_cast<unsigned>(n);
    else if (gpus_valid && out.gpus != n)
      problem(t.get("gpus")->source(),
              fmt::format("{0}.gpus = {1} but {0}.gpu_ids names {2} GPU{3}; leave gpus out, it is derived from "
                          "gpu_ids",
                          prefix, out.gpus, n, n == 1 ? "" : "s"));
    const toml::table* env = t.get_as<toml::table>("environment");
    if (env == nullptr) return;
    if (auto it = env->find("CUDA_VISIBLE_DEVICES"); it != env->end())
      problem(it->first.source(),
              fmt::format("{0}.environment sets CUDA_VISIBLE_DEVICES although {0}.gpu_ids is set: modeld writes "
                          "CUDA_VISIBLE_DEVICES from gpu_ids (by GPU UUID, since CUDA's own order is not NVML's); "
                          "remove it from environment",
                          prefix));
  }

  // Returns where the port is decided (the port key, else the table: the default), or nullopt
  // when serve.port or serve.gpu_ids is wrong (then the check across models leaves it out).
  std::optional<toml::source_region> check_serve(const toml::table& t, const std::string& prefix,
                                                 const std::string& header, ServeConfig& out) {
    check_keys(t, header, kServeKeys);
    if (!t.contains("command"))
      problem(t.source(), fmt::format("missing required key 'command' in {}", header));
    else if (read_strings(t, "command", prefix + ".command", out.command, false)) {
      if (out.command.empty())
        problem(t.get("command")->source(), fmt::format("{}.command must not be empty", prefix));
      else if (out.command.front().empty())
        problem(t.get("command")->source(), fmt::format("{}.command[0], the program, must not be empty", prefix));
      for (const auto& arg : out.command)
        for (const auto& ph : unknown_placeholders(arg))
          problem(t.get("command")->source(),
                  fmt::format("{}.command: unknown placeholder {} in \"{}\" (known: {{model_dir}}, {{name}}, "
                              "{{served_name}}, {{port}})",
                              prefix, ph, arg));
    }
    const bool port_valid = read_int(t, "port", prefix + ".port", out.port, 1, 65535) || !t.contains("port");
    if (read(t, "served_name", prefix + ".served_name", out.served_name) && out.served_name.empty())
      problem(t.get("served_name")->source(), fmt::format("{}.served_name must not be empty", prefix));
    if (const toml::table* env = table(t, "environment", prefix + ".environment")) {
      for (auto&& [key, node] : *env) {
        std::string name = fmt::format("{}.environment.{}", prefix, key.str());
        if (!valid_env_name(key.str()))
          problem(key.source(), fmt::format("invalid environment variable name '{}' in {}.environment", key.str(),
                                            prefix));
        if (const auto* s = node.as_string())
          out.environment[std::string(key.str())] = s->get();
        else
          type_problem(node, "a string", name);
      }
    }
    read_duration(t, "startup_timeout", prefix + ".startup_timeout", out.startup_timeout);
    read_duration(t, "stop_timeout", prefix + ".stop_timeout", out.stop_timeout);
    const bool gpus_valid = read_int(t, "gpus", prefix + ".gpus", out.gpus, 0, 1024) || !t.contains("gpus");
    const bool gpu_ids_valid = read_gpu_ids(t, prefix + ".gpu_ids", out.gpu_ids);
    check_gpu_set(t, prefix, gpus_valid, out);
    read_size(t, "gpu_memory", prefix + ".gpu_memory", out.gpu_memory);
    if (read(t, "warm", prefix + ".warm", out.warm) && out.warm != "auto" && out.warm != "off")
      problem(t.get("warm")->source(), fmt::format("{}.warm must be \"auto\" or \"off\", got \"{}\"", prefix, out.warm));
    if (read(t, "switch", prefix + ".switch", out.switch_setting) && out.switch_setting != "restart")
      problem(t.get("switch")->source(),
              fmt::format("{}.switch must be \"restart\", got \"{}\"", prefix, out.switch_setting));
    check_engine(t, prefix, out);
    if (!port_valid || !gpu_ids_valid) return std::nullopt;
    return t.contains("port") ? t.get("port")->source() : t.source();
  }

  // serve.engine (a name lib/engine knows, at its line otherwise) and serve.drain_timeout; warns
  // where the engine and the command disagree, and where vLLM's --shutdown-timeout in the command
  // is not drain_timeout.
  void check_engine(const toml::table& t, const std::string& prefix, ServeConfig& out) {
    const engine::Adapter* adapter = &engine::generic();
    if (read(t, "engine", prefix + ".engine", out.engine)) {
      adapter = engine::find(out.engine);
      if (adapter == nullptr)
        problem(t.get("engine")->source(), fmt::format("{}.engine must be \"generic\", \"vllm\" or \"sglang\", got \"{}\"",
                                                       prefix, out.engine));
    }
    read_duration(t, "drain_timeout", prefix + ".drain_timeout", out.drain_timeout, true);
    if (adapter == nullptr || out.command.empty()) return;
    const toml::source_region where = t.contains("engine") ? t.get("engine")->source() : t.get("command")->source();
    if (auto why = engine::disagreement(*adapter, out.command, prefix)) warning(where, *why);
    if (adapter->drain_flag.empty() || out.drain_timeout.count() == 0) return;
    const auto written = engine::flag_value(out.command, adapter->drain_flag);
    const auto drain_s = std::chrono::ceil<std::chrono::seconds>(out.drain_timeout).count();
    if (written && *written != std::to_string(drain_s))
      warning(t.get("command")->source(),
              fmt::format("{0}.command sets {1} {2} but {0}.drain_timeout is {3} s: the server gives up draining "
                          "at the one and modeld kills it at the other; write one of them only",
                          prefix, adapter->drain_flag, *written, drain_s));
  }

  void check_health(const toml::table& t, const std::string& prefix, const std::string& header, HealthConfig& out) {
    check_keys(t, header, kHealthKeys);
    for (auto [key, field] : {std::pair{"path", &out.path}, std::pair{"models_path", &out.models_path}}) {
      std::string value;
      if (!read(t, key, prefix + "." + key, value)) continue;
      if (value.starts_with('/'))
        *field = value;
      else
        problem(t.get(key)->source(),
                fmt::format("{}.{} must be an HTTP path starting with '/', got \"{}\"", prefix, key, value));
    }
    read(t, "completion", prefix + ".completion", out.completion);
    read_existing_file(t, "api_key_file", prefix + ".api_key_file", out.api_key_file);
    read_duration(t, "stall_timeout", prefix + ".stall_timeout", out.stall_timeout);
    read_duration(t, "watch_interval", prefix + ".watch_interval", out.watch_interval);
    read_int(t, "watch_failures", prefix + ".watch_failures", out.watch_failures, 1, 1000);
  }

  void check_benchmark(const toml::table& t, const std::string& prefix, const std::string& header,
                       BenchmarkConfig& out) {
    check_keys(t, header, kBenchmarkKeys);
    read(t, "enabled", prefix + ".enabled", out.enabled);
    if (read(t, "prompt", prefix + ".prompt", out.prompt) && out.prompt.empty())
      problem(t.get("prompt")->source(), fmt::format("{}.prompt must not be empty", prefix));
    read_int(t, "max_tokens", prefix + ".max_tokens", out.max_tokens, 1, 1'000'000);
  }

  // Checks one [models.NAME] table; returns the model (problems, if any, are recorded) and sets
  // `port_at` to where its port is decided (nullopt: no valid serve table, port or gpu_ids).
  ModelConfig check_model(const std::string& name, const toml::table& t, std::optional<toml::source_region>& port_at) {
    ModelConfig m;
    m.name = name;
    m.source_file = file_;
    const std::string prefix = "models." + name;
    const std::string header = "[models." + toml_key(name) + "]";
    // [models.kimi-k2.5] is the table "5" inside a model "kimi-k2": say how to write the name,
    // and do not also complain that "kimi-k2" lacks its required keys.
    bool split_name = false;
    check_keys(t, header, kModelKeys, [&](const toml::key& key, const toml::node& node) -> std::string {
      std::string joined = name + "." + std::string(key.str());
      if (!node.is_table() || !repo::valid_model_name(joined)) return {};
      split_name = true;
      return fmt::format("; a model name containing '.' must be quoted: [models.\"{}\"]", joined);
    });
    if (!t.contains("repo")) {
      if (!split_name)
        problem(t.source(), fmt::format("missing required key 'repo' in {}", header));
    } else if (read(t, "repo", prefix + ".repo", m.repo) && !repo::valid_repo_id(m.repo)) {
      problem(t.get("repo")->source(),
              fmt::format("{}.repo must look like \"org/name\" (e.g. \"moonshotai/Kimi-K2.5\"), got \"{}\"", prefix,
                          m.repo));
    }
    if (read(t, "revision", prefix + ".revision", m.revision) && m.revision.empty())
      problem(t.get("revision")->source(), fmt::format("{}.revision must not be empty", prefix));
    read_strings(t, "include", prefix + ".include", m.include, true);
    read_strings(t, "exclude", prefix + ".exclude", m.exclude, true);
    read(t, "pinned", prefix + ".pinned", m.pinned);

    if (const toml::table* serve = table(t, "serve", prefix + ".serve"))
      port_at = check_serve(*serve, prefix + ".serve", "[models." + toml_key(name) + ".serve]", m.serve);
    else if (!t.contains("serve") && !split_name)
      problem(t.source(), fmt::format("missing required table [models.{}.serve] (with its command)", toml_key(name)));
    if (m.serve.served_name.empty()) m.serve.served_name = name;

    if (const toml::table* health = table(t, "health", prefix + ".health"))
      check_health(*health, prefix + ".health", "[models." + toml_key(name) + ".health]", m.health);
    if (const toml::table* bench = table(t, "benchmark", prefix + ".benchmark"))
      check_benchmark(*bench, prefix + ".benchmark", "[models." + toml_key(name) + ".benchmark]", m.benchmark);
    return m;
  }

  // Checks the [models] table and adds its models to `config`; a name already there (from an
  // earlier file) is a problem naming both files.
  void check_models(const toml::table& models, Config& config) {
    for (auto&& [key, node] : models) {
      std::string name(key.str());
      if (!repo::valid_model_name(name)) {
        problem(key.source(),
                fmt::format("invalid model name '{}' in [models]: names are [a-z0-9][a-z0-9._-]{{0,63}} "
                            "(they become unit and folder names)",
                            name));
        continue;
      }
      const toml::table* t = node.as_table();
      if (t == nullptr) {
        type_problem(node, "a table", "models." + name);
        continue;
      }
      std::optional<toml::source_region> port_at;
      ModelConfig model = check_model(name, *t, port_at);
      if (const ModelConfig* earlier = config.find_model(name)) {
        problem(key.source(), fmt::format("model '{}' is defined twice: in {} and in {}", name,
                                          earlier->source_file.string(), file_.string()));
        continue;
      }
      if (port_at) {
        const bool written = t->get_as<toml::table>("serve")->contains("port");
        sites_.push_back(PortSite{name, file_, static_cast<int>(port_at->begin.line),
                                  static_cast<int>(port_at->begin.column), written, model.serve.port,
                                  model.serve.gpu_ids});
      }
      config.models.emplace(name, std::move(model));
    }
  }

  // The main file: every section. Returns whether [hub] set the endpoint.
  bool check_main(const toml::table& root, Config& config) {
    check_keys(root, "the top-level table", kTopKeys);
    if (const toml::table* t = table(root, "daemon", "daemon")) check_daemon(*t, config.daemon);
    if (const toml::table* t = table(root, "control", "control")) check_control(*t, config.control);
    bool endpoint_set = false;
    if (const toml::table* t = table(root, "hub", "hub")) endpoint_set = check_hub(*t, config.hub);
    if (const toml::table* t = table(root, "metrics", "metrics")) check_metrics(*t, config.metrics);
    if (const toml::table* t = table(root, "models", "models")) check_models(*t, config);
    return endpoint_set;
  }

  // A models.d file: [models.*] tables only.
  void check_model_file(const toml::table& root, Config& config) {
    for (auto&& [key, node] : root) {
      if (key.str() == "models") continue;
      problem(key.source(), fmt::format("'{}' is not allowed in a models.d file: it may hold [models.*] tables only "
                                        "(put it in the main configuration file)",
                                        key.str()));
    }
    if (const toml::table* t = table(root, "models", "models")) check_models(*t, config);
  }

 private:
  fs::path file_;
  std::vector<Problem>& problems_;
  std::vector<Problem>& warnings_;
  std::vector<PortSite>& sites_;
};

// Parses `file`; on failure records the parse error at its position and returns nullopt.
std::optional<toml::table> parse(const fs::path& file, std::vector<Problem>& problems) {
  try {
    return toml::parse_file(file.string());
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    std::string message(e.description());
    if (begin.line == 0) message = "cannot read: " + message;
    problems.push_back(Problem{file, static_cast<int>(begin.line), static_cast<int>(begin.column), message});
    return std::nullopt;
  }
}

// A GPU set as messages name it.
std::string gpu_set_text(const GpuSet& gpus) {
  if (!gpus) return "every GPU (no gpu_ids)";
  if (gpus->empty()) return "no GPU (gpu_ids = [])";
  return fmt::format("gpu_ids [{}]", fmt::join(*gpus, ", "));
}

// The models of one file (sites[from..]) against every model read before them (earlier files,
// and earlier in this file by position): two models with equal ports whose GPU sets do not
// overlap may serve together and cannot both listen, a problem at the later one's port naming the
// other. Models whose GPU sets overlap never serve together and may share a port.
void check_shared_ports(std::vector<PortSite>& sites, std::size_t from, std::vector<Problem>& problems) {
  auto by_position = [](const PortSite& a, const PortSite& b) {
    return std::pair(a.line, a.column) < std::pair(b.line, b.column);
  };
  std::sort(sites.begin() + static_cast<std::ptrdiff_t>(from), sites.end(), by_position);
  for (std::size_t j = from; j < sites.size(); ++j) {
    const PortSite& later = sites[j];
    for (std::size_t i = 0; i < j; ++i) {
      const PortSite& earlier = sites[i];
      if (earlier.port != later.port || gpu_sets_overlap(earlier.gpus, later.gpus)) continue;
      std::string key = later.written ? fmt::format("models.{}.serve.port = {}", later.model, later.port)
                                      : fmt::format("models.{}.serve.port (default {})", later.model, later.port);
      problems.push_back(Problem{
          later.file, later.line, later.column,
          fmt::format("{} is also the port of model '{}' ({}:{}), and their GPU sets do not overlap ({} here, "
                      "{} there): they may serve together but cannot both listen on port {}; give one of them "
                      "another port",
                      key, earlier.model, earlier.file.string(), earlier.line, gpu_set_text(later.gpus),
                      gpu_set_text(earlier.gpus), later.port)});
    }
  }
}

// Problems of one file in the order they appear in it (toml++ tables iterate in key order).
void sort_by_position(std::vector<Problem>& problems, std::size_t from) {
  std::stable_sort(problems.begin() + static_cast<std::ptrdiff_t>(from), problems.end(),
                   [](const Problem& a, const Problem& b) {
                     return std::pair(a.line, a.column) < std::pair(b.line, b.column);
                   });
}

}  // namespace

LoadResult load(const fs::path& file, const Environment& env) {
  LoadResult result;
  std::vector<Problem>& problems = result.problems;
  Config config;
  config.file = file;

  std::error_code ec;
  if (!fs::exists(file, ec)) {
    problems.push_back(Problem{file, 0, 0, "cannot read: no such file"});
    return result;
  }

  bool endpoint_set = false;
  std::vector<PortSite> sites;  // every model's port, in the order files and models are read
  if (auto root = parse(file, problems)) {
    endpoint_set = Checker(file, problems, result.warnings, sites).check_main(*root, config);
    check_shared_ports(sites, 0, problems);
    sort_by_position(problems, 0);
  }

  // models.d next to the main file; its absence is normal (everything in one file).
  fs::path dir = file.parent_path() / "models.d";
  if (fs::is_directory(dir, ec)) {
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".toml" && it->is_regular_file(ec)) files.push_back(it->path());
    }
    if (ec) problems.push_back(Problem{dir, 0, 0, fmt::format("cannot list the folder: {}", ec.message())});
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::size_t first = problems.size();
      std::size_t first_site = sites.size();
      if (auto root = parse(f, problems)) {
        Checker(f, problems, result.warnings, sites).check_model_file(*root, config);
        check_shared_ports(sites, first_site, problems);
      }
      sort_by_position(problems, first);
    }
  }

  // Explicit config wins over the environment, which wins over the built-in default.
  if (!endpoint_set && env.hf_endpoint) {
    if (valid_http_url(*env.hf_endpoint))
      config.hub.endpoint = strip_trailing_slashes(*env.hf_endpoint);
    else
      problems.push_back(Problem{file, 0, 0,
                                 fmt::format("$HF_ENDPOINT must be an http:// or https:// URL, got \"{}\" "
                                             "(set hub.endpoint to override it)",
                                             *env.hf_endpoint)});
  }

  if (problems.empty()) result.config = std::move(config);
  return result;
}

std::chrono::milliseconds stop_budget(const ServeConfig& serve) { return serve.drain_timeout + serve.stop_timeout; }

std::vector<FixedChange> keep_fixed_settings(const Config& running, Config& reloaded) {
  std::vector<FixedChange> out;
  auto keep = [&out](std::string_view key, auto& requested, const auto& in_use) {
    if (requested == in_use) return;
    auto text = [](const auto& v) -> std::string {
      using V = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<V, fs::path>) return "\"" + v.string() + "\"";
      else if constexpr (std::is_same_v<V, std::string>) return "\"" + v + "\"";
      else if constexpr (std::is_integral_v<V>) return std::to_string(v);
      else return util::format_milliseconds(v);
    };
    out.push_back(FixedChange{std::string(key), text(in_use), text(requested)});
    requested = in_use;
  };
  keep("daemon.models_dir", reloaded.daemon.models_dir, running.daemon.models_dir);
  keep("daemon.state_dir", reloaded.daemon.state_dir, running.daemon.state_dir);
  keep("daemon.socket", reloaded.daemon.socket, running.daemon.socket);
  keep("daemon.unit_dir", reloaded.daemon.unit_dir, running.daemon.unit_dir);
  keep("daemon.service_manager", reloaded.daemon.service_manager, running.daemon.service_manager);
  keep("control.group", reloaded.control.group, running.control.group);
  keep("hub.endpoint", reloaded.hub.endpoint, running.hub.endpoint);
  keep("hub.token_file", reloaded.hub.token_file, running.hub.token_file);
  keep("hub.ca_file", reloaded.hub.ca_file, running.hub.ca_file);
  keep("hub.read_timeout", reloaded.hub.read_timeout, running.hub.read_timeout);
  keep("hub.listing_timeout", reloaded.hub.listing_timeout, running.hub.listing_timeout);
  keep("metrics.listen", reloaded.metrics.listen, running.metrics.listen);
  keep("metrics.max_connections", reloaded.metrics.max_connections, running.metrics.max_connections);
  keep("metrics.per_address_connections", reloaded.metrics.per_address_connections,
       running.metrics.per_address_connections);
  return out;
}

std::optional<std::string> shared_secret_file(const std::filesystem::path& path, std::string_view name) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const unsigned mode = st.st_mode & 07777;
  if ((mode & 0066) == 0) return std::nullopt;
  return fmt::format("{} {} has mode {:04o}: group or others may read or write the Hub token; make it "
                     "private to its owner (chmod 600 {})",
                     name, path.string(), mode, path.string());
}

bool gpu_sets_overlap(const GpuSet& a, const GpuSet& b) {
  if (!a) return !b || !b->empty();
  if (!b) return !a->empty();
  return std::any_of(a->begin(), a->end(),
                     [&](unsigned g) { return std::find(b->begin(), b->end(), g) != b->end(); });
}

}  // namespace modeld::config
