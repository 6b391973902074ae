#include "config/config.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

using namespace modeld::config;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A fresh folder under $TMPDIR holding one test's configuration files; removed afterwards.
struct TempDir {
  fs::path path;

  TempDir() {
    std::string templ = (fs::temp_directory_path() / "modeld-config-test-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to `relative` (creating folders) and returns the full path.
  fs::path write(const fs::path& relative, std::string_view text) const {
    fs::path p = path / relative;
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + p.string());
    return p;
  }
};

// The smallest valid model, as a models.d file or part of the main file.
constexpr std::string_view kMinimalModel = R"([models.m]
repo = "org/m"

[models.m.serve]
command = ["server", "{model_dir}"]
)";

// The first problem whose message contains `needle`, or nullptr.
const Problem* find_problem(const LoadResult& r, std::string_view needle) {
  for (const Problem& p : r.problems)
    if (p.message.find(needle) != std::string::npos) return &p;
  return nullptr;
}

// All problems, one per line, for failure messages.
std::string dump(const LoadResult& r) {
  std::string s;
  for (const Problem& p : r.problems) s += p.to_string() + "\n";
  return s;
}

}  // namespace

TEST_CASE("the shipped example configuration loads with no problems") {
  fs::path main = fs::path(MODELD_SOURCE_DIR) / "config" / "modeld.toml";
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.empty());
  REQUIRE(r.config);
  const Config& c = *r.config;
  CHECK(c.daemon.models_dir == "/var/lib/modeld/models");
  CHECK(c.daemon.disk_reserve == 20ull << 30);
  CHECK(c.hub.endpoint == "https://huggingface.co");
  CHECK(c.hub.parallel_files == 8);

  const ModelConfig* kimi = c.find_model("kimi-k2-5");
  REQUIRE(kimi != nullptr);
  CHECK(kimi->repo == "moonshotai/Kimi-K2.5");
  CHECK(kimi->serve.served_name == "kimi-k2.5");
  CHECK(kimi->serve.port == 8000);
  CHECK(kimi->serve.startup_timeout == 60min);
  CHECK(kimi->serve.stop_timeout == 5min);
  CHECK(kimi->serve.gpus == 8);
  CHECK(kimi->serve.gpu_memory == 127ull << 30);
  CHECK(kimi->serve.command.front() == "vllm");
  CHECK(kimi->source_file.filename() == "kimi-k2-5.toml");
  CHECK(c.find_model("nope") == nullptr);
}

TEST_CASE("a misspelt key is reported with its position and the closest known key") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[hub]\nparallel_files = 4\n  paralel_files = 4\n");
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  const Problem& p = r.problems[0];
  CHECK(p.file == main);
  CHECK(p.line == 3);
  CHECK(p.column == 3);
  CHECK(p.message == "unknown key 'paralel_files' in [hub]; did you mean 'parallel_files'?");
  CHECK(p.to_string() == main.string() + ":3:3: unknown key 'paralel_files' in [hub]; did you mean "
                                         "'parallel_files'?");
  CHECK_FALSE(r.config);
}

TEST_CASE("unknown keys are refused in every table, with a suggestion only when one is close") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"(deamon = 1
[metrics]
colour = "blue"
[models.m]
repo = "org/m"
[models.m.serve]
command = ["x"]
prot = 8001
[models.m.health]
watch_failure = 2
[models.m.benchmark]
enable = true
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  CHECK(find_problem(r, "unknown key 'deamon' in the top-level table; did you mean 'daemon'?"));
  const Problem* colour = find_problem(r, "unknown key 'colour' in [metrics]");
  REQUIRE(colour);
  CHECK(colour->message.find("did you mean") == std::string::npos);
  CHECK(find_problem(r, "unknown key 'prot' in [models.m.serve]; did you mean 'port'?"));
  CHECK(find_problem(r, "unknown key 'watch_failure' in [models.m.health]; did you mean 'watch_failures'?"));
  CHECK(find_problem(r, "unknown key 'enable' in [models.m.benchmark]; did you mean 'enabled'?"));
  CHECK(r.problems.size() == 5);
}

TEST_CASE("a value of the wrong type names the key and both types") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"([daemon]
socket = 5
[hub]
parallel_files = "eight"
[models.m]
repo = "org/m"
pinned = "yes"
include = ["*.json", 3]
[models.m.serve]
command = "server --port 8000"
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  const Problem* socket = find_problem(r, "expected a string for daemon.socket, got integer");
  REQUIRE(socket);
  CHECK(socket->line == 2);
  CHECK(socket->column == 10);
  CHECK(find_problem(r, "expected an integer for hub.parallel_files, got string"));
  CHECK(find_problem(r, "expected a boolean (true or false) for models.m.pinned, got string"));
  CHECK(find_problem(r, "expected a string for models.m.include[1], got integer"));
  CHECK(find_problem(r, "expected an array of strings for models.m.serve.command, got string"));
}

TEST_CASE("sizes are strings with units or integer byte counts, and bad ones are refused") {
  TempDir dir;
  SECTION("an integer is a byte count") {
    fs::path main = dir.write("modeld.toml", "[daemon]\ndisk_reserve = 1048576\n[hub]\nmax_bytes_per_s = \"500MB\"\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->daemon.disk_reserve == 1048576u);
    CHECK(r.config->hub.max_bytes_per_s == 500'000'000u);
  }
  SECTION("an unknown unit is a problem at the value") {
    fs::path main = dir.write("modeld.toml", "[daemon]\ndisk_reserve = \"20 parsecs\"\n");
    LoadResult r = load(main, Environment{});
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].line == 2);
    CHECK(r.problems[0].message.find("bad size \"20 parsecs\" for daemon.disk_reserve") == 0);
  }
  SECTION("a negative byte count is a problem") {
    fs::path main = dir.write("modeld.toml", "[daemon]\ndisk_reserve = -1\n");
    LoadResult r = load(main, Environment{});
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].message == "daemon.disk_reserve must not be negative, got -1");
  }
}

TEST_CASE("hub.max_file_size is a size between 1 MiB and 1024 TiB") {
  TempDir dir;
  SECTION("a size with a unit") {
    fs::path main = dir.write("modeld.toml", "[hub]\nmax_file_size = \"200GiB\"\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->hub.max_file_size == 200ull << 30);
  }
  SECTION("too small or too large is a problem at the value") {
    for (const char* value : {"\"1000\"", "\"2048TiB\""}) {
      fs::path main = dir.write("modeld.toml", fmt::format("[hub]\nmax_file_size = {}\n", value));
      LoadResult r = load(main, Environment{});
      INFO(dump(r));
      REQUIRE(r.problems.size() == 1);
      CHECK(r.problems[0].line == 2);
      CHECK(r.problems[0].column == 17);
      CHECK(r.problems[0].message.find("hub.max_file_size must be between 1MiB and 1024TiB") == 0);
    }
  }
}

TEST_CASE("a bad duration names the key and the text") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", std::string(kMinimalModel) + "startup_timeout = \"5 fortnights\"\n"
                                                               "stop_timeout = 300\n");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  const Problem* bad = find_problem(r, "bad duration \"5 fortnights\" for models.m.serve.startup_timeout");
  REQUIRE(bad);
  CHECK(bad->line == 6);
  CHECK(find_problem(r, "expected a duration string (\"90s\", \"60m\", \"2h\") for models.m.serve.stop_timeout, "
                        "got integer"));
  CHECK(r.problems.size() == 2);
}

TEST_CASE("an invalid model name is refused at its key") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[models.Kimi]\nrepo = \"org/m\"\n");
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].line == 1);
  CHECK(r.problems[0].message.find("invalid model name 'Kimi' in [models]") == 0);
}

TEST_CASE("a dotted model name written without quotes gets a hint to quote it") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[models.kimi-k2.5]\nrepo = \"org/m\"\n");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.size() == 1);  // not also "kimi-k2 has no repo"
  CHECK(r.problems[0].message == "unknown key '5' in [models.kimi-k2]; a model name containing '.' must be "
                                 "quoted: [models.\"kimi-k2.5\"]");
}

TEST_CASE("a quoted model name may contain a dot") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"([models."kimi-k2.5"]
repo = "org/m"
[models."kimi-k2.5".serve]
command = ["x"]
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.config);
  REQUIRE(r.config->find_model("kimi-k2.5"));
  CHECK(r.config->find_model("kimi-k2.5")->serve.served_name == "kimi-k2.5");
}

TEST_CASE("a model without repo, serve table or command is refused") {
  TempDir dir;
  SECTION("no repo and no serve table") {
    fs::path main = dir.write("modeld.toml", "[models.m]\npinned = true\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    const Problem* repo = find_problem(r, "missing required key 'repo' in [models.m]");
    REQUIRE(repo);
    CHECK(repo->line == 1);
    CHECK(find_problem(r, "missing required table [models.m.serve]"));
    CHECK(r.problems.size() == 2);
  }
  SECTION("a serve table without command") {
    fs::path main = dir.write("modeld.toml", "[models.m]\nrepo = \"org/m\"\n[models.m.serve]\nport = 8000\n");
    LoadResult r = load(main, Environment{});
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].message == "missing required key 'command' in [models.m.serve]");
    CHECK(r.problems[0].line == 3);
  }
  SECTION("an empty command") {
    fs::path main = dir.write("modeld.toml", "[models.m]\nrepo = \"org/m\"\n[models.m.serve]\ncommand = []\n");
    LoadResult r = load(main, Environment{});
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].message == "models.m.serve.command must not be empty");
  }
}

TEST_CASE("values out of range are refused") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"([hub]
parallel_files = 65
endpoint = "ftp://mirror.example"
token_file = "hf-token"
[daemon]
models_dir = "models"
[metrics]
listen = "localhost"
[models.m]
repo = "just-a-name"
[models.m.serve]
command = ["x"]
port = 0
environment = { NCCL_DEBUG = 1 }
[models.m.health]
path = "health"
watch_failures = 0
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  CHECK(find_problem(r, "hub.parallel_files must be between 1 and 64, got 65"));
  CHECK(find_problem(r, "hub.endpoint must be an http:// or https:// URL, got \"ftp://mirror.example\""));
  CHECK(find_problem(r, "hub.token_file must be an absolute path, got \"hf-token\""));
  CHECK(find_problem(r, "daemon.models_dir must be an absolute path, got \"models\""));
  CHECK(find_problem(r, "metrics.listen must be \"HOST:PORT\""));
  CHECK(find_problem(r, "models.m.repo must look like \"org/name\""));
  CHECK(find_problem(r, "models.m.serve.port must be between 1 and 65535, got 0"));
  CHECK(find_problem(r, "expected a string for models.m.serve.environment.NCCL_DEBUG, got integer"));
  CHECK(find_problem(r, "models.m.health.path must be an HTTP path starting with '/'"));
  CHECK(find_problem(r, "models.m.health.watch_failures must be between 1 and 1000, got 0"));
  CHECK(r.problems.size() == 10);
}

TEST_CASE("hub.listing_timeout is a duration of at least 1s, 60s by default, named with its position when wrong") {
  TempDir dir;
  CHECK(load(dir.write("modeld.toml", kMinimalModel), Environment{}).config->hub.listing_timeout == 60s);
  fs::path ok = dir.write("ok.toml", "[hub]\nlisting_timeout = \"2s\"\n" + std::string(kMinimalModel));
  LoadResult good = load(ok, Environment{});
  INFO(dump(good));
  REQUIRE(good.config);
  CHECK(good.config->hub.listing_timeout == 2s);

  fs::path shortish = dir.write("short.toml", "[hub]\nlisting_timeout = \"500ms\"\n" + std::string(kMinimalModel));
  LoadResult r = load(shortish, Environment{});
  INFO(dump(r));
  const Problem* p = find_problem(r, "hub.listing_timeout must be at least 1s");
  REQUIRE(p);
  CHECK(p->file == shortish);
  CHECK(p->line == 2);
  CHECK(p->column > 0);
  fs::path typo = dir.write("typo.toml", "[hub]\nlisting_timeout = 60\n" + std::string(kMinimalModel));
  CHECK(find_problem(load(typo, Environment{}), "expected a duration string (\"90s\", \"60m\", \"2h\") for "
                                                "hub.listing_timeout, got integer"));
}

TEST_CASE("every problem is reported at once, in the order of the file") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"([daemon]
socket = 1
state_dir = "relative"
[hub]
paralel_files = 2
[models.BAD]
repo = "org/m"
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.size() == 4);
  CHECK(r.problems[0].line == 2);
  CHECK(r.problems[1].line == 3);
  CHECK(r.problems[2].line == 5);
  CHECK(r.problems[3].line == 6);
  CHECK_FALSE(r.config);
}

TEST_CASE("a TOML syntax error is a problem at its position") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[daemon]\nsocket = \"/run/x.sock\n");
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].file == main);
  CHECK(r.problems[0].line == 2);
  CHECK(r.problems[0].column > 0);
}

TEST_CASE("a missing main file is a problem without a position") {
  TempDir dir;
  fs::path main = dir.path / "absent.toml";
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].line == 0);
  CHECK(r.problems[0].to_string() == main.string() + ": cannot read: no such file");
  CHECK_FALSE(r.config);
}

TEST_CASE("models.d files add models, are read in name order, and other files there are ignored") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[control]\ngroup = \"ops\"\n");
  dir.write("models.d/b.toml", "[models.bbb]\nrepo = \"org/b\"\n[models.bbb.serve]\ncommand = [\"x\"]\n");
  dir.write("models.d/a.toml", "[models.aaa]\nrepo = \"org/a\"\n[models.aaa.serve]\ncommand = [\"x\"]\n");
  dir.write("models.d/README", "not toml [at all\n");
  dir.write("models.d/c.toml.disabled", "[daemon]\n");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.config);
  CHECK(r.config->control.group == "ops");
  REQUIRE(r.config->models.size() == 2);
  CHECK(r.config->find_model("aaa")->source_file == dir.path / "models.d" / "a.toml");
  CHECK(r.config->find_model("bbb")->source_file == dir.path / "models.d" / "b.toml");
}

TEST_CASE("a model defined in two files is a problem naming both files") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", kMinimalModel);
  fs::path second = dir.write("models.d/m.toml", kMinimalModel);
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  const Problem& p = r.problems[0];
  CHECK(p.file == second);
  CHECK(p.line == 1);
  CHECK(p.message == "model 'm' is defined twice: in " + main.string() + " and in " + second.string());
}

TEST_CASE("a models.d file holding anything but model tables is refused") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "");
  fs::path extra = dir.write("models.d/extra.toml", std::string(kMinimalModel) + "[hub]\nparallel_files = 2\n");
  dir.write("models.d/key.toml", "stray = 1\n");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.size() == 2);
  CHECK(r.problems[0].file == extra);
  CHECK(r.problems[0].line == 6);
  CHECK(r.problems[0].message.find("'hub' is not allowed in a models.d file") == 0);
  CHECK(r.problems[1].file == dir.path / "models.d" / "key.toml");
  CHECK(r.problems[1].message.find("'stray' is not allowed in a models.d file") == 0);
}

TEST_CASE("the environment's Hub endpoint is used only when the file sets none") {
  TempDir dir;
  Environment env;
  env.hf_endpoint = "http://mirror.internal:8080/";
  SECTION("absent key: the environment wins over the default, without its trailing slash") {
    fs::path main = dir.write("modeld.toml", "[hub]\nparallel_files = 2\n");
    LoadResult r = load(main, env);
    REQUIRE(r.config);
    CHECK(r.config->hub.endpoint == "http://mirror.internal:8080");
    CHECK(load(main, Environment{}).config->hub.endpoint == "https://huggingface.co");
  }
  SECTION("explicit key: the file wins over the environment") {
    fs::path main = dir.write("modeld.toml", "[hub]\nendpoint = \"https://hub.example\"\n");
    LoadResult r = load(main, env);
    REQUIRE(r.config);
    CHECK(r.config->hub.endpoint == "https://hub.example");
  }
  SECTION("a malformed environment value is a problem when it would be used") {
    fs::path main = dir.write("modeld.toml", "");
    env.hf_endpoint = "mirror.internal";
    LoadResult r = load(main, env);
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].line == 0);
    CHECK(r.problems[0].message.find("$HF_ENDPOINT must be an http:// or https:// URL") == 0);
  }
}

TEST_CASE("environment_from_process reads HF_ENDPOINT and treats an empty one as unset") {
  const char* saved = std::getenv("HF_ENDPOINT");
  std::string saved_value = saved ? saved : "";
  ::setenv("HF_ENDPOINT", "https://mirror.example", 1);
  CHECK(environment_from_process().hf_endpoint == std::optional<std::string>("https://mirror.example"));
  ::setenv("HF_ENDPOINT", "", 1);
  CHECK_FALSE(environment_from_process().hf_endpoint);
  if (saved)
    ::setenv("HF_ENDPOINT", saved_value.c_str(), 1);
  else
    ::unsetenv("HF_ENDPOINT");
}

TEST_CASE("defaults fill every key the files leave out") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", kMinimalModel);
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.config);
  const Config& c = *r.config;
  CHECK(c.file == main);
  CHECK(c.daemon.state_dir == "/var/lib/modeld/state");
  CHECK(c.daemon.socket == "/run/modeld/modeld.sock");
  CHECK(c.daemon.unit_dir == "/run/systemd/system");
  CHECK(c.control.group == "modeld");
  CHECK(c.hub.token_file.empty());
  CHECK(c.hub.max_bytes_per_s == 0u);
  CHECK(c.hub.max_file_size == 1ull << 40);
  CHECK(c.metrics.listen.empty());
  const ModelConfig& m = *c.find_model("m");
  CHECK(m.revision == "main");
  CHECK(m.include.empty());
  CHECK_FALSE(m.pinned);
  CHECK(m.serve.served_name == "m");
  CHECK(m.serve.port == 8000);
  CHECK(m.serve.startup_timeout == 60min);
  CHECK(m.serve.stop_timeout == 5min);
  CHECK(m.health.path == "/health");
  CHECK(m.health.models_path == "/v1/models");
  CHECK(m.health.completion);
  CHECK(m.health.stall_timeout == 10min);
  CHECK(m.health.watch_interval == 30s);
  CHECK(m.health.watch_failures == 3u);
  CHECK_FALSE(m.benchmark.enabled);
  CHECK(m.benchmark.max_tokens == 256u);
  CHECK(m.source_file == main);
}

TEST_CASE("expand_command fills placeholders anywhere inside each argument") {
  ModelConfig m;
  m.name = "kimi-k2-5";
  m.serve.served_name = "kimi-k2.5";
  m.serve.port = 8123;
  m.serve.command = {"vllm",       "serve",           "{model_dir}",     "--port={port}",
                     "{name}-{served_name}", "{unknown}", "{port", "{{port}}"};
  auto argv = expand_command(m, "/models/{name}");
  REQUIRE(argv.size() == 8);
  CHECK(argv[0] == "vllm");
  CHECK(argv[2] == "/models/{name}");  // substituted text is not expanded again
  CHECK(argv[3] == "--port=8123");
  CHECK(argv[4] == "kimi-k2-5-kimi-k2.5");
  CHECK(argv[5] == "{unknown}");
  CHECK(argv[6] == "{port");
  CHECK(argv[7] == "{8123}");
}

TEST_CASE("problems print as FILE:LINE:COL: message") {
  Problem p{"/etc/modeld/modeld.toml", 12, 5, "unknown key 'x' in [hub]"};
  CHECK(p.to_string() == "/etc/modeld/modeld.toml:12:5: unknown key 'x' in [hub]");
}

TEST_CASE("files modeld must read later are checked to exist now") {
  TempDir dir;
  fs::path token = dir.write("hf-token", "hf_x\n");
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  fs::path main = dir.write("modeld.toml", fmt::format("[hub]\ntoken_file = \"{}\"\nca_file = \"{}\"\n",
                                                       token.string(), (dir.path / "missing-ca.pem").string()));
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].line == 3);
  CHECK(r.problems[0].message.find("hub.ca_file") != std::string::npos);
  CHECK(r.problems[0].message.find("does not exist") != std::string::npos);

  fs::path dir_as_key = dir.write("m.toml", fmt::format(R"([models.m]
repo = "org/m"
[models.m.serve]
command = ["server"]
[models.m.health]
api_key_file = "{}"
)",
                                                          dir.path.string()));
  LoadResult r2 = load(dir_as_key, Environment{});
  REQUIRE(find_problem(r2, "not a regular file"));
}

TEST_CASE("a token_file that group or others may read is a problem naming its mode and chmod 600") {
  TempDir dir;
  fs::path token = dir.write("hf-token", "hf_x\n");
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                             fs::perms::others_read);
  fs::path main = dir.write("modeld.toml", fmt::format("[hub]\ntoken_file = \"{}\"\n", token.string()));
  LoadResult r = load(main, Environment{});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].line == 2);
  CHECK(r.problems[0].message == fmt::format("hub.token_file {} has mode 0644: group or others may read or write the "
                                             "Hub token; make it private to its owner (chmod 600 {})",
                                             token.string(), token.string()));
  CHECK(r.problems[0].message.find("hf_x") == std::string::npos);

  fs::permissions(token, fs::perms::owner_read);
  CHECK(load(main, Environment{}).problems.empty());
}

TEST_CASE("a misspelt placeholder in the serve command is refused") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", R"([models.m]
repo = "org/m"
[models.m.serve]
command = ["vllm", "serve", "{modeldir}", "--port", "{port}", "--override", "{\"a\": 1}"]
)");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].message.find("unknown placeholder {modeldir}") != std::string::npos);
  CHECK(r.problems[0].line == 4);
}

TEST_CASE("an endpoint with a port outside 1..65535 is refused at check time") {
  for (const char* endpoint : {"http://127.0.0.1:99999", "https://hub.example:0", "http://[::1]:x", "http://[::1"}) {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", fmt::format("[hub]\nendpoint = \"{}\"\n", endpoint));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    CHECK(find_problem(r, fmt::format("hub.endpoint must be an http:// or https:// URL, got \"{}\"", endpoint)));
  }
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[hub]\nendpoint = \"http://[::1]:8080/\"\n");
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.config);
  CHECK(r.config->hub.endpoint == "http://[::1]:8080");
}

TEST_CASE("metrics.listen takes IPv4, bracketed IPv6 and host names with a port 1..65535") {
  for (const char* good : {"127.0.0.1:9464", "0.0.0.0:1", "[::1]:9464", "[::]:65535", "localhost:9464",
                           "metrics.example.org:9464", ""}) {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", fmt::format("[metrics]\nlisten = \"{}\"\n", good));
    LoadResult r = load(main, Environment{});
    INFO(good << "\n" << dump(r));
    REQUIRE(r.config);
    CHECK(r.config->metrics.listen == good);
  }
  for (const char* bad : {"127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", ":9464", "::1:9464", "[::1:9464",
                          "[nothost]:9464", "host name:9464", "-host:9464", "127.0.0.1:94x4", "127.0.0.1:"}) {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", fmt::format("[metrics]\nlisten = \"{}\"\n", bad));
    LoadResult r = load(main, Environment{});
    INFO(bad << "\n" << dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(find_problem(r, fmt::format("metrics.listen must be \"HOST:PORT\" with a port 1..65535")));
    CHECK(find_problem(r, fmt::format("got \"{}\"", bad)));
    CHECK(r.problems[0].line == 2);
  }
}

TEST_CASE("the TCP metrics listener's connection limits are read, bounded and consistent") {
  {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", "[metrics]\nlisten = \"127.0.0.1:9464\"\n");
    LoadResult r = load(main, Environment{});
    REQUIRE(r.config);
    CHECK(r.config->metrics.max_connections == 16);
    CHECK(r.config->metrics.per_address_connections == 4);
  }
  {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", "[metrics]\nmax_connections = 64\nper_address_connections = 64\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->metrics.max_connections == 64);
    CHECK(r.config->metrics.per_address_connections == 64);
  }
  struct Bad {
    const char* toml;
    const char* problem;
    int line, column;
  };
  for (const Bad& bad : {Bad{"max_connections = 0\n", "metrics.max_connections must be between 1 and 4096, got 0", 2, 19},
                         Bad{"max_connections = \"16\"\n", "metrics.max_connections", 2, 19},
                         Bad{"per_address_connections = 5000\n", "metrics.per_address_connections must be between 1 and 4096", 2, 27},
                         Bad{"max_connections = 8\nper_address_connections = 9\n",
                             "metrics.per_address_connections (9) must not exceed metrics.max_connections (8)", 3, 27}}) {
    TempDir dir;
    fs::path main = dir.write("modeld.toml", std::string("[metrics]\n") + bad.toml);
    LoadResult r = load(main, Environment{});
    INFO(bad.toml << "\n" << dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(find_problem(r, bad.problem));
    CHECK(r.problems[0].line == bad.line);
    CHECK(r.problems[0].column == bad.column);
  }
}

TEST_CASE("a reload keeps the settings that need a restart and takes over the rest") {
  Config running;
  running.daemon.models_dir = "/srv/models";
  running.hub.endpoint = "https://hub.example";
  running.hub.parallel_files = 8;
  running.metrics.listen = "127.0.0.1:9464";
  running.models["a"].repo = "org/a";

  Config reloaded = running;
  reloaded.daemon.models_dir = "/data/models";
  reloaded.daemon.disk_reserve = 1;
  reloaded.control.group = "ops";
  reloaded.hub.endpoint = "https://mirror.example";
  reloaded.hub.read_timeout = 5s;
  reloaded.hub.listing_timeout = 7s;
  reloaded.hub.parallel_files = 16;
  reloaded.metrics.listen = "";
  reloaded.metrics.per_address_connections = 2;
  reloaded.models["b"].repo = "org/b";

  auto fixed = keep_fixed_settings(running, reloaded);
  REQUIRE(fixed.size() == 7);
  CHECK(fixed[0].key == "daemon.models_dir");
  CHECK(fixed[0].running == "\"/srv/models\"");
  CHECK(fixed[0].requested == "\"/data/models\"");
  CHECK(fixed[1].key == "control.group");
  CHECK(fixed[2].key == "hub.endpoint");
  CHECK(fixed[3].key == "hub.read_timeout");
  CHECK(fixed[3].running == "30000 ms");
  CHECK(fixed[3].requested == "5000 ms");
  CHECK(fixed[4].key == "hub.listing_timeout");
  CHECK(fixed[4].requested == "7000 ms");
  CHECK(fixed[5].key == "metrics.listen");
  CHECK(fixed[6].key == "metrics.per_address_connections");
  CHECK(fixed[6].running == "4");
  CHECK(fixed[6].requested == "2");
  // Set back to what runs ...
  CHECK(reloaded.daemon.models_dir == "/srv/models");
  CHECK(reloaded.control.group == "modeld");
  CHECK(reloaded.hub.endpoint == "https://hub.example");
  CHECK(reloaded.hub.read_timeout == 30s);
  CHECK(reloaded.hub.listing_timeout == 60s);
  CHECK(reloaded.metrics.listen == "127.0.0.1:9464");
  CHECK(reloaded.metrics.per_address_connections == 4);
  // ... and the rest as reloaded.
  CHECK(reloaded.daemon.disk_reserve == 1);
  CHECK(reloaded.hub.parallel_files == 16);
  CHECK(reloaded.models.count("b"));
  CHECK(keep_fixed_settings(running, reloaded).empty());
}

TEST_CASE("model tables compare by value, so a reload can tell which models changed") {
  ModelConfig a;
  a.name = "a";
  a.repo = "org/a";
  ModelConfig b = a;
  CHECK(a == b);
  b.health.watch_interval = 1s;
  CHECK(!(a == b));
  b = a;
  b.serve.environment["X"] = "1";
  CHECK(!(a == b));
}

TEST_CASE("serve.warm is auto or off, and daemon.warm_reserve a size left unset by default") {
  TempDir dir;
  SECTION("defaults: warm auto, the reserve computed when warming runs") {
    fs::path main = dir.write("modeld.toml", kMinimalModel);
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.warm == "auto");
    CHECK_FALSE(r.config->daemon.warm_reserve.has_value());
  }
  SECTION("off and a reserve are read") {
    fs::path main = dir.write("modeld.toml", "[daemon]\nwarm_reserve = \"16GiB\"\n" + std::string(kMinimalModel) +
                                                 "warm = \"off\"\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.warm == "off");
    CHECK(r.config->daemon.warm_reserve == std::optional<std::uint64_t>(16ull << 30));
  }
  SECTION("another value is a problem at its line") {
    fs::path main = dir.write("modeld.toml", std::string(kMinimalModel) + "warm = \"eager\"\n");
    LoadResult r = load(main, Environment{});
    const Problem* p = find_problem(r, "models.m.serve.warm must be \"auto\" or \"off\", got \"eager\"");
    REQUIRE(p != nullptr);
    CHECK(p->line == 6);
  }
}

TEST_CASE("serve.switch is restart by default and any other value is a problem at its line") {
  TempDir dir;
  SECTION("the default") {
    fs::path main = dir.write("modeld.toml", std::string(kMinimalModel));
    LoadResult r = load(main, Environment{});
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.switch_setting == "restart");
  }
  SECTION("restart written") {
    fs::path main = dir.write("modeld.toml", std::string(kMinimalModel) + "switch = \"restart\"\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.switch_setting == "restart");
  }
  SECTION("another value") {
    fs::path main = dir.write("modeld.toml", std::string(kMinimalModel) + "switch = \"reload\"\n");
    LoadResult r = load(main, Environment{});
    const Problem* p = find_problem(r, "models.m.serve.switch must be \"restart\", got \"reload\"");
    REQUIRE(p != nullptr);
    CHECK(p->line == 6);
  }
}

// -- Several models on one host: serve.gpu_ids, serve.gpus derived from it, and the refusals
// across models (interface.md "Several models on one host").

namespace {

// A model table named `name` whose serve table holds `serve` (lines after the command).
std::string model_with(std::string_view name, std::string_view serve) {
  return fmt::format("[models.{0}]\nrepo = \"org/{0}\"\n[models.{0}.serve]\ncommand = [\"x\"]\n{1}", name, serve);
}

}  // namespace

TEST_CASE("serve.gpu_ids is read in the order written and serve.gpus is derived from its size") {
  TempDir dir;
  SECTION("a list: kept as written, gpus = its size") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpu_ids = [3, 1, 2, 0]\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    const ServeConfig& s = r.config->models.at("m").serve;
    CHECK(s.gpu_ids == std::optional<std::vector<unsigned>>({3, 1, 2, 0}));
    CHECK(s.gpus == 4);
  }
  SECTION("the whole range 0..63 is accepted") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpu_ids = [63, 0]\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.gpu_ids == std::optional<std::vector<unsigned>>({63, 0}));
  }
  SECTION("an empty list is a model using no GPU: gpus 0") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpu_ids = []\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    const ServeConfig& s = r.config->models.at("m").serve;
    REQUIRE(s.gpu_ids.has_value());
    CHECK(s.gpu_ids->empty());
    CHECK(s.gpus == 0);
  }
  SECTION("without gpu_ids: every GPU, and gpus as written (nothing changes)") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpus = 8\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK_FALSE(r.config->models.at("m").serve.gpu_ids.has_value());
    CHECK(r.config->models.at("m").serve.gpus == 8);
  }
  SECTION("gpus written and equal to the set's size is accepted") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpus = 2\ngpu_ids = [4, 5]\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.gpus == 2);
  }
}

TEST_CASE("serve.gpus different from gpu_ids' size is a problem at the gpus key") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", model_with("m", "gpus = 2\ngpu_ids = [0, 1, 2, 3]\n"));
  LoadResult r = load(main, Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.size() == 1);
  const Problem& p = r.problems[0];
  CHECK(p.file == main);
  CHECK(p.line == 5);
  CHECK(p.column == 8);
  CHECK(p.message ==
        "models.m.serve.gpus = 2 but models.m.serve.gpu_ids names 4 GPUs; leave gpus out, it is derived from gpu_ids");
  CHECK_FALSE(r.config);

  fs::path one = dir.write("modeld.toml", model_with("m", "gpus = 0\ngpu_ids = [7]\n"));
  LoadResult r1 = load(one, Environment{});
  REQUIRE(r1.problems.size() == 1);
  CHECK(r1.problems[0].message ==
        "models.m.serve.gpus = 0 but models.m.serve.gpu_ids names 1 GPU; leave gpus out, it is derived from gpu_ids");
}

TEST_CASE("a wrong gpu_ids is a problem at the element (or the key) naming it") {
  TempDir dir;
  auto only_problem = [&](std::string_view serve) {
    LoadResult r = load(dir.write("modeld.toml", model_with("m", serve)), Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK_FALSE(r.config);
    return r.problems[0];
  };
  SECTION("an index past 63") {
    Problem p = only_problem("gpu_ids = [0, 64]\n");
    CHECK(p.line == 5);
    CHECK(p.column == 15);
    CHECK(p.message == "models.m.serve.gpu_ids[1] must be an NVML GPU index between 0 and 63, got 64");
  }
  SECTION("a negative index") {
    Problem p = only_problem("gpu_ids = [-1]\n");
    CHECK(p.line == 5);
    CHECK(p.column == 12);
    CHECK(p.message == "models.m.serve.gpu_ids[0] must be an NVML GPU index between 0 and 63, got -1");
  }
  SECTION("a GPU named twice") {
    Problem p = only_problem("gpu_ids = [2, 3, 2]\n");
    CHECK(p.line == 5);
    CHECK(p.column == 18);
    CHECK(p.message == "models.m.serve.gpu_ids[2] = 2 repeats models.m.serve.gpu_ids[0]: name each GPU once");
  }
  SECTION("an element that is not an integer") {
    Problem p = only_problem("gpu_ids = [0, \"1\"]\n");
    CHECK(p.column == 15);
    CHECK(p.message == "expected an integer (an NVML GPU index) for models.m.serve.gpu_ids[1], got string");
  }
  SECTION("not an array") {
    Problem p = only_problem("gpu_ids = \"0,1\"\n");
    CHECK(p.line == 5);
    CHECK(p.message == "expected an array of GPU indices (integers 0..63) for models.m.serve.gpu_ids, got string");
  }
  SECTION("a misspelt key gets the suggestion") {
    Problem p = only_problem("gpu_id = [0]\n");
    CHECK(p.message == "unknown key 'gpu_id' in [models.m.serve]; did you mean 'gpu_ids'?");
  }
}

TEST_CASE("CUDA_VISIBLE_DEVICES in serve.environment is refused with gpu_ids and kept without") {
  TempDir dir;
  SECTION("with gpu_ids: a problem at the variable's key") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpu_ids = [0, 1]\nenvironment = { NCCL_DEBUG = \"WARN\", "
                                                             "CUDA_VISIBLE_DEVICES = \"0,1\" }\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    const Problem& p = r.problems[0];
    CHECK(p.file == main);
    CHECK(p.line == 6);
    CHECK(p.column == 38);
    CHECK(p.message ==
          "models.m.serve.environment sets CUDA_VISIBLE_DEVICES although models.m.serve.gpu_ids is set: modeld "
          "writes CUDA_VISIBLE_DEVICES from gpu_ids (by GPU UUID, since CUDA's own order is not NVML's); remove it "
          "from environment");
  }
  SECTION("with an empty gpu_ids as well") {
    fs::path main = dir.write("modeld.toml", model_with("m", "gpu_ids = []\n[models.m.serve.environment]\n"
                                                             "CUDA_VISIBLE_DEVICES = \"\"\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].line == 7);
    CHECK(r.problems[0].column == 1);
  }
  SECTION("without gpu_ids: a hand-written value is the operator's and stays") {
    fs::path main = dir.write("modeld.toml", model_with("m", "environment = { CUDA_VISIBLE_DEVICES = \"4,5\" }\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.environment.at("CUDA_VISIBLE_DEVICES") == "4,5");
  }
}

TEST_CASE("two models on one port that may serve together are a problem at the later one's port") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[daemon]\n");
  SECTION("in two files: at the later file's port, naming the other model and its file:line") {
    fs::path a = dir.write("models.d/a.toml", model_with("first", "port = 8000\ngpu_ids = [0, 1, 2, 3]\n"));
    fs::path b = dir.write("models.d/b.toml", model_with("second", "gpu_ids = [4, 5, 6, 7]\nport = 8000\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    const Problem& p = r.problems[0];
    CHECK(p.file == b);
    CHECK(p.line == 6);
    CHECK(p.column == 8);
    CHECK(p.message == "models.second.serve.port = 8000 is also the port of model 'first' (" + a.string() +
                           ":5), and their GPU sets do not overlap (gpu_ids [4, 5, 6, 7] here, gpu_ids [0, 1, 2, 3] "
                           "there): they may serve together but cannot both listen on port 8000; give one of them "
                           "another port");
    CHECK_FALSE(r.config);
  }
  SECTION("in one file: the model written later is the one refused, whatever the names' order") {
    fs::path m = dir.write("models.d/m.toml", model_with("zeta", "port = 9000\ngpu_ids = [0]\n") +
                                                  model_with("alpha", "port = 9000\ngpu_ids = [1]\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].file == m);
    CHECK(r.problems[0].line == 11);
    CHECK(r.problems[0].message.starts_with("models.alpha.serve.port = 9000 is also the port of model 'zeta' (" +
                                            m.string() + ":5)"));
  }
  SECTION("both on the default port: at the later serve table") {
    dir.write("models.d/a.toml", model_with("first", "gpu_ids = [0]\n"));
    fs::path b = dir.write("models.d/b.toml", model_with("second", "gpu_ids = [1]\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].file == b);
    CHECK(r.problems[0].line == 3);
    CHECK(r.problems[0].message.starts_with("models.second.serve.port (default 8000) is also the port of model "
                                            "'first' ("));
  }
  SECTION("models using no GPU, or no GPU and every GPU, may serve together") {
    dir.write("models.d/a.toml", model_with("all", "port = 8000\n"));
    fs::path b = dir.write("models.d/b.toml", model_with("cpu", "port = 8000\ngpu_ids = []\n"));
    fs::path c = dir.write("models.d/c.toml", model_with("cpu2", "port = 8000\ngpu_ids = []\n"));
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 3);
    CHECK(r.problems[0].file == b);
    CHECK(r.problems[0].message.find("(no GPU (gpu_ids = []) here, every GPU (no gpu_ids) there)") !=
          std::string::npos);
    CHECK(r.problems[1].file == c);
    CHECK(r.problems[1].message.find("model 'all'") != std::string::npos);
    CHECK(r.problems[2].file == c);
    CHECK(r.problems[2].message.find("model 'cpu'") != std::string::npos);
  }
  SECTION("the problem joins the file's others in the order of the file") {
    fs::path a = dir.write("models.d/a.toml", model_with("first", "port = 8000\ngpu_ids = [0]\n"));
    dir.write("models.d/b.toml", model_with("second", "port = 8000\ngpu_ids = [1]\nwarm = \"eager\"\n") +
                                     "revison = \"main\"\n");
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    REQUIRE(r.problems.size() == 3);
    CHECK(r.problems[0].line == 5);
    CHECK(r.problems[1].line == 7);
    CHECK(r.problems[2].line == 8);
    CHECK(r.problems[0].message.find("'first' (" + a.string() + ":5)") != std::string::npos);
  }
}

TEST_CASE("models that never serve together may share a port and models on other ports may serve together") {
  TempDir dir;
  fs::path main = dir.write("modeld.toml", "[daemon]\n");
  const auto loads_cleanly = [&] {
    LoadResult r = load(main, Environment{});
    INFO(dump(r));
    CHECK(r.problems.empty());
    CHECK(r.config);
  };
  SECTION("overlapping lists") {
    dir.write("models.d/a.toml", model_with("first", "gpu_ids = [0, 1, 2, 3]\n"));
    dir.write("models.d/b.toml", model_with("second", "gpu_ids = [3, 4]\n"));
    loads_cleanly();
  }
  SECTION("an all-GPU model and a list") {
    dir.write("models.d/a.toml", model_with("first", "gpus = 8\n"));
    dir.write("models.d/b.toml", model_with("second", "gpu_ids = [4, 5, 6, 7]\n"));
    loads_cleanly();
  }
  SECTION("models without gpu_ids, as every configuration before gpu_ids") {
    dir.write("models.d/a.toml", model_with("first", ""));
    dir.write("models.d/b.toml", model_with("second", "port = 8000\n"));
    dir.write("models.d/c.toml", model_with("third", "environment = { CUDA_VISIBLE_DEVICES = \"1\" }\n"));
    loads_cleanly();
  }
  SECTION("disjoint lists on different ports") {
    dir.write("models.d/a.toml", model_with("first", "gpu_ids = [0, 1, 2, 3]\n"));
    dir.write("models.d/b.toml", model_with("second", "gpu_ids = [4, 5, 6, 7]\nport = 8001\n"));
    dir.write("models.d/c.toml", model_with("cpu", "gpu_ids = []\nport = 8002\n"));
    loads_cleanly();
  }
}

TEST_CASE("gpu_sets_overlap: every GPU overlaps any set but the empty one and lists overlap on a shared index") {
  const GpuSet all;
  const GpuSet none = std::vector<unsigned>{};
  const GpuSet low = std::vector<unsigned>{0, 1, 2, 3};
  const GpuSet high = std::vector<unsigned>{7, 6, 5, 4};
  const GpuSet three = std::vector<unsigned>{3};
  CHECK(gpu_sets_overlap(all, all));
  CHECK(gpu_sets_overlap(all, low));
  CHECK(gpu_sets_overlap(high, all));
  CHECK_FALSE(gpu_sets_overlap(all, none));
  CHECK_FALSE(gpu_sets_overlap(none, all));
  CHECK_FALSE(gpu_sets_overlap(none, none));
  CHECK_FALSE(gpu_sets_overlap(low, high));
  CHECK(gpu_sets_overlap(low, three));
  CHECK(gpu_sets_overlap(three, low));
  CHECK_FALSE(gpu_sets_overlap(three, high));
}

TEST_CASE("the shipped model examples load together once renamed: MiniMax on GPUs 0-3 beside Qwen on 4-7 and Kimi on all") {
  TempDir dir;
  const fs::path config = fs::path(MODELD_SOURCE_DIR) / "config";
  fs::copy_file(config / "modeld.toml", dir.path / "modeld.toml");
  fs::create_directories(dir.path / "models.d");
  std::size_t copied = 0;
  for (const auto& entry : fs::directory_iterator(config / "models.d")) {
    std::string name = entry.path().filename().string();
    if (name.ends_with(".toml.example"))
      name.resize(name.size() - std::string_view(".example").size());
    else if (!name.ends_with(".toml"))
      continue;
    fs::copy_file(entry.path(), dir.path / "models.d" / name);
    ++copied;
  }
  LoadResult r = load(dir.path / "modeld.toml", Environment{});
  INFO(dump(r));
  REQUIRE(r.problems.empty());
  REQUIRE(r.config);
  CHECK(r.config->models.size() == copied);
  CHECK(copied == 3);

  const ModelConfig* kimi = r.config->find_model("kimi-k2-5");
  REQUIRE(kimi != nullptr);
  CHECK_FALSE(kimi->serve.gpu_ids.has_value());
  CHECK(kimi->serve.gpus == 8);

  const ModelConfig* minimax = r.config->find_model("minimax-m2-5");
  REQUIRE(minimax != nullptr);
  CHECK(minimax->serve.gpu_ids == std::optional<std::vector<unsigned>>({0, 1, 2, 3}));
  CHECK(minimax->serve.gpus == 4);

  const ModelConfig* qwen = r.config->find_model("qwen3-235b");
  REQUIRE(qwen != nullptr);
  CHECK(qwen->serve.gpu_ids == std::optional<std::vector<unsigned>>({4, 5, 6, 7}));
  CHECK(qwen->serve.gpus == 4);
  CHECK(qwen->serve.port != minimax->serve.port);
  CHECK_FALSE(gpu_sets_overlap(qwen->serve.gpu_ids, minimax->serve.gpu_ids));
  CHECK(gpu_sets_overlap(kimi->serve.gpu_ids, qwen->serve.gpu_ids));
}

// -- serve.engine and serve.drain_timeout (interface.md "The engine: serve.engine", "Draining").

namespace {

// A model whose serve table runs `command` (a TOML array) and ends with `extra` lines.
std::string engine_model(std::string_view command, std::string_view extra) {
  return fmt::format("[models.m]\nrepo = \"org/m\"\n\n[models.m.serve]\ncommand = {}\n{}", command, extra);
}

}  // namespace

TEST_CASE("serve.engine is generic by default, names a known engine, and any other value is a problem at its line") {
  TempDir dir;
  SECTION("the default: no warning for a command of no known engine") {
    LoadResult r = load(dir.write("modeld.toml", std::string(kMinimalModel)), Environment{});
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.engine == "generic");
    CHECK(r.config->models.at("m").serve.drain_timeout == 0ms);
    CHECK(r.warnings.empty());
  }
  SECTION("vllm with a vllm command") {
    LoadResult r = load(dir.write("modeld.toml", engine_model(R"(["vllm", "serve", "{model_dir}"])",
                                                              "engine = \"vllm\"\ndrain_timeout = \"30s\"\n")),
                        Environment{});
    INFO(dump(r));
    REQUIRE(r.config);
    CHECK(r.config->models.at("m").serve.engine == "vllm");
    CHECK(r.config->models.at("m").serve.drain_timeout == 30s);
    CHECK(r.warnings.empty());
  }
  SECTION("another value") {
    LoadResult r = load(dir.write("modeld.toml", std::string(kMinimalModel) + "engine = \"tgi\"\n"), Environment{});
    const Problem* p = find_problem(r, "models.m.serve.engine must be \"generic\", \"vllm\" or \"sglang\", got \"tgi\"");
    REQUIRE(p != nullptr);
    CHECK(p->line == 6);
    CHECK_FALSE(r.config);
  }
  SECTION("a drain_timeout that is no duration") {
    LoadResult r = load(dir.write("modeld.toml", std::string(kMinimalModel) + "drain_timeout = \"soon\"\n"),
                        Environment{});
    REQUIRE_FALSE(r.problems.empty());
    CHECK(r.problems.front().line == 6);
    CHECK(r.problems.front().message.find("models.m.serve.drain_timeout") != std::string::npos);
  }
}

TEST_CASE("a configuration warns, without refusing, where serve.engine and serve.command disagree") {
  TempDir dir;
  SECTION("engine vllm, a command that is not vllm: at the engine key") {
    LoadResult r = load(dir.write("modeld.toml", std::string(kMinimalModel) + "engine = \"vllm\"\n"), Environment{});
    REQUIRE(r.config);
    REQUIRE(r.warnings.size() == 1);
    CHECK(r.warnings[0].line == 6);
    CHECK(r.warnings[0].message.find("models.m.serve.engine is \"vllm\" but models.m.serve.command does not run it") ==
          0);
  }
  SECTION("engine generic (the default), a command that is sglang: at the command") {
    LoadResult r = load(dir.write("modeld.toml", engine_model(R"(["python3", "-m", "sglang.launch_server"])", "")),
                        Environment{});
    REQUIRE(r.config);
    REQUIRE(r.warnings.size() == 1);
    CHECK(r.warnings[0].line == 5);
    CHECK(r.warnings[0].message.find("engine = \"sglang\" would give it an engine-aware switch") != std::string::npos);
  }
}

TEST_CASE("vLLM's --shutdown-timeout in the command is checked against serve.drain_timeout") {
  TempDir dir;
  auto load_with = [&](std::string_view command, std::string_view drain) {
    return load(dir.write("modeld.toml", engine_model(command, fmt::format("engine = \"vllm\"\ndrain_timeout = \"{}\"\n",
                                                                           drain))),
                Environment{});
  };
  SECTION("equal: no warning") {
    LoadResult r = load_with(R"(["vllm", "serve", "x", "--shutdown-timeout", "30"])", "30s");
    REQUIRE(r.config);
    CHECK(r.warnings.empty());
  }
  SECTION("different: a warning at the command") {
    LoadResult r = load_with(R"(["vllm", "serve", "x", "--shutdown-timeout=10"])", "30s");
    REQUIRE(r.config);
    REQUIRE(r.warnings.size() == 1);
    CHECK(r.warnings[0].line == 5);
    CHECK(r.warnings[0].message.find("models.m.serve.command sets --shutdown-timeout 10 but "
                                     "models.m.serve.drain_timeout is 30 s") == 0);
  }
  SECTION("no drain_timeout: the command's flag is the user's own") {
    LoadResult r = load_with(R"(["vllm", "serve", "x", "--shutdown-timeout", "10"])", "0s");
    REQUIRE(r.config);
    CHECK(r.warnings.empty());
  }
}
