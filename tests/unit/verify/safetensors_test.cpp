#include "unit/verify/test_files.hpp"
#include "verify/verify.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

using namespace modeld;
using namespace modeld::test;
using verify::read_safetensors_header;

namespace {

// Reads a file written from `content` and returns the result.
Result<verify::SafetensorsHeader> read_bytes(const std::string& content) {
  TempDir dir;
  write_file(dir / "model.safetensors", content);
  return read_safetensors_header(dir / "model.safetensors", "model.safetensors");
}

std::string message_of(const Result<verify::SafetensorsHeader>& r) { return r ? "" : r.error().message; }

}  // namespace

TEST_CASE("a valid safetensors file yields its tensors, offsets and metadata") {
  auto r = read_bytes(safetensors_file({{"embed", "BF16", {4, 3}}, {"norm", "F32", {3}}, {"scale", "F8_E4M3", {5}}},
                                       {{"format", "pt"}}));
  REQUIRE(r.has_value());
  CHECK(r->tensors.size() == 3);
  const auto& e = r->tensors.at("embed");
  CHECK(e.dtype == "BF16");
  CHECK(e.shape == std::vector<std::uint64_t>{4, 3});
  CHECK(e.begin == 0);
  CHECK(e.end == 24);
  CHECK(r->tensors.at("norm").begin == 24);
  CHECK(r->tensors.at("scale").end == 24 + 12 + 5);
  CHECK(r->data_size == 41);
  CHECK(r->metadata.at("format") == "pt");
}

TEST_CASE("a header padded with trailing spaces and an empty tensor are accepted") {
  std::uint64_t bytes = 0;
  auto h = safetensors_header({{"a", "F16", {2}}, {"empty", "F32", {0, 7}}, {"b", "I8", {3}}}, &bytes);
  auto r = read_bytes(safetensors_raw(h.dump() + "      ", bytes));
  REQUIRE(r.has_value());
  CHECK(r->tensors.at("empty").begin == r->tensors.at("empty").end);
  CHECK(r->header_size == h.dump().size() + 6);
}

TEST_CASE("a header length past the end of the file is safetensors_invalid naming the file") {
  auto good = safetensors_file({{"w", "F32", {2}}});
  std::string bad = good;
  bad[0] = static_cast<char>(static_cast<unsigned char>(bad[0]) + 100);
  auto r = read_bytes(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK_THAT(r.error().message, Catch::StartsWith("model.safetensors: "));
  CHECK_THAT(r.error().message, Catch::Contains("past the end"));
}

TEST_CASE("a header length over 100,000,000 bytes is refused before reading it") {
  std::string bad(8, '\0');
  bad[4] = 1;  // 2^32
  bad += "{}";
  auto r = read_bytes(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK_THAT(r.error().message, Catch::Contains("exceeds the limit"));
}

TEST_CASE("a file shorter than the 8-byte length is safetensors_invalid") {
  auto r = read_bytes("abc");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
}

TEST_CASE("a header that is not JSON is reported with the parser's position") {
  auto r = read_bytes(safetensors_raw(R"({"w": {"dtype": "F32", "shape": [1], )", 4));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK_THAT(r.error().message, Catch::Contains("not valid JSON"));
  CHECK_THAT(r.error().message, Catch::Contains("column"));
}

TEST_CASE("a header that does not start with a brace or is not an object is invalid") {
  CHECK(read_bytes(safetensors_raw(R"( {})", 0)).error().code == Errc::safetensors_invalid);
  CHECK_FALSE(read_bytes(safetensors_raw("[1]", 0)).has_value());
}

TEST_CASE("a header that is a JSON array is reported as not an object, with what it starts with") {
  auto r = read_bytes(safetensors_raw(R"(["w"])", 0));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK(message_of(r) == "model.safetensors: header is not a JSON object: it starts with '[' instead of '{'");
  auto binary = read_bytes(safetensors_raw(std::string("\x01{}", 3), 0));
  CHECK_THAT(message_of(binary), Catch::Contains("byte 0x01"));
  CHECK_THAT(message_of(read_bytes(safetensors_raw("", 0))), Catch::Contains("header is empty"));
}

TEST_CASE("a byte count that does not match shape and dtype names the tensor") {
  auto h = safetensors_header({{"a", "F32", {2, 2}}, {"b", "BF16", {3}}});
  h["b"]["shape"] = {4};  // 8 bytes needed, 6 present
  auto r = read_bytes(safetensors_raw(h.dump(), 22));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK_THAT(message_of(r), Catch::StartsWith("model.safetensors: tensor 'b': "));
  CHECK_THAT(message_of(r), Catch::Contains("need 8"));
}

TEST_CASE("a hole between tensors is safetensors_invalid naming the tensor after it") {
  auto h = safetensors_header({{"a", "F32", {2}}, {"b", "F32", {2}}});
  h["b"]["data_offsets"] = {12, 20};
  auto r = read_bytes(safetensors_raw(h.dump(), 20));
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(message_of(r), Catch::Contains("tensor 'b'"));
  CHECK_THAT(message_of(r), Catch::Contains("hole"));
}

TEST_CASE("overlapping tensors are safetensors_invalid") {
  auto h = safetensors_header({{"a", "F32", {2}}, {"b", "F32", {2}}});
  h["b"]["data_offsets"] = {4, 12};
  auto r = read_bytes(safetensors_raw(h.dump(), 12));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::safetensors_invalid);
  CHECK_THAT(message_of(r), Catch::Contains("overlaps"));
}

TEST_CASE("a data buffer longer or shorter than the tensors is safetensors_invalid") {
  std::uint64_t bytes = 0;
  auto h = safetensors_header({{"a", "F32", {2}}}, &bytes);
  auto longer = read_bytes(safetensors_raw(h.dump(), bytes + 1));
  REQUIRE_FALSE(longer.has_value());
  CHECK_THAT(message_of(longer), Catch::Contains("cover 8 bytes"));
  auto shorter = read_bytes(safetensors_raw(h.dump(), bytes - 1));
  REQUIRE_FALSE(shorter.has_value());
  CHECK(shorter.error().code == Errc::safetensors_invalid);
}

TEST_CASE("trailing bytes and a buffer cut short say how many bytes and the size arithmetic") {
  std::uint64_t bytes = 0;
  auto h = safetensors_header({{"a", "F32", {2}}, {"b", "BF16", {4}}}, &bytes);  // 16 bytes of data
  auto text = h.dump();
  auto longer = read_bytes(safetensors_raw(text, bytes + 24));
  CHECK_THAT(message_of(longer), Catch::Contains("24 trailing bytes after the last tensor"));
  CHECK_THAT(message_of(longer), Catch::Contains(fmt::format("(8 + {} + 16 != {} bytes)", text.size(),
                                                             8 + text.size() + 40)));
  auto shorter = read_bytes(safetensors_raw(text, bytes - 3));
  CHECK_THAT(message_of(shorter), Catch::Contains("ends 3 bytes early"));
}

TEST_CASE("an unknown dtype names the tensor and the dtype") {
  auto h = safetensors_header({{"w", "F32", {2}}});
  h["w"]["dtype"] = "F12";
  auto r = read_bytes(safetensors_raw(h.dump(), 8));
  REQUIRE_FALSE(r.has_value());
  CHECK(message_of(r) == "model.safetensors: tensor 'w': unknown dtype \"F12\"");
}

TEST_CASE("shapes whose byte count overflows 64 bits are refused without wrapping") {
  nlohmann::json h = {{"w", {{"dtype", "F64"}, {"shape", {1ull << 32, 1ull << 32, 16}}, {"data_offsets", {0, 0}}}}};
  auto r = read_bytes(safetensors_raw(h.dump(), 0));
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(message_of(r), Catch::Contains("tensor 'w'"));
  // 2^61 F64 elements would be exactly 2^64 bytes, which wraps to 0.
  h["w"]["shape"] = {1ull << 61};
  CHECK_FALSE(read_bytes(safetensors_raw(h.dump(), 0)).has_value());
}

TEST_CASE("negative dimensions, reversed offsets and bad metadata are refused") {
  nlohmann::json neg = {{"w", {{"dtype", "U8"}, {"shape", {-1}}, {"data_offsets", {0, 0}}}}};
  CHECK_THAT(message_of(read_bytes(safetensors_raw(neg.dump(), 0))), Catch::Contains("non-negative"));
  nlohmann::json rev = {{"w", {{"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {4, 0}}}}};
  CHECK_FALSE(read_bytes(safetensors_raw(rev.dump(), 4)).has_value());
  auto meta = safetensors_header({{"w", "U8", {1}}});
  meta["__metadata__"] = {{"n", 3}};
  CHECK_THAT(message_of(read_bytes(safetensors_raw(meta.dump(), 1))), Catch::Contains("__metadata__"));
}

TEST_CASE("sub-byte dtypes must fill whole bytes") {
  nlohmann::json h = {{"q", {{"dtype", "F4"}, {"shape", {4}}, {"data_offsets", {0, 2}}}}};
  CHECK(read_bytes(safetensors_raw(h.dump(), 2)).has_value());
  h["q"]["shape"] = {3};
  CHECK_FALSE(read_bytes(safetensors_raw(h.dump(), 2)).has_value());
}

TEST_CASE("a file that cannot be opened is io_error naming the display name") {
  TempDir dir;
  auto r = read_safetensors_header(dir / "absent.safetensors", "shard-1.safetensors");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  CHECK_THAT(r.error().message, Catch::StartsWith("shard-1.safetensors: "));
}
