#pragma once
// The typed configuration: /etc/modeld/modeld.toml plus every *.toml in models.d/ beside it.
// Keys, defaults and meanings are fixed by ../shared/spec/interface.md ("Configuration").

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace modeld::config {

using std::chrono::milliseconds;

/// [daemon]: where modeld keeps models, state, its socket and the drop-ins it writes.
struct DaemonConfig {
  std::filesystem::path models_dir = "/var/lib/modeld/models";
  std::filesystem::path state_dir = "/var/lib/modeld/state";
  std::filesystem::path socket = "/run/modeld/modeld.sock";
  std::filesystem::path unit_dir = "/run/systemd/system";
  std::uint64_t disk_reserve = 20ull << 30;  ///< bytes never to fill on the models_dir file system
  /// Bytes of MemAvailable that warming leaves alone; nullopt (unset): max(8 GiB, 10% of
  /// MemTotal), computed when warming runs (interface.md "Warming").
  std::optional<std::uint64_t> warm_reserve;
  /// How model servers run: "systemd" (units over D-Bus) or "process" (children of modeld in
  /// their own process groups, for hosts without systemd as PID 1).
  std::string service_manager = "systemd";

  friend bool operator==(const DaemonConfig&, const DaemonConfig&) = default;
};

/// [control]: who may call mutating routes besides root.
struct ControlConfig {
  std::string group = "modeld";

  friend bool operator==(const ControlConfig&, const ControlConfig&) = default;
};

/// [hub]: the Hub endpoint, credentials and download settings.
struct HubConfig {
  std::string endpoint = "https://huggingface.co";  ///< config, else $HF_ENDPOINT, else default; an http(s) URL without trailing '/'
  std::filesystem::path token_file;                  ///< absolute; empty: credential "hf-token", else $HF_TOKEN
  unsigned parallel_files = 8;                        ///< files downloaded at once, 1..64
  std::uint64_t max_bytes_per_s = 0;                  ///< 0 = unlimited
  std::filesystem::path ca_file;                      ///< absolute; extra PEM bundle trusted besides the system store; empty: none
  /// Longest wait for the next bytes of an answer (and for connect plus TLS handshake) before the
  /// request is abandoned and retried; a stalled CDN connection costs at most this much.
  milliseconds read_timeout = std::chrono::seconds(30);
  /// Largest file a listing may name, in bytes (1 MiB..1 PiB; default 1 TiB, 20 times the
  /// Hub's 50 GB limit per file): a larger one is a lie of the Hub (or of a man in the middle)
  /// and planning refuses the revision as hub_bad_response.
  std::uint64_t max_file_size = 1ull << 40;
  /// Deadline of one whole listing or metadata request (a safetensors index), from connecting to
  /// the last byte, at least 1 s; past it the request counts as a timeout and is retried.
  milliseconds listing_timeout = std::chrono::seconds(60);

  friend bool operator==(const HubConfig&, const HubConfig&) = default;
};

/// [metrics]
struct MetricsConfig {
  /// "HOST:PORT" to also serve /metrics over TCP; empty = socket only. HOST is an IPv4
  /// address, an IPv6 address in brackets ("[::1]:9464") or a host name; PORT 1..65535.
  std::string listen;
  /// Connections the TCP listener holds at once, every client together, 1..4096.
  unsigned max_connections = 16;
  /// Connections the TCP listener holds at once from one peer IP address, 1..max_connections.
  unsigned per_address_connections = 4;

  friend bool operator==(const MetricsConfig&, const MetricsConfig&) = default;
};

/// [models.NAME.serve]: how to run the inference server.
struct ServeConfig {
  std::vector<std::string> command;               ///< argv with {model_dir} {name} {served_name} {port}
  std::uint16_t port = 8000;                       ///< 1..65535
  std::string served_name;                         ///< default (filled in by load()): the model's NAME
  std::map<std::string, std::string> environment;  ///< written into the drop-in: no secrets
  milliseconds startup_timeout = std::chrono::minutes(60);
  milliseconds stop_timeout = std::chrono::minutes(5);
  /// GPUs the server takes: without gpu_ids the first N that NVML lists (0: no GPU check); with
  /// gpu_ids its size (load() derives it when serve.gpus is not written and refuses a different one).
  unsigned gpus = 0;
  /// serve.gpu_ids: the GPUs (NVML indices 0..63, each at most once, in the order written: CUDA
  /// device 0, 1, ...) the server may use, written into its drop-in as CUDA_VISIBLE_DEVICES by
  /// UUID; nullopt (unset): every GPU, as before; empty: no GPU. A whole GPU each (no MIG instances).
  std::optional<std::vector<unsigned>> gpu_ids;
  std::uint64_t gpu_memory = 0;    ///< bytes that must be free on each of them before launch; 0: any
  /// "auto": warming reads the checkpoint into the page cache before the switch; "off": it does not.
  std::string warm = "auto";
  /// serve.switch: how the service switches to a new revision; "restart" (the only way yet, the
  /// default): its service is stopped and started on the new revision.
  std::string switch_setting = "restart";
  /// serve.engine: the inference engine the command runs, "generic" (the default: modeld knows
  /// nothing of it), "vllm" or "sglang" (lib/engine: its programs and drain flag).
  std::string engine = "generic";
  /// serve.drain_timeout: how long the server's main process alone has after SIGTERM to finish the
  /// requests in flight before the rest of its control group is killed (drop-in KillMode=mixed); 0
  /// (the default): every process is signalled at once, as before.
  milliseconds drain_timeout{0};

  friend bool operator==(const ServeConfig&, const ServeConfig&) = default;
};

/// [models.NAME.health]: readiness and post-deploy probes.
struct HealthConfig {
  std::string path = "/health";
  std::string models_path = "/v1/models";
  bool completion = true;
  std::filesystem::path api_key_file;  ///< absolute; empty: the server needs no API key
  milliseconds stall_timeout = std::chrono::minutes(10);
  milliseconds watch_interval = std::chrono::seconds(30);
  unsigned watch_failures = 3;  ///< consecutive failed probes before a restart, >= 1

  friend bool operator==(const HealthConfig&, const HealthConfig&) = default;
};

/// [models.NAME.benchmark]
struct BenchmarkConfig {
  bool enabled = false;
  std::string prompt = "Write a haiku about GPUs.";
  unsigned max_tokens = 256;  ///< >= 1

  friend bool operator==(const BenchmarkConfig&, const BenchmarkConfig&) = default;
};

/// [models.NAME]: one deployable model.
struct ModelConfig {
  std::string name;  ///< the table's key; valid per interface.md "Model names"
  std::string repo;  ///< "org/name"
  std::string revision = "main";
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  bool pinned = false;
  ServeConfig serve;
  HealthConfig health;
  BenchmarkConfig benchmark;
  std::filesystem::path source_file;  ///< the file that defined this model, for messages

  /// Whole-value comparison (source_file included), e.g. to tell a reload's changed models.
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

/// The whole configuration after defaults and environment are applied.
struct Config {
  std::filesystem::path file;  ///< the main configuration file
  DaemonConfig daemon;
  ControlConfig control;
  HubConfig hub;
  MetricsConfig metrics;
  std::map<std::string, ModelConfig> models;  ///< by name

  /// Returns the model called `name`, or nullptr.
  const ModelConfig* find_model(const std::string& name) const;
};

/// The GPUs a model's server uses, as NVML indices: nullopt means every GPU of the host, an empty
/// list none (interface.md "Several models on one host").
using GpuSet = std::optional<std::vector<unsigned>>;

/// Whether two servers using `a` and `b` would share a GPU: an all-GPU set overlaps every set
/// that is not empty (another all-GPU set included), two lists overlap when they share an index.
bool gpu_sets_overlap(const GpuSet& a, const GpuSet& b);

/// One problem found while loading: where it is and what is wrong.
struct Problem {
  std::filesystem::path file;
  int line = 0;    ///< 1-based; 0 when the problem has no position (a missing file)
  int column = 0;  ///< 1-based
  std::string message;  ///< names the key, e.g. "unknown key 'paralel_files' in [hub]"

  /// "FILE:LINE:COL: message" as `modeld --check-config` prints it (interface.md); "FILE: message"
  /// when line is 0.
  std::string to_string() const;
};

/// Environment values that fill keys the files leave out (explicit config wins).
struct Environment {
  std::optional<std::string> hf_endpoint;  ///< $HF_ENDPOINT
};

/// Reads the environment variables that Environment describes; an empty variable counts as unset.
Environment environment_from_process();

/// Loads `file` and every `*.toml` in `models.d/` beside it (sorted by name; model tables only),
/// validates every key, type and value, and applies `env`; returns the Config, or every problem
/// found (never stops at the first), each file's in the order they appear in it; `config` is set
/// only when there is no problem. A missing main file is a problem with line 0. A model defined in
/// two files is a problem naming both; anything but [models.*] in a models.d file is a problem.
/// Across models: two models with equal serve.port whose GPU sets do not overlap
/// (gpu_sets_overlap) are a problem at the port of the one read later (the main file first, then
/// models.d by name; in a file by position; the serve table when the port is the default), naming
/// the other and its file:line. Reads the files (blocks): call it off the event loop.
/// `warnings`: what may be meant otherwise but can work (serve.engine and serve.command
/// disagreeing, vLLM's --shutdown-timeout against serve.drain_timeout), each at its key; they never
/// refuse the configuration.
struct LoadResult {
  std::optional<Config> config;
  std::vector<Problem> problems;
  std::vector<Problem> warnings;
};
LoadResult load(const std::filesystem::path& file, const Environment& env);

/// Why the secret file `path` (the Hub token) must not be used as it is: "NAME PATH has mode
/// 0644: group or others may read or write the Hub token; …chmod 600 PATH…", with `name` the
/// setting that names it (e.g. "hub.token_file"); nullopt when only its owner may read or write
/// it, or when it cannot be stat'ed (reading it then reports that).
std::optional<std::string> shared_secret_file(const std::filesystem::path& path, std::string_view name);

/// A setting that a running daemon cannot take over from a reloaded configuration.
struct FixedChange {
  std::string key;        ///< e.g. "daemon.models_dir"
  std::string running;    ///< the value in use, as written in messages
  std::string requested;  ///< the value the reloaded configuration asks for
};

/// For a configuration reload (SIGHUP): finds every setting of `reloaded` that only takes effect
/// at the next start of modeld (daemon.*, except disk_reserve; control.group; hub.endpoint,
/// token_file, ca_file, read_timeout, listing_timeout; metrics.*), sets it back to the value
/// `running` has,
/// and returns what differed, in that order. Models, hub.parallel_files, hub.max_bytes_per_s
/// and daemon.disk_reserve and warm_reserve are left as reloaded.
std::vector<FixedChange> keep_fixed_settings(const Config& running, Config& reloaded);

/// How long a stop of the model's service may take before SIGKILL: serve.drain_timeout plus
/// serve.stop_timeout (the drop-in's TimeoutStopSec=).
std::chrono::milliseconds stop_budget(const ServeConfig& serve);

/// Returns `model.serve.command` with {model_dir} (`model_dir`), {name}, {served_name} and {port}
/// replaced wherever they occur inside each argument ("--port={port}"), in one pass (substituted
/// text is not expanded again); other brace sequences stay as they are.
std::vector<std::string> expand_command(const ModelConfig& model, const std::filesystem::path& model_dir);

}  // namespace modeld::config
