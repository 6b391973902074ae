#include "unit/verify/test_files.hpp"
#include "verify/hash.hpp"
#include "verify/verify.hpp"

#include <catch2/catch.hpp>

#include <algorithm>

using namespace modeld;
using namespace modeld::test;
using repo::RepoFile;

namespace {

std::string git_sha1(const std::string& content) {
  verify::Hasher h(verify::HashKind::git_sha1, content.size());
  h.update(std::span<const char>(content.data(), content.size()));
  return h.hex();
}

std::string sha256(const std::string& content) {
  verify::Hasher h(verify::HashKind::sha256, content.size());
  h.update(std::span<const char>(content.data(), content.size()));
  return h.hex();
}

// Writes `content` as `path` under `dir` and returns its listing entry (LFS when `lfs`).
RepoFile put(const TempDir& dir, const std::string& path, const std::string& content, bool lfs = false) {
  write_file(dir / path, content);
  RepoFile f{path, content.size(), git_sha1(lfs ? "pointer of " + path : content), std::nullopt};
  if (lfs) f.lfs_sha256 = sha256(content);
  return f;
}

std::string index_json(const nlohmann::json& weight_map) {
  return nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
}

// A two-shard checkpoint with config, tokenizer and index, all consistent.
std::vector<RepoFile> good_checkpoint(const TempDir& dir) {
  return {
      put(dir, "config.json", R"({"model_type": "llama"})"),
      put(dir, "model-00001-of-00002.safetensors", safetensors_file({{"embed", "BF16", {4, 2}}, {"l0.w", "F32", {2}}}), true),
      put(dir, "model-00002-of-00002.safetensors", safetensors_file({{"l1.w", "F32", {2}}, {"head", "BF16", {2, 4}}}), true),
      put(dir, "model.safetensors.index.json",
          index_json({{"embed", "model-00001-of-00002.safetensors"},
                      {"l0.w", "model-00001-of-00002.safetensors"},
                      {"l1.w", "model-00002-of-00002.safetensors"},
                      {"head", "model-00002-of-00002.safetensors"}})),
      put(dir, "tokenizer.json", R"({"version": "1.0"})"),
  };
}

bool has_problem(const verify::Report& r, Errc code, const std::string& file, const std::string& tensor = "") {
  return std::any_of(r.problems.begin(), r.problems.end(), [&](const verify::Problem& p) {
    return p.code == code && p.file == file && p.tensor == tensor;
  });
}

std::string all_messages(const verify::Report& r) {
  std::string s;
  for (const auto& p : r.problems) s += p.message + "\n";
  return s;
}

}  // namespace

TEST_CASE("sha256 of hello and the git blob sha1 of hello-newline are the known digests") {
  CHECK(sha256("hello") == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  CHECK(git_sha1("hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a");
  TempDir dir;
  write_file(dir / "h", "hello\n");
  int err = -1;
  CHECK(verify::hash_file((dir / "h").string(), verify::HashKind::git_sha1, 6, err) ==
        "ce013625030ba8dba906f756967f9e9ca394464a");
  CHECK(err == 0);
  CHECK(verify::hash_file((dir / "absent").string(), verify::HashKind::sha256, 0, err).empty());
  CHECK(err == ENOENT);
}

TEST_CASE("a consistent sharded checkpoint passes the structure check") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  auto r = verify::check_structure(dir.path, files);
  INFO(all_messages(r));
  CHECK(r.ok());
}

TEST_CASE("a listed shard that is missing on disk is checkpoint_incomplete") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  auto r = verify::check_structure(dir.path, files);
  CHECK(has_problem(r, Errc::checkpoint_incomplete, "model-00002-of-00002.safetensors"));
  CHECK(r.to_error().code == Errc::checkpoint_incomplete);
}

TEST_CASE("a shard the index names but the listing lacks is checkpoint_incomplete") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  files.erase(files.begin() + 2);  // model-00002 filtered out
  auto r = verify::check_structure(dir.path, files);
  REQUIRE(has_problem(r, Errc::checkpoint_incomplete, "model-00002-of-00002.safetensors"));
  CHECK_THAT(all_messages(r), Catch::Contains("not in the listing"));
}

TEST_CASE("a tensor mapped to a shard whose header lacks it is reported with tensor and shard") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  files[3] = put(dir, "model.safetensors.index.json",
                 index_json({{"embed", "model-00001-of-00002.safetensors"},
                             {"l0.w", "model-00001-of-00002.safetensors"},
                             {"l1.w", "model-00002-of-00002.safetensors"},
                             {"head", "model-00002-of-00002.safetensors"},
                             {"lost", "model-00001-of-00002.safetensors"}}));
  auto r = verify::check_structure(dir.path, files);
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0].code == Errc::checkpoint_incomplete);
  CHECK(r.problems[0].file == "model-00001-of-00002.safetensors");
  CHECK(r.problems[0].tensor == "lost");
  CHECK_THAT(r.problems[0].message, Catch::Contains("'lost'"));
  CHECK_THAT(r.problems[0].message, Catch::Contains("model-00001-of-00002.safetensors"));
}

TEST_CASE("a tensor in a shard but absent from the index is a problem") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  files[3] = put(dir, "model.safetensors.index.json",
                 index_json({{"embed", "model-00001-of-00002.safetensors"},
                             {"l1.w", "model-00002-of-00002.safetensors"},
                             {"head", "model-00002-of-00002.safetensors"}}));
  auto r = verify::check_structure(dir.path, files);
  CHECK(r.problems.size() == 1);
  CHECK(has_problem(r, Errc::checkpoint_incomplete, "model-00001-of-00002.safetensors", "l0.w"));
}

TEST_CASE("wrong sizes, a corrupt shard and a bad config are all collected in one report") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  files[4].size += 1;  // tokenizer.json
  write_file(dir / "config.json", "[1, 2]");
  files[0].size = 6;
  std::uint64_t bytes = 0;
  auto h = safetensors_header({{"l1.w", "F32", {2}}, {"head", "BF16", {2, 4}}}, &bytes);
  h["head"]["dtype"] = "Q7";
  auto raw = safetensors_raw(h.dump(), bytes);
  files[2] = put(dir, "model-00002-of-00002.safetensors", raw, true);
  auto r = verify::check_structure(dir.path, files);
  INFO(all_messages(r));
  CHECK(r.problems.size() == 3);
  CHECK(has_problem(r, Errc::size_mismatch, "tokenizer.json"));
  CHECK(has_problem(r, Errc::checkpoint_incomplete, "config.json"));
  CHECK(has_problem(r, Errc::safetensors_invalid, "model-00002-of-00002.safetensors", "head"));
  CHECK_THAT(r.to_error().message, Catch::EndsWith("(and 2 more problems)"));
}

TEST_CASE("an index in a sub-folder names shards relative to its folder") {
  TempDir dir;
  std::vector<RepoFile> files{
      put(dir, "sub/a.safetensors", safetensors_file({{"x", "U8", {3}}})),
      put(dir, "sub/model.safetensors.index.json", index_json({{"x", "a.safetensors"}})),
  };
  CHECK(verify::check_structure(dir.path, files).ok());
}

TEST_CASE("an index that is not JSON is safetensors_invalid") {
  TempDir dir;
  std::vector<RepoFile> files{put(dir, "model.safetensors.index.json", "{\"weight_map\": ")};
  auto r = verify::check_structure(dir.path, files);
  CHECK(has_problem(r, Errc::safetensors_invalid, "model.safetensors.index.json"));
}

TEST_CASE("re-hashing reports mismatches and missing files in listing order, in parallel") {
  TempDir dir;
  std::vector<RepoFile> files;
  for (int i = 0; i < 12; ++i) files.push_back(put(dir, "f" + std::to_string(i) + ".bin", std::string(1000 + i, 'x'), i % 2 == 0));
  CHECK(verify::check_hashes(dir.path, files, 4).ok());

  files[3].blob_id = std::string(40, '0');
  files[6].lfs_sha256 = std::string(64, 'a');
  std::filesystem::remove(dir / "f9.bin");
  for (auto& c : *files[10].lfs_sha256) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto r = verify::check_hashes(dir.path, files, 4);
  INFO(all_messages(r));
  REQUIRE(r.problems.size() == 3);
  CHECK(r.problems[0].file == "f3.bin");
  CHECK(r.problems[0].code == Errc::checksum_mismatch);
  CHECK_THAT(r.problems[0].message, Catch::Contains("git blob sha1"));
  CHECK(r.problems[1].file == "f6.bin");
  CHECK_THAT(r.problems[1].message, Catch::Contains("sha256"));
  CHECK(r.problems[2].file == "f9.bin");
  CHECK(r.problems[2].code == Errc::checkpoint_incomplete);
  CHECK(verify::check_hashes(dir.path, files, 0).problems.size() == 3);
}

TEST_CASE("filters that drop index shards or tokenizer files are reported, other formats are not") {
  auto f = [](std::string p) { return RepoFile{std::move(p), 1, "", std::nullopt}; };
  std::vector<RepoFile> all{f("config.json"),
                            f("consolidated.safetensors"),
                            f("model-00001-of-00002.safetensors"),
                            f("model-00002-of-00002.safetensors"),
                            f("model.safetensors.index.json"),
                            f("original/tokenizer.model"),
                            f("tiktoken.model"),
                            f("tokenizer_config.json"),
                            f("vocab.tiktoken")};
  std::vector<RepoFile> kept{f("config.json"), f("model-00001-of-00002.safetensors"),
                             f("model.safetensors.index.json"), f("tokenizer_config.json")};
  CHECK(verify::needed_but_filtered(all, kept) ==
        std::vector<std::string>{"model-00002-of-00002.safetensors", "tiktoken.model", "vocab.tiktoken"});
  kept = all;
  CHECK(verify::needed_but_filtered(all, kept).empty());
  // Without the index kept, shards are the user's choice (e.g. a single-file checkpoint).
  kept = {f("config.json"), f("consolidated.safetensors"), f("tiktoken.model"), f("tokenizer_config.json"),
          f("vocab.tiktoken")};
  CHECK(verify::needed_but_filtered(all, kept).empty());
}

TEST_CASE("a report's error is its first problem with a count of the rest") {
  verify::Report r;
  r.problems.push_back({Errc::checksum_mismatch, "a", "", "a: sha256 is x, the listing says y"});
  CHECK(r.to_error().message == "a: sha256 is x, the listing says y");
  r.problems.push_back({Errc::size_mismatch, "b", "", "b: wrong"});
  CHECK(r.to_error().code == Errc::checksum_mismatch);
  CHECK(r.to_error().message == "a: sha256 is x, the listing says y (and 1 more problem)");
}

TEST_CASE("verifying reports an index entry whose shard is not a string, naming the index and the tensor") {
  TempDir dir;
  auto files = good_checkpoint(dir);
  files[3] = put(dir, "model.safetensors.index.json",
                 index_json({{"embed", "model-00001-of-00002.safetensors"},
                             {"l0.w", "model-00001-of-00002.safetensors"},
                             {"l1.w", 2},
                             {"head", "model-00002-of-00002.safetensors"}}));
  auto r = verify::check_structure(dir.path, files);
  INFO(all_messages(r));
  CHECK(has_problem(r, Errc::safetensors_invalid, "model.safetensors.index.json", "l1.w"));
  CHECK_THAT(r.to_error().message, Catch::Contains("tensor 'l1.w': shard is not a string"));
}
