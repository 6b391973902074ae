#pragma once
// What modeld knows of each inference engine that serve.engine names (interface.md "The engine:
// serve.engine"): the programs its command runs and the flag that bounds its drain on SIGTERM.
// One adapter per engine, each in its own file (generic.cpp, vllm.cpp, sglang.cpp); pure.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::engine {

/// One engine as modeld knows it.
struct Adapter {
  std::string_view name;  ///< as serve.engine writes it: "generic", "vllm", "sglang"
  /// How its command starts, for messages ("`vllm serve ...` or `python -m vllm.entrypoints...`").
  std::string_view programs;
  /// Whether `argv` (a serve.command, placeholders or not) runs this engine; generic: never.
  bool (*runs)(const std::vector<std::string>& argv);
  /// The command-line flag that bounds how long the server drains on SIGTERM, in whole seconds;
  /// empty when modeld knows none (the engine drains on its own, or not at all).
  std::string_view drain_flag;
};

/// The generic engine: any server; modeld knows nothing of it (today's behaviour).
const Adapter& generic();
/// vLLM (vllm.cpp).
const Adapter& vllm();
/// SGLang (sglang.cpp).
const Adapter& sglang();

/// The adapter serve.engine = `name` names; nullptr for an unknown name.
const Adapter* find(std::string_view name);

/// The engine other than generic whose program `argv` runs; nullptr when none is recognised.
const Adapter* recognise(const std::vector<std::string>& argv);

/// Why serve.engine = `engine.name` and `argv` disagree, for a configuration warning naming
/// `prefix` ("models.NAME.serve"): an engine whose program the command does not run, or generic
/// with a command that runs a known engine (serve.engine would give it an engine-aware switch);
/// nullopt when they agree.
std::optional<std::string> disagreement(const Adapter& engine, const std::vector<std::string>& argv,
                                        std::string_view prefix);

/// The value of `flag` in `argv`, written "--flag VALUE" or "--flag=VALUE" (the last one written
/// wins, as argparse takes it); nullopt when it is not there; an empty string for a flag last.
std::optional<std::string> flag_value(const std::vector<std::string>& argv, std::string_view flag);

/// Whether some argument of `argv`, by its last path component, is `program` followed by `sub`
/// (empty `sub`: by itself), e.g. "/opt/venv/bin/vllm" "serve".
bool runs_program(const std::vector<std::string>& argv, std::string_view program, std::string_view sub);

/// Whether `argv` holds "-m MODULE" (or "-mMODULE") with MODULE equal to `module`.
bool runs_module(const std::vector<std::string>& argv, std::string_view module);

}  // namespace modeld::engine
