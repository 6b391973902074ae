#include "engine/engine.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace modeld;
using argv_t = std::vector<std::string>;

TEST_CASE("each engine is found by its serve.engine name, and no other name") {
  CHECK(engine::find("generic") == &engine::generic());
  CHECK(engine::find("vllm") == &engine::vllm());
  CHECK(engine::find("sglang") == &engine::sglang());
  CHECK(engine::find("VLLM") == nullptr);
  CHECK(engine::find("") == nullptr);
}

TEST_CASE("the engine a command runs is recognised by its program or its Python module") {
  CHECK(engine::recognise(argv_t{"vllm", "serve", "{model_dir}"}) == &engine::vllm());
  CHECK(engine::recognise(argv_t{"/opt/vllm/bin/vllm", "serve", "{model_dir}"}) == &engine::vllm());
  CHECK(engine::recognise(argv_t{"python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "x"}) ==
        &engine::vllm());
  CHECK(engine::recognise(argv_t{"uv", "run", "vllm", "serve", "x"}) == &engine::vllm());
  CHECK(engine::recognise(argv_t{"python", "-m", "sglang.launch_server", "--model-path", "x"}) == &engine::sglang());
  CHECK(engine::recognise(argv_t{"python", "-msglang.launch_server"}) == &engine::sglang());
  CHECK(engine::recognise(argv_t{"sglang", "serve", "--model-path", "x"}) == &engine::sglang());
  SECTION("not a known engine") {
    CHECK(engine::recognise(argv_t{"vllm", "bench", "x"}) == nullptr);
    CHECK(engine::recognise(argv_t{"python3", "/srv/stand_in.py", "--port", "8000"}) == nullptr);
    CHECK(engine::recognise(argv_t{"python3", "-m", "vllm_stand_in"}) == nullptr);
    CHECK(engine::recognise(argv_t{"llama-server", "-m", "model.gguf"}) == nullptr);
  }
}

TEST_CASE("serve.engine and serve.command disagree where the command runs another engine or none") {
  const std::string prefix = "models.m.serve";
  SECTION("they agree") {
    CHECK_FALSE(engine::disagreement(engine::vllm(), argv_t{"vllm", "serve", "x"}, prefix));
    CHECK_FALSE(engine::disagreement(engine::sglang(), argv_t{"python", "-m", "sglang.launch_server"}, prefix));
    CHECK_FALSE(engine::disagreement(engine::generic(), argv_t{"llama-server", "-m", "x"}, prefix));
  }
  SECTION("vllm named, not run") {
    auto why = engine::disagreement(engine::vllm(), argv_t{"llama-server", "-m", "x"}, prefix);
    REQUIRE(why);
    CHECK(*why ==
          "models.m.serve.engine is \"vllm\" but models.m.serve.command does not run it (vllm is `vllm serve ...` or "
          "`python -m vllm.entrypoints.openai.api_server ...`); what modeld knows of vllm may not apply to it");
  }
  SECTION("sglang named, vllm run") {
    auto why = engine::disagreement(engine::sglang(), argv_t{"vllm", "serve", "x"}, prefix);
    REQUIRE(why);
    CHECK(why->find("models.m.serve.command runs vllm instead") != std::string::npos);
  }
  SECTION("generic, with a command that runs vllm") {
    auto why = engine::disagreement(engine::generic(), argv_t{"vllm", "serve", "x"}, prefix);
    REQUIRE(why);
    CHECK(why->find("models.m.serve.command runs vllm") == 0);
    CHECK(why->find("engine = \"vllm\" would give it an engine-aware switch") != std::string::npos);
  }
}

TEST_CASE("a flag's value is read as argparse takes it: separate or after '=', the last one winning") {
  CHECK(engine::flag_value(argv_t{"vllm", "serve", "--shutdown-timeout", "30"}, "--shutdown-timeout") == "30");
  CHECK(engine::flag_value(argv_t{"vllm", "--shutdown-timeout=30", "x"}, "--shutdown-timeout") == "30");
  CHECK(engine::flag_value(argv_t{"--shutdown-timeout=5", "--shutdown-timeout", "9"}, "--shutdown-timeout") == "9");
  CHECK(engine::flag_value(argv_t{"x", "--shutdown-timeout"}, "--shutdown-timeout") == "");
  CHECK_FALSE(engine::flag_value(argv_t{"vllm", "--shutdown-timeouts=3"}, "--shutdown-timeout"));
  CHECK_FALSE(engine::flag_value(argv_t{"vllm", "serve"}, "--shutdown-timeout"));
}

TEST_CASE("vllm's drain flag is --shutdown-timeout, generic and sglang have none") {
  CHECK(engine::vllm().drain_flag == "--shutdown-timeout");
  CHECK(engine::generic().drain_flag.empty());
  CHECK(engine::sglang().drain_flag.empty());
}
