#include "deploy/launch.hpp"

#include <catch2/catch.hpp>

using namespace modeld;

TEST_CASE("the drop-in fills the command's placeholders and quotes for systemd") {
  config::ModelConfig m;
  m.name = "kimi-k2-5";
  m.repo = "moonshotai/Kimi-K2.5";
  m.serve.command = {"vllm", "serve", "{model_dir}", "--served-model-name", "{served_name}", "--port", "{port}",
                     "--chat-template", "100% \"quoted\" $HOME"};
  m.serve.served_name = "kimi-k2.5";
  m.serve.port = 8001;
  m.serve.environment = {{"NCCL_DEBUG", "WARN"}, {"PROMPT_PREFIX", "cost: $5"}};
  m.serve.stop_timeout = std::chrono::minutes(5);
  auto text = deploy::render_dropin(m, "/var/lib/modeld/models/kimi-k2-5", {});
  CHECK(text.find("ExecStart=\nExecStart=\"vllm\" \"serve\" \"/var/lib/modeld/models/kimi-k2-5\" "
                  "\"--served-model-name\" \"kimi-k2.5\" \"--port\" \"8001\"") != std::string::npos);
  CHECK(text.find(R"("100%% \"quoted\" $$HOME")") != std::string::npos);
  CHECK(text.find("Environment=\"NCCL_DEBUG=WARN\"") != std::string::npos);
  // systemd expands no variables in Environment=: a '$' stays single there.
  CHECK(text.find("Environment=\"PROMPT_PREFIX=cost: $5\"") != std::string::npos);
  CHECK(text.find("TimeoutStopSec=300s") != std::string::npos);
  CHECK(text.find("TimeoutStartSec=infinity") != std::string::npos);
  CHECK(text.find("WorkingDirectory=/var/lib/modeld/models/kimi-k2-5\n") != std::string::npos);
}

TEST_CASE("the working directory is written unquoted with percent signs escaped") {
  config::ModelConfig m;
  m.name = "m";
  m.serve.command = {"srv"};
  auto text = deploy::render_dropin(m, "/srv/models 100%/m", {});
  CHECK(text.find("WorkingDirectory=/srv/models 100%%/m\n") != std::string::npos);
}

namespace {

config::ModelConfig on_gpus(std::optional<std::vector<unsigned>> ids) {
  config::ModelConfig m;
  m.name = "minimax";
  m.serve.command = {"vllm", "serve", "{model_dir}"};
  m.serve.environment = {{"NCCL_DEBUG", "WARN"}};
  m.serve.gpu_ids = std::move(ids);
  return m;
}

// The Environment= lines of a drop-in, in order.
std::vector<std::string> environment_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while ((pos = text.find("Environment=", pos)) != std::string::npos) {
    const auto end = text.find('\n', pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

}  // namespace

TEST_CASE("with gpu_ids the drop-in names the GPUs by UUID in gpu_ids' order, in PCI bus order") {
  const auto m = on_gpus(std::vector<unsigned>{6, 4});
  const auto text = deploy::render_dropin(m, "/m/minimax", {"GPU-6666", "GPU-4444"});
  CHECK(environment_lines(text) == std::vector<std::string>{"Environment=\"CUDA_DEVICE_ORDER=PCI_BUS_ID\"",
                                                            "Environment=\"NCCL_DEBUG=WARN\"",
                                                            "Environment=\"CUDA_VISIBLE_DEVICES=GPU-6666,GPU-4444\""});
  // What the service started with keeps the indices, never the UUIDs.
  const auto started = deploy::started_settings(m, "/m/minimax");
  CHECK(started.gpu_ids == std::optional<std::vector<unsigned>>(std::vector<unsigned>{6, 4}));
  CHECK_FALSE(started.environment.contains("CUDA_VISIBLE_DEVICES"));
  CHECK(text == deploy::render_dropin(m, started, {"GPU-6666", "GPU-4444"}));
}

TEST_CASE("gpu_ids = [] hides every GPU with an empty CUDA_VISIBLE_DEVICES") {
  const auto text = deploy::render_dropin(on_gpus(std::vector<unsigned>{}), "/m/minimax", {});
  CHECK(environment_lines(text) == std::vector<std::string>{"Environment=\"CUDA_DEVICE_ORDER=PCI_BUS_ID\"",
                                                            "Environment=\"NCCL_DEBUG=WARN\"",
                                                            "Environment=\"CUDA_VISIBLE_DEVICES=\""});
}

TEST_CASE("without gpu_ids the drop-in sets no CUDA variable and leaves a hand-written one alone") {
  auto m = on_gpus(std::nullopt);
  m.serve.environment["CUDA_VISIBLE_DEVICES"] = "0,1";
  const auto text = deploy::render_dropin(m, "/m/minimax", {"GPU-ignored"});
  CHECK(environment_lines(text) == std::vector<std::string>{"Environment=\"CUDA_VISIBLE_DEVICES=0,1\"",
                                                            "Environment=\"NCCL_DEBUG=WARN\""});
}

TEST_CASE("a configured CUDA_DEVICE_ORDER comes after modeld's, so systemd lets it win") {
  auto m = on_gpus(std::vector<unsigned>{0});
  m.serve.environment["CUDA_DEVICE_ORDER"] = "FASTEST_FIRST";
  const auto lines = environment_lines(deploy::render_dropin(m, "/m/minimax", {"GPU-0"}));
  REQUIRE(lines.size() == 4);
  CHECK(lines.front() == "Environment=\"CUDA_DEVICE_ORDER=PCI_BUS_ID\"");
  CHECK(lines[1] == "Environment=\"CUDA_DEVICE_ORDER=FASTEST_FIRST\"");
  CHECK(lines.back() == "Environment=\"CUDA_VISIBLE_DEVICES=GPU-0\"");
}

// -- serve.drain_timeout (interface.md "Draining before a stop").

namespace {

config::ModelConfig vllm_model(std::vector<std::string> command) {
  config::ModelConfig m;
  m.name = "m";
  m.repo = "org/m";
  m.serve.command = std::move(command);
  m.serve.stop_timeout = std::chrono::minutes(5);
  return m;
}

}  // namespace

TEST_CASE("without a drain the drop-in keeps the template's KillMode and the stop timeout alone") {
  auto m = vllm_model({"vllm", "serve", "{model_dir}"});
  m.serve.engine = "vllm";
  const auto text = deploy::render_dropin(m, "/models/m", {});
  CHECK(text.find("KillMode") == std::string::npos);
  CHECK(text.find("TimeoutStopSec=300s\n") != std::string::npos);
  CHECK(deploy::started_settings(m, "/models/m").command == std::vector<std::string>{"vllm", "serve", "/models/m"});
}

TEST_CASE("with a drain the drop-in sets KillMode=mixed and a stop timeout covering drain and stop") {
  auto m = vllm_model({"server", "{model_dir}"});
  m.serve.drain_timeout = std::chrono::seconds(30);
  const auto text = deploy::render_dropin(m, "/models/m", {});
  CHECK(text.find("KillMode=mixed\nTimeoutStopSec=330s\n") != std::string::npos);
  SECTION("generic: the command is as written") {
    CHECK(deploy::started_settings(m, "/models/m").command == std::vector<std::string>{"server", "/models/m"});
  }
}

TEST_CASE("for vllm a drain adds --shutdown-timeout unless the command sets it") {
  auto m = vllm_model({"vllm", "serve", "{model_dir}"});
  m.serve.engine = "vllm";
  m.serve.drain_timeout = std::chrono::milliseconds(29'500);  // whole seconds, rounded up
  CHECK(deploy::started_settings(m, "/models/m").command ==
        std::vector<std::string>{"vllm", "serve", "/models/m", "--shutdown-timeout", "30"});
  CHECK(deploy::render_dropin(m, "/models/m", {}).find("\"--shutdown-timeout\" \"30\"\n") != std::string::npos);
  SECTION("written in the command: left as written") {
    m.serve.command.push_back("--shutdown-timeout=10");
    CHECK(deploy::started_settings(m, "/models/m").command ==
          std::vector<std::string>{"vllm", "serve", "/models/m", "--shutdown-timeout=10"});
  }
  SECTION("sglang has no drain flag") {
    m.serve.engine = "sglang";
    CHECK(deploy::started_settings(m, "/models/m").command == std::vector<std::string>{"vllm", "serve", "/models/m"});
  }
}
