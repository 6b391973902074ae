#include "verify/index.hpp"

#include <catch2/catch.hpp>

using namespace modeld;

TEST_CASE("a safetensors index groups its tensors by shard, relative to the index's folder") {
  auto top = verify::parse_safetensors_index(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors",
                                                "c": "s1.safetensors"}})",
                                             "model.safetensors.index.json");
  REQUIRE(top.has_value());
  CHECK(*top == verify::ShardTensors{{"s1.safetensors", {"a", "c"}}, {"s2.safetensors", {"b"}}});
  auto sub = verify::parse_safetensors_index(R"({"weight_map": {"x": "a.safetensors"}})",
                                             "sub/model.safetensors.index.json");
  REQUIRE(sub.has_value());
  CHECK(*sub == verify::ShardTensors{{"sub/a.safetensors", {"x"}}});
}

TEST_CASE("a safetensors index that is not JSON or has no weight_map object is safetensors_invalid naming it") {
  for (const char* text : {"{\"weight_map\": ", "[]", "{}", "{\"weight_map\": []}"}) {
    INFO(text);
    auto r = verify::parse_safetensors_index(text, "model.safetensors.index.json");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::safetensors_invalid);
    CHECK_THAT(r.error().message, Catch::StartsWith("model.safetensors.index.json: "));
  }
}

TEST_CASE("a weight_map entry whose shard is not a string is refused naming the index and the tensor") {
  std::string tensor;
  auto r = verify::parse_safetensors_index(R"({"weight_map": {"a": "s1.safetensors", "model.norm.weight": 7}})",
                                           "model.safetensors.index.json", &tensor);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK(r.error().message == "model.safetensors.index.json: tensor 'model.norm.weight': shard is not a string");
  CHECK(tensor == "model.norm.weight");
}
