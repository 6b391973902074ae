// Never restarting what serves: the started settings (what changes the server, rendered by the
// code that writes the drop-in) and the comparison of a planned deployment with the model in
// service.

#include "deploy/launch.hpp"
#include "deploy/redeploy.hpp"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

using namespace modeld;
using deploy::Redeploy;

namespace {

config::ModelConfig kimi() {
  config::ModelConfig m;
  m.name = "kimi";
  m.repo = "moonshotai/Kimi-K2.5";
  m.serve.command = {"vllm", "serve", "{model_dir}", "--port", "{port}"};
  m.serve.port = 8001;
  m.serve.environment = {{"VLLM_X", "1"}, {"HF_TOKEN_FILE", "secret-value"}};
  m.serve.gpus = 8;
  return m;
}

const std::string kCommit(40, 'a');

deploy::Deployment planned(const std::string& model, const std::string& commit) {
  deploy::Deployment d;
  d.model = model;
  d.commit = commit;
  return d;
}

}  // namespace

TEST_CASE("the drop-in is written from the started settings, so the two never disagree") {
  const auto m = kimi();
  const auto s = deploy::started_settings(m, "/models/kimi");
  CHECK(s.command == std::vector<std::string>{"vllm", "serve", "/models/kimi", "--port", "8001"});
  CHECK(s.working_directory == "/models/kimi");
  CHECK(s.gpus == 8);
  CHECK(deploy::render_dropin(m, "/models/kimi", {}) == deploy::render_dropin(m, s, {}));
  // A drop-in from recorded settings carries them, not what the configuration says today.
  auto old = s;
  old.environment = {{"OLD_ONLY", "7"}};
  const auto text = deploy::render_dropin(m, old, {});
  CHECK(text.find("Environment=\"OLD_ONLY=7\"") != std::string::npos);
  CHECK(text.find("VLLM_X") == std::string::npos);
}

TEST_CASE("stop_timeout and the configuration file are no started settings") {
  auto a = kimi(), b = kimi();
  b.serve.stop_timeout = std::chrono::minutes(17);
  b.source_file = "/etc/modeld/models.d/other.toml";
  b.serve.startup_timeout = std::chrono::minutes(3);
  CHECK(deploy::started_settings(a, "/m/kimi") == deploy::started_settings(b, "/m/kimi"));
  CHECK(deploy::settings_changed(deploy::started_settings(a, "/m/kimi"), deploy::started_settings(b, "/m/kimi")).empty());
}

TEST_CASE("what changed names the settings and the variables, never a variable's value") {
  auto a = kimi(), b = kimi();
  b.serve.environment["HF_TOKEN_FILE"] = "other-secret";
  b.serve.environment.erase("VLLM_X");
  b.serve.environment["CUDA_VISIBLE_DEVICES"] = "0,1";
  b.serve.command.push_back("--enforce-eager");
  b.serve.gpus = 2;
  const auto was = deploy::started_settings(a, "/m/kimi"), now = deploy::started_settings(b, "/m/kimi");
  CHECK_FALSE(was == now);
  const auto changed = deploy::settings_changed(was, now);
  REQUIRE(changed.size() == 3);
  CHECK(changed[0] == "command changed");
  CHECK(changed[1] == "environment changed (CUDA_VISIBLE_DEVICES, HF_TOKEN_FILE, VLLM_X)");
  CHECK(changed[2] == "GPUs changed (8 -> 2)");
  for (const auto& c : changed) {
    CHECK(c.find("secret") == std::string::npos);
    CHECK(c.find("0,1") == std::string::npos);
  }
}

TEST_CASE("started settings read back what they wrote") {
  const auto s = deploy::started_settings(kimi(), "/m/kimi");
  auto back = deploy::started_settings_from_json(deploy::to_json(s));
  REQUIRE(back.has_value());
  CHECK(*back == s);
  CHECK_FALSE(deploy::started_settings_from_json(nlohmann::json{{"command", 3}}).has_value());
}

TEST_CASE("a redeploy of the model that serves that commit with the same settings is a no-op") {
  const auto now = deploy::started_settings(kimi(), "/m/kimi");
  deploy::ActiveRecord active{"kimi", kCommit, "2026-01-01T00:00:00Z", now};
  CHECK(deploy::compare_with_serving(planned("kimi", kCommit), active, now).verdict == Redeploy::noop);
}

TEST_CASE("another model, another commit or nothing serving is no redeploy") {
  const auto now = deploy::started_settings(kimi(), "/m/kimi");
  deploy::ActiveRecord active{"kimi", kCommit, "2026-01-01T00:00:00Z", now};
  CHECK(deploy::compare_with_serving(planned("other", kCommit), active, now).verdict == Redeploy::not_serving);
  CHECK(deploy::compare_with_serving(planned("kimi", std::string(40, 'b')), active, now).verdict ==
        Redeploy::not_serving);
  CHECK(deploy::compare_with_serving(planned("kimi", kCommit), std::nullopt, now).verdict == Redeploy::not_serving);
}

TEST_CASE("changed settings, unknown ones or a restart asked for restart the model that serves") {
  const auto now = deploy::started_settings(kimi(), "/m/kimi");
  auto other = kimi();
  other.serve.environment["VLLM_X"] = "2";
  deploy::ActiveRecord active{"kimi", kCommit, "2026-01-01T00:00:00Z",
                              deploy::started_settings(other, "/m/kimi")};
  auto c = deploy::compare_with_serving(planned("kimi", kCommit), active, now);
  CHECK(c.verdict == Redeploy::settings_changed);
  CHECK(c.why == "environment changed (VLLM_X)");

  active.started.reset();  // a state.json from before the settings were kept
  c = deploy::compare_with_serving(planned("kimi", kCommit), active, now);
  CHECK(c.verdict == Redeploy::settings_changed);
  CHECK_THAT(c.why, Catch::Contains("not recorded"));

  active.started = now;
  auto d = planned("kimi", kCommit);
  d.restart = true;
  c = deploy::compare_with_serving(d, active, now);
  CHECK(c.verdict == Redeploy::restart_requested);
  CHECK(c.why == "restart requested");
}
