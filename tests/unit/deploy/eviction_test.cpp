// Which models freeing_disk (and its dry run, modelctl plan) may evict, and in what order.

#include "deploy/free_disk.hpp"

#include <catch2/catch.hpp>

using namespace modeld;
using namespace modeld::deploy;

namespace {

config::Config config_with(std::initializer_list<std::pair<std::string, bool>> models) {
  config::Config c;
  for (const auto& [name, pinned] : models) {
    config::ModelConfig m;
    m.name = name;
    m.pinned = pinned;
    c.models.emplace(name, m);
  }
  return c;
}

std::vector<store::StoredModel> stored(std::initializer_list<std::pair<std::string, std::uint64_t>> models) {
  std::vector<store::StoredModel> out;
  for (const auto& [name, size] : models) out.push_back({name, std::nullopt, {"c"}, size});
  return out;
}

std::vector<std::string> names(const std::vector<store::EvictionCandidate>& c) {
  std::vector<std::string> out;
  for (const auto& x : c) out.push_back(x.name);
  return out;
}

}  // namespace

TEST_CASE("eviction candidates leave out the target, pinned models and the active model") {
  auto cfg = config_with({{"a", false}, {"b", true}, {"c", false}, {"target", false}});
  auto c = eviction_candidates(stored({{"a", 10}, {"b", 20}, {"c", 30}, {"target", 40}}), cfg, "target",
                               Serving{{"c"}, {"c"}}, {}, false);
  CHECK(names(c) == std::vector<std::string>{"a"});
}

TEST_CASE("with downtime allowed the active model is a candidate, always the last one") {
  auto cfg = config_with({{"a", false}, {"c", false}, {"old", false}});
  std::map<std::string, std::string> last{{"a", "2026-11-29T19:00:00Z"}, {"c", "2020-01-01T00:00:00Z"}};
  auto c = eviction_candidates(stored({{"a", 10}, {"c", 30}, {"old", 5}}), cfg, "target", Serving{{"c"}, {"c"}}, last,
                               true);
  REQUIRE(names(c) == std::vector<std::string>{"a", "old", "c"});
  auto plan = store::plan_disk(40, 0, 0, c);
  // Least recently active first ("old" never served), the active model only when still short.
  CHECK(names(plan.evict) == std::vector<std::string>{"old", "a", "c"});
  CHECK(plan.fits);
  auto enough = store::plan_disk(15, 0, 0, c);
  CHECK(names(enough.evict) == std::vector<std::string>{"old", "a"});
}

TEST_CASE("models on disk that are no longer configured may be evicted") {
  auto cfg = config_with({{"a", false}});
  auto c = eviction_candidates(stored({{"a", 10}, {"gone", 20}}), cfg, "a", Serving{}, {}, false);
  CHECK(names(c) == std::vector<std::string>{"gone"});
}

TEST_CASE("a model in service that the deployment does not stop is never a candidate, downtime allowed or not") {
  auto cfg = config_with({{"a", false}, {"b", false}, {"c", false}, {"target", false}});
  // "a" and "b" serve; the deployment of "target" stops only "a" (its GPUs overlap).
  const Serving serving{{"a", "b"}, {"a"}};
  auto without = eviction_candidates(stored({{"a", 10}, {"b", 20}, {"c", 30}}), cfg, "target", serving, {}, false);
  CHECK(names(without) == std::vector<std::string>{"c"});
  auto with = eviction_candidates(stored({{"a", 10}, {"b", 20}, {"c", 30}}), cfg, "target", serving, {}, true);
  CHECK(names(with) == std::vector<std::string>{"c", "a"});
}
