// The generic engine: any inference server; modeld knows no program or flag of it, and a stop
// is what it always was (interface.md "The engine: serve.engine").
#include "engine/engine.hpp"

namespace modeld::engine {

namespace {

bool runs_nothing_known(const std::vector<std::string>&) { return false; }

}  // namespace

const Adapter& generic() {
  static const Adapter a{"generic", "any server", &runs_nothing_known, ""};
  return a;
}

}  // namespace modeld::engine
