// The engines' common part: finding an adapter by name or by the command it runs, the warning
// where serve.engine and serve.command disagree, and reading a flag's value from a command.
#include "engine/engine.hpp"

#include <array>

namespace modeld::engine {

namespace {

// The last path component of `arg` ("/opt/venv/bin/vllm" -> "vllm").
std::string_view base_name(std::string_view arg) {
  const auto slash = arg.rfind('/');
  return slash == std::string_view::npos ? arg : arg.substr(slash + 1);
}

const std::array<const Adapter*, 3>& adapters() {
  static const std::array<const Adapter*, 3> all{&generic(), &vllm(), &sglang()};
  return all;
}

}  // namespace

const Adapter* find(std::string_view name) {
  for (const Adapter* a : adapters())
    if (a->name == name) return a;
  return nullptr;
}

const Adapter* recognise(const std::vector<std::string>& argv) {
  for (const Adapter* a : adapters())
    if (a->runs(argv)) return a;
  return nullptr;
}

std::optional<std::string> disagreement(const Adapter& engine, const std::vector<std::string>& argv,
                                        std::string_view prefix) {
  const Adapter* runs = recognise(argv);
  if (runs == &engine || (runs == nullptr && &engine == &generic())) return std::nullopt;
  if (&engine == &generic()) {
    return std::string(prefix) + ".command runs " + std::string(runs->name) + " (" + std::string(runs->programs) +
           ") but " + std::string(prefix) + ".engine is \"generic\": engine = \"" + std::string(runs->name) +
           "\" would give it an engine-aware switch (a drain bounded by its own flag)";
  }
  std::string what = runs == nullptr ? std::string("does not run it") : "runs " + std::string(runs->name) + " instead";
  return std::string(prefix) + ".engine is \"" + std::string(engine.name) + "\" but " + std::string(prefix) +
         ".command " + what + " (" + std::string(engine.name) + " is " + std::string(engine.programs) +
         "); what modeld knows of " + std::string(engine.name) + " may not apply to it";
}

std::optional<std::string> flag_value(const std::vector<std::string>& argv, std::string_view flag) {
  std::optional<std::string> found;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string_view arg = argv[i];
    if (arg == flag)
      found = i + 1 < argv.size() ? argv[i + 1] : std::string();
    else if (arg.size() > flag.size() && arg.starts_with(flag) && arg[flag.size()] == '=')
      found = std::string(arg.substr(flag.size() + 1));
  }
  return found;
}

bool runs_program(const std::vector<std::string>& argv, std::string_view program, std::string_view sub) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (base_name(argv[i]) != program) continue;
    if (sub.empty() || (i + 1 < argv.size() && argv[i + 1] == sub)) return true;
  }
  return false;
}

bool runs_module(const std::vector<std::string>& argv, std::string_view module) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-m" && i + 1 < argv.size() && argv[i + 1] == module) return true;
    if (arg.starts_with("-m") && arg.substr(2) == module) return true;
  }
  return false;
}

}  // namespace modeld::engine
