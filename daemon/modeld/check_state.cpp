#include "modeld/check_state.hpp"

#include "deploy/state_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

namespace modeld {

namespace {

// "state.json: valid, 2 services in service: a (commit 0123456789ab), b (...)" or why it is not.
bool describe(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fmt::print("{}: absent\n", path.string());
    return false;
  }
  auto st = deploy::StateStore::read_state_file(path);
  if (!st) {
    fmt::print("{}: INVALID: {}\n", path.string(), st.error().message);
    return false;
  }
  std::vector<std::string> names;
  for (const auto& a : st->active.services) names.push_back(fmt::format("{} (commit {})", a.model, a.commit.substr(0, 12)));
  fmt::print("{}: valid, {} in service{}{}\n", path.string(), names.empty() ? "nothing" : std::to_string(names.size()),
             names.empty() ? "" : ": ", fmt::join(names, ", "));
  return true;
}

}  // namespace

int check_state(const std::filesystem::path& state_dir) {
  std::error_code ec;
  const auto current = state_dir / "state.json", previous = state_dir / "state.json.prev";
  const bool current_ok = describe(current);
  const bool previous_ok = describe(previous);
  const bool current_absent = !std::filesystem::exists(current, ec);
  if (current_ok)
    fmt::print("the next start uses {}\n", current.string());
  else if (previous_ok)
    fmt::print("the next start falls back to {} (keeping {} as state.json.bad) and adopts the model services that "
               "run that it does not list\n",
               previous.string(), current.string());
  else if (current_absent && !std::filesystem::exists(previous, ec))
    fmt::print("no state yet: the next start adopts the model services that run (a first start has none)\n");
  else
    fmt::print("the next start rebuilds the state from the model services that run and the store (pulled marks and "
               "last-active times are lost)\n");
  std::size_t bad = 0;
  for (const auto& e : std::filesystem::directory_iterator(state_dir / "deployments", ec)) {
    if (e.path().extension() != ".json") continue;
    if (auto d = deploy::read_deployment_file(e.path()); !d) {
      fmt::print("{}: INVALID, left out of the history: {}\n", e.path().string(), d.error().message);
      ++bad;
    }
  }
  if (!bad) fmt::print("{}: every deployment record reads\n", (state_dir / "deployments").string());
  return current_ok || (current_absent && !std::filesystem::exists(previous, ec)) ? 0 : 1;
}

}  // namespace modeld
