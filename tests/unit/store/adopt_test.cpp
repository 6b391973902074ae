#include "store/store.hpp"
#include "unit/store/clock.hpp"
#include "unit/store/listing.hpp"
#include "unit/verify/test_files.hpp"
#include "verify/hash.hpp"

#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <ctime>
#include <sys/stat.h>
#include <unistd.h>

using namespace modeld;
using namespace modeld::test;
using store::Store;
namespace fs = std::filesystem;

namespace {

const std::string kCommit = "4444444444444444444444444444444444444444";

// Writes what `hf download --local-dir` records next to a file it wrote.
void write_hf_record(const fs::path& folder, const std::string& path, const std::string& commit,
                     const std::string& etag, double when) {
  write_file(folder / ".cache" / "huggingface" / "download" / (path + ".metadata"),
             fmt::format("{}\n{}\n{:.3f}\n", commit, etag, when));
}

std::uint64_t inode(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_ino;
}

// A model folder made by hand at models_dir/m: a shard, config.json and tokenizer.json.
struct Fixture {
  TempDir dir;
  Store store{dir.path};
  fs::path folder = dir.path / "m";
  std::string shard = std::string(100000, 's'), config = "{\"a\": 1}", tok = "{\"t\": 2}";
  std::vector<repo::RepoFile> files{listed("sub/model.safetensors", shard, true), listed("config.json", config, false),
                                   listed("tokenizer.json", tok, false)};
  Fixture() {
    write_file(folder / "sub" / "model.safetensors", shard);
    write_file(folder / "config.json", config);
    write_file(folder / "tokenizer.json", tok);
    REQUIRE(store.prepare_revision("m", kCommit).has_value());
  }
};

}  // namespace

TEST_CASE("an hf download record is read as commit, etag and time", "[store][adopt]") {
  TempDir d;
  write_file(d / "a.json", "x");
  write_hf_record(d.path, "a.json", "abc", "DEADBEEF", static_cast<double>(std::time(nullptr)) + 5);
  auto rec = store::read_hf_download_record(d.path, "a.json");
  REQUIRE(rec.has_value());
  CHECK(rec->commit == "abc");
  CHECK(rec->etag == "deadbeef");
}

TEST_CASE("an hf download record older than its file, malformed or absent is ignored", "[store][adopt]") {
  TempDir d;
  write_file(d / "a.json", "x");
  write_file(d / "b.json", "x");
  write_file(d / "c.json", "x");
  write_hf_record(d.path, "a.json", "abc", "beef", 1000.0);  // the file was written long after
  write_file(d.path / ".cache/huggingface/download/b.json.metadata", "abc\nbeef\n");
  CHECK_FALSE(store::read_hf_download_record(d.path, "a.json").has_value());
  CHECK_FALSE(store::read_hf_download_record(d.path, "b.json").has_value());
  CHECK_FALSE(store::read_hf_download_record(d.path, "c.json").has_value());
  CHECK_FALSE(store::read_hf_download_record(d.path, "../c.json").has_value());
}

TEST_CASE("a folder at models_dir/NAME is foreign, a link of the store is not", "[store][adopt]") {
  Fixture fx;
  CHECK(fx.store.foreign_folder("m") == fx.folder);
  CHECK_FALSE(fx.store.foreign_folder("other").has_value());
  // Operators may symlink models_dir/NAME to a folder of theirs.
  fs::rename(fx.folder, fx.dir / "elsewhere");
  fs::create_directory_symlink(fx.dir / "elsewhere", fx.folder);
  CHECK(fx.store.foreign_folder("m") == fx.folder);
  fs::remove(fx.folder);
  REQUIRE(fx.store.switch_link("m", kCommit).has_value());
  CHECK_FALSE(fx.store.foreign_folder("m").has_value());
}

TEST_CASE("adoption hashes matching files and hard-links them into the revision without touching the folder",
          "[store][adopt]") {
  Fixture fx;
  auto adopted = fx.store.adopt("m", kCommit, fx.files, fx.folder, 2);
  REQUIRE(adopted.has_value());
  CHECK(adopted->adopted.size() == 3);
  CHECK(adopted->adopted_bytes == fx.shard.size() + fx.config.size() + fx.tok.size());
  CHECK(adopted->rejected.empty());
  const auto rev = fx.store.revision_dir("m", kCommit);
  CHECK(inode(rev / "sub" / "model.safetensors") == inode(fx.folder / "sub" / "model.safetensors"));
  CHECK(read_file(fx.folder / "config.json") == fx.config);
  CHECK(read_file(rev / "tokenizer.json") == fx.tok);
}

TEST_CASE("a file with the listed size but other bytes is not adopted and named with both digests",
          "[store][adopt]") {
  Fixture fx;
  std::string bad = fx.shard;
  bad[5000] = 'X';
  write_file(fx.folder / "sub" / "model.safetensors", bad);
  auto adopted = fx.store.adopt("m", kCommit, fx.files, fx.folder, 2);
  REQUIRE(adopted.has_value());
  CHECK(adopted->adopted.size() == 2);
  REQUIRE(adopted->rejected.size() == 1);
  CHECK(adopted->rejected[0].path == "sub/model.safetensors");
  CHECK_THAT(adopted->rejected[0].reason, Catch::Contains(*fx.files[0].lfs_sha256));
  CHECK_THAT(adopted->rejected[0].reason, Catch::Contains("sha256"));
  CHECK_FALSE(fs::exists(fx.store.revision_dir("m", kCommit) / "sub" / "model.safetensors"));
  CHECK(read_file(fx.folder / "sub" / "model.safetensors") == bad);  // the folder is left as it was
}

TEST_CASE("a file whose hf download record names another digest is not even hashed", "[store][adopt]") {
  Fixture fx;
  const double later = static_cast<double>(std::time(nullptr)) + 5;
  write_hf_record(fx.folder, "sub/model.safetensors", "oldcommit", std::string(64, 'a'), later);
  write_hf_record(fx.folder, "config.json", "c0ffee", fx.files[1].blob_id, later);
  auto scan = fx.store.scan_adoption("m", kCommit, fx.files, fx.folder);
  REQUIRE(scan.has_value());
  CHECK(scan->hf_metadata);
  CHECK(scan->candidates.size() == 2);
  REQUIRE(scan->rejected.size() == 1);
  CHECK_THAT(scan->rejected[0].reason, Catch::Contains("hf download recorded") && Catch::Contains("oldcommit"));
}

TEST_CASE("files of another size, behind a symlink or missing are left to the download", "[store][adopt]") {
  Fixture fx;
  write_file(fx.folder / "config.json", "{}");  // another size
  fs::remove(fx.folder / "tokenizer.json");     // missing: not a rejection, simply downloaded
  // A folder symlink below the adopted folder could reach anything on the host.
  fs::create_directories(fx.dir / "outside");
  write_file(fx.dir / "outside" / "model.safetensors", fx.shard);
  fs::remove_all(fx.folder / "sub");
  fs::create_directory_symlink(fx.dir / "outside", fx.folder / "sub");
  auto scan = fx.store.scan_adoption("m", kCommit, fx.files, fx.folder);
  REQUIRE(scan.has_value());
  CHECK(scan->candidates.empty());
  REQUIRE(scan->rejected.size() == 2);
  CHECK_THAT(scan->rejected[0].reason, Catch::Contains("symbolic link"));
  CHECK_THAT(scan->rejected[1].reason, Catch::Contains("2 bytes, the listing says 8"));
}

TEST_CASE("a foreign folder is set aside under .adopted, kept whole, and list() ignores it", "[store][adopt]") {
  Fixture fx;
  REQUIRE(fx.store.adopt("m", kCommit, fx.files, fx.folder, 1).has_value());
  CHECK(fx.store.list().size() == 1);  // the store's revision only
  auto aside = fx.store.set_aside_foreign("m");
  REQUIRE(aside.has_value());
  REQUIRE(aside->has_value());
  CHECK((*aside)->parent_path() == fx.dir.path / ".adopted");
  CHECK(read_file(**aside / "config.json") == fx.config);
  CHECK_FALSE(fs::exists(fx.folder));
  REQUIRE(fx.store.switch_link("m", kCommit).has_value());
  // Once the link is ours, there is nothing to set aside.
  auto again = fx.store.set_aside_foreign("m");
  REQUIRE(again.has_value());
  CHECK_FALSE(again->has_value());
  CHECK(fx.store.linked_commit("m") == kCommit);
}

TEST_CASE("a symlink an operator made at models_dir/NAME is not a stored model", "[store][adopt]") {
  TempDir d;
  Store s(d.path);
  fs::create_directories(d / "data");
  fs::create_directory_symlink(d / "data", d / "mine");
  CHECK(s.list().empty());
}

TEST_CASE("adopting hard links of a verified revision's files keeps that revision's manifest true", "[store][adopt]") {
  Fixture fx;
  // Model v's verified revision holds config.json; the folder to adopt holds a hard link of it.
  const std::string kV = "5555555555555555555555555555555555555555";
  REQUIRE(fx.store.prepare_revision("v", kV).has_value());
  const auto src = fx.store.revision_dir("v", kV) / "config.json";
  write_file(src, fx.config);
  fs::remove(fx.folder / "config.json");
  fs::create_hard_link(src, fx.folder / "config.json");
  auto id = store::identity_of(src);
  REQUIRE(id.has_value());
  store::Manifest m{"org/v", "main", kV, "2026-11-29T19:39:42Z",
                    {{"config.json", fx.config.size(), "", fx.files[1].blob_id, *id}}};
  REQUIRE(fx.store.write_manifest("v", m).has_value());
  REQUIRE(fx.store.manifest_still_matches("v", kV));

  // Adoption links the same inode into model m's revision: its ctime moves.
  let_the_clock_pass(fx.dir.path, id->ctime_ns);
  auto adopted = fx.store.adopt("m", kCommit, fx.files, fx.folder, 2);
  REQUIRE(adopted.has_value());
  CHECK(inode(fx.store.revision_dir("m", kCommit) / "config.json") == inode(src));
  CHECK(store::identity_of(src)->ctime_ns != id->ctime_ns);
  CHECK(fx.store.manifest_still_matches("v", kV));
}
