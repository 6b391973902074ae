// SGLang as modeld knows it (interface.md "The engine: serve.engine").
//
// Programs: its server module run by Python (python/sglang/launch_server.py), or the `sglang`
// console script's `serve` subcommand of newer releases.
// Drain: none to set; SGLang drains the requests in flight on SIGTERM by default (issue 27; not
// yet checked against SGLang's source at a pinned version), so its drain is bounded only by
// serve.drain_timeout, after which the rest of its control group is killed.
#include "engine/engine.hpp"

namespace modeld::engine {

namespace {

bool runs_sglang(const std::vector<std::string>& argv) {
  return runs_module(argv, "sglang.launch_server") || runs_program(argv, "sglang", "serve");
}

}  // namespace

const Adapter& sglang() {
  static const Adapter a{"sglang", "`python -m sglang.launch_server ...` or `sglang serve ...`", &runs_sglang, ""};
  return a;
}

}  // namespace modeld::engine
