// vLLM as modeld knows it (interface.md "The engine: serve.engine").
//
// Programs: the `vllm` console script's `serve` subcommand, or the OpenAI-compatible server
// module run by Python (vllm/entrypoints/openai/api_server.py).
// Drain: vLLM's engine argument --shutdown-timeout, "Shutdown timeout in seconds. 0 = abort,
// >0 = wait", default 0 (EngineArgs, docs.vllm.ai/en/latest/configuration/engine_args/, read
// 2026-12-03; drain on SIGTERM landed in vllm-project/vllm PR #36666 after #34730 was reverted).
// Without it, a SIGTERM aborts the requests in flight. The version was not pinned to a commit:
// the snapshot of vllm-project/vllm was too large to fetch here.
#include "engine/engine.hpp"

namespace modeld::engine {

namespace {

bool runs_vllm(const std::vector<std::string>& argv) {
  return runs_program(argv, "vllm", "serve") || runs_module(argv, "vllm.entrypoints.openai.api_server") ||
         runs_module(argv, "vllm.entrypoints.cli.main");
}

}  // namespace

const Adapter& vllm() {
  static const Adapter a{"vllm", "`vllm serve ...` or `python -m vllm.entrypoints.openai.api_server ...`", &runs_vllm,
                         "--shutdown-timeout"};
  return a;
}

}  // namespace modeld::engine
