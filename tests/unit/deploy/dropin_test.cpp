#include "deploy/phases.hpp"

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
  auto text = deploy::render_dropin(m, "/var/lib/modeld/models/kimi-k2-5");
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
  auto text = deploy::render_dropin(m, "/srv/models 100%/m");
  CHECK(text.find("WorkingDirectory=/srv/models 100%%/m\n") != std::string::npos);
}
