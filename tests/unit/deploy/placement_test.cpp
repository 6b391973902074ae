// Which services may serve side by side: the conflict rule of "Several models on one host".
#include "deploy/placement.hpp"

#include <catch2/catch.hpp>

using namespace modeld;
using namespace modeld::deploy;

namespace {

config::ModelConfig model(const std::string& name, std::uint16_t port, config::GpuSet gpus) {
  config::ModelConfig m;
  m.name = name;
  m.serve.port = port;
  m.serve.gpu_ids = std::move(gpus);
  return m;
}

const config::GpuSet kLow = std::vector<unsigned>{0, 1, 2, 3};
const config::GpuSet kHigh = std::vector<unsigned>{4, 5, 6, 7};
const config::GpuSet kNone = std::vector<unsigned>{};
const config::GpuSet kAll = std::nullopt;

}  // namespace

TEST_CASE("models on disjoint GPUs and ports may serve together while overlapping GPUs or one port conflict") {
  CHECK_FALSE(conflict_between(placement_of(model("a", 8001, kLow)), placement_of(model("b", 8002, kHigh))));
  CHECK(conflict_between(placement_of(model("a", 8001, kLow)), placement_of(model("c", 8003, std::vector<unsigned>{3, 4})))
        == "both use GPU 3");
  CHECK(conflict_between(placement_of(model("a", 8001, kLow)), placement_of(model("b", 8001, kHigh))) ==
        "both use port 8001");
  CHECK(conflict_between(placement_of(model("a", 8001, kLow)), placement_of(model("a", 8009, kHigh))) ==
        "the same model");
}

TEST_CASE("a model on every GPU conflicts with every GPU model, not with one that uses no GPU") {
  CHECK(conflict_between(placement_of(model("k", 8000, kAll)), placement_of(model("a", 8001, kLow))));
  CHECK(conflict_between(placement_of(model("k", 8000, kAll)), placement_of(model("j", 8001, kAll))));
  CHECK_FALSE(conflict_between(placement_of(model("k", 8000, kAll)), placement_of(model("e", 8002, kNone))));
  CHECK(conflict_between(placement_of(model("k", 8000, kAll)), placement_of(model("e", 8000, kNone))));
  CHECK_FALSE(conflict_between(placement_of(model("e", 8002, kNone)), placement_of(model("f", 8003, kNone))));
}

TEST_CASE("a service's placement is what it was started with, not today's configuration") {
  const auto today = model("a", 9000, kHigh);
  ActiveRecord started{"a", std::string(40, 'a'), "", StartedSettings{{"srv"}, {}, "/m/a", 4, 8001, kLow}};
  const auto p = placement_of(started, &today);
  CHECK(p.port == 8001);
  CHECK(p.gpu_ids == kLow);
  // Recorded before ports were kept: the configuration's; not configured either: every GPU.
  ActiveRecord older{"a", std::string(40, 'a'), "", StartedSettings{{"srv"}, {}, "/m/a", 0}};
  CHECK(placement_of(older, &today).port == 9000);
  CHECK(placement_of(older, &today).gpu_ids == kHigh);
  CHECK(placement_of(older, nullptr).gpu_ids == kAll);
  CHECK(placement_of(older, nullptr).port == 0);
}

TEST_CASE("the services in conflict with a target come in the order they serve and the GPUs they free add up") {
  config::Config cfg;
  cfg.models["a"] = model("a", 8001, kLow);
  cfg.models["b"] = model("b", 8002, kHigh);
  std::vector<ActiveRecord> serving{{"a", std::string(40, 'a'), ""}, {"b", std::string(40, 'b'), ""}};
  auto c = conflicting(serving, placement_of(model("c", 8003, kLow)), cfg);
  REQUIRE(c.size() == 1);
  CHECK(c.front().model == "a");
  auto d = conflicting(serving, placement_of(model("d", 8004, kAll)), cfg);
  REQUIRE(d.size() == 2);
  CHECK(d[0].model == "a");
  CHECK(d[1].model == "b");
  CHECK(gpus_of({placement_of(cfg.models["b"]), placement_of(cfg.models["a"])}) ==
        config::GpuSet(std::vector<unsigned>{0, 1, 2, 3, 4, 5, 6, 7}));
  CHECK(gpus_of({placement_of(cfg.models["a"]), placement_of(model("k", 1, kAll))}) == kAll);
  CHECK(gpus_of({}) == kNone);
}
