#include "store/store.hpp"
#include "store/store_detail.hpp"
#include "unit/store/clock.hpp"
#include "unit/store/listing.hpp"
#include "unit/verify/test_files.hpp"
#include "verify/hash.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fcntl.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace modeld;
using namespace modeld::test;
using store::Store;
namespace fs = std::filesystem;

namespace {

const std::string kA = "1111111111111111111111111111111111111111";
const std::string kB = "2222222222222222222222222222222222222222";
const std::string kC = "3333333333333333333333333333333333333333";

// Writes the files of `snap` into its revision and records a manifest of them, as the
// deployment does after verification.
void install_verified(Store& s, const std::string& name, const repo::Snapshot& snap,
                      const std::map<std::string, std::string>& contents) {
  REQUIRE(s.prepare_revision(name, snap.commit).has_value());
  store::Manifest m{snap.repo, snap.revision, snap.commit, "2026-11-29T19:39:42Z", {}};
  for (const auto& f : snap.files) {
    auto p = s.revision_dir(name, snap.commit) / f.path;
    if (!fs::exists(p)) write_file(p, contents.at(f.path));
    auto id = store::identity_of(p);
    REQUIRE(id.has_value());
    m.files.push_back({f.path, f.size, f.lfs_sha256.value_or(""), f.blob_id, *id});
  }
  REQUIRE(s.write_manifest(name, m).has_value());
}

std::uint64_t inode(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_ino;
}

std::string link_target(const fs::path& p) {
  std::error_code ec;
  return fs::read_symlink(p, ec).string();
}

// The newest ctime among the files of a revision's manifest.
std::int64_t newest_ctime(Store& s, const std::string& name, const std::string& commit) {
  auto m = s.read_manifest(name, commit);
  REQUIRE((m && *m));
  std::int64_t newest = 0;
  for (const auto& f : (*m)->files) newest = std::max(newest, f.identity.ctime_ns);
  return newest;
}

}  // namespace

TEST_CASE("the store lays out revisions under .store and links the model relatively") {
  TempDir dir;
  Store s(dir.path);
  CHECK(s.revision_dir("m", kA) == dir.path / ".store" / "m" / kA);
  CHECK(s.model_path("m") == dir.path / "m");
  REQUIRE(s.prepare_revision("m", kA).has_value());
  CHECK(fs::is_directory(s.revision_dir("m", kA) / ".modeld" / "partial"));
  CHECK_FALSE(s.prepare_revision("m", "../x").has_value());
  CHECK_FALSE(s.prepare_revision("../m", kA).has_value());
  CHECK_FALSE(s.linked_commit("m").has_value());
}

TEST_CASE("the temporary links a killed switch_link left are removed, nothing else") {
  // Found by the kill sweep (test_kill_sweep_e2e, seed 12345, a kill in launching).
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  REQUIRE(s.switch_link("m", kA).has_value());
  fs::create_symlink(".store/m/" + kA, dir.path / ".m.link-1744-0");
  fs::create_symlink(".store/m/" + kA, dir.path / ".my-model.link-12-3");
  write_file(dir.path / ".n.link-1-0", "a file of that name is not ours");
  fs::create_symlink(".store/m/" + kA, dir.path / ".m.link-x-0");
  fs::create_symlink(".store/m/" + kA, dir.path / "other.link-1-0");
  auto removed = s.remove_link_temps();
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{".m.link-1744-0", ".my-model.link-12-3"});
  CHECK_FALSE(fs::exists(fs::symlink_status(dir.path / ".m.link-1744-0")));
  CHECK(fs::exists(dir.path / ".n.link-1-0"));
  CHECK(fs::is_symlink(dir.path / ".m.link-x-0"));
  CHECK(fs::is_symlink(dir.path / "other.link-1-0"));
  CHECK(s.linked_commit("m") == kA);
  CHECK(s.remove_link_temps().empty());
}

TEST_CASE("the hard-link temporaries a killed planning left in a revision are removed, listed files kept") {
  // Planning links unchanged files into the new revision as FILE.link-PID-N, then renames them
  // (manifest.cpp's link_over): a kill between the two leaves the temporary in the revision.
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  REQUIRE(s.prepare_revision("m", kB).has_value());
  const auto a = s.revision_dir("m", kA), b = s.revision_dir("m", kB);
  write_file(a / "model.safetensors", "weights");
  write_file(a / "odd.link-7-7", "a repository file of that name, listed in A's manifest");
  store::Manifest m{"org/model", "main", kA, "2026-11-29T19:39:42Z", {}};
  for (const auto* f : {"model.safetensors", "odd.link-7-7"}) {
    auto id = store::identity_of(a / f);
    REQUIRE(id.has_value());
    m.files.push_back({f, fs::file_size(a / f), "", std::string(40, 'b'), *id});
  }
  REQUIRE(s.write_manifest("m", m).has_value());
  REQUIRE(::link((a / "model.safetensors").c_str(), (b / "model.safetensors.link-1744-3").c_str()) == 0);
  write_file(b / "sub" / "config.json.link-1744-4", "{}");
  write_file(b / "config.json", "{}");
  write_file(b / ".modeld" / "partial" / "x.link-1-1", "modeld's own folder: left alone");
  auto removed = s.remove_link_temps();
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{".store/m/" + kB + "/model.safetensors.link-1744-3",
                                            ".store/m/" + kB + "/sub/config.json.link-1744-4"});
  CHECK_FALSE(fs::exists(b / "model.safetensors.link-1744-3"));
  CHECK(read_file(a / "model.safetensors") == "weights");  // the other link to the same inode
  CHECK(fs::exists(a / "odd.link-7-7"));
  CHECK(fs::exists(b / "config.json"));
  CHECK(fs::exists(b / ".modeld" / "partial" / "x.link-1-1"));
  CHECK(s.remove_link_temps().empty());
}

TEST_CASE("switching the link points the model at the new revision and leaves no temp file") {
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  REQUIRE(s.prepare_revision("m", kB).has_value());
  write_file(s.revision_dir("m", kA) / "config.json", "A");
  write_file(s.revision_dir("m", kB) / "config.json", "B");

  REQUIRE(s.switch_link("m", kA).has_value());
  CHECK(link_target(dir / "m") == ".store/m/" + kA);
  CHECK(s.linked_commit("m") == kA);
  CHECK(read_file(dir / "m" / "config.json") == "A");

  REQUIRE(s.switch_link("m", kB).has_value());
  CHECK(s.linked_commit("m") == kB);
  CHECK(read_file(dir / "m" / "config.json") == "B");

  auto missing = s.switch_link("m", kC);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == Errc::not_found);
  CHECK(s.linked_commit("m") == kB);

  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir.path)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::string>{".store", "m"});
}

TEST_CASE("a reader never finds the model link missing while it is switched back and forth") {
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  REQUIRE(s.prepare_revision("m", kB).has_value());
  REQUIRE(s.switch_link("m", kA).has_value());
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, misses{0};
  std::thread reader([&] {
    const auto link = dir / "m";
    char buf[256];
    // Keeps reading until the writer is done and at least a few reads overlapped it.
    while (!done.load() || reads.load() < 10) {
      if (::readlink(link.c_str(), buf, sizeof buf) < 0) misses++;
      reads++;
    }
  });
  for (int i = 0; i < 300; ++i) REQUIRE(s.switch_link("m", i % 2 ? kA : kB).has_value());
  done = true;
  reader.join();
  CHECK(misses.load() == 0);
  CHECK(reads.load() >= 10);
}

TEST_CASE("a manifest survives a write and read round trip") {
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  auto none = s.read_manifest("m", kA);
  REQUIRE(none.has_value());
  CHECK_FALSE(none->has_value());

  store::Manifest m{"org/model", "main", kA, "2026-11-29T19:39:42Z", {}};
  m.files.push_back({"model.safetensors", 1ull << 40, std::string(64, 'a'), std::string(40, 'b'),
                     {64769, 1234567, 1ull << 40, 1764445182123456789, -5}});
  m.files.push_back({"sub/config.json", 12, "", std::string(40, 'c'), {1, 2, 12, 3, 4}});
  REQUIRE(s.write_manifest("m", m).has_value());
  CHECK(fs::exists(s.revision_dir("m", kA) / ".modeld" / "manifest.json"));
  auto back = s.read_manifest("m", kA);
  REQUIRE(back.has_value());
  REQUIRE(back->has_value());
  const auto& r = **back;
  CHECK(r.repo == "org/model");
  CHECK(r.revision == "main");
  CHECK(r.commit == kA);
  CHECK(r.verified_at == m.verified_at);
  REQUIRE(r.files.size() == 2);
  CHECK(r.files[0].identity == m.files[0].identity);
  CHECK(r.files[0].sha256 == m.files[0].sha256);
  CHECK(r.files[1].path == "sub/config.json");
  CHECK(r.files[1].git_sha1 == m.files[1].git_sha1);
  CHECK(r.size_bytes() == (1ull << 40) + 12);

  write_file(s.revision_dir("m", kA) / ".modeld" / "manifest.json", R"({"repo": 3})");
  auto bad = s.read_manifest("m", kA);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == Errc::io_error);
  CHECK_THAT(bad.error().message, Catch::Contains("manifest.json"));
}

TEST_CASE("a manifest still matches until a file's content, inode or type changes") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot snap{"org/model", "main", kA, {}};
  std::map<std::string, std::string> contents;
  for (int i = 0; i < 64; ++i) {
    auto path = "shard-" + std::to_string(i) + ".bin";
    contents[path] = std::string(100, static_cast<char>('a' + i % 26));
    snap.files.push_back(listed(path, contents[path], true));
  }
  install_verified(s, "m", snap, contents);

  auto start = std::chrono::steady_clock::now();
  CHECK(s.manifest_still_matches("m", kA));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < std::chrono::milliseconds(50));
  CHECK(s.manifest_still_matches("m", kA));
  CHECK_FALSE(s.manifest_still_matches("m", kB));

  SECTION("rewriting a file in place with the same size") {
    const auto p = s.revision_dir("m", kA) / "shard-5.bin";
    auto before = store::identity_of(p);
    REQUIRE(before.has_value());
    // The file system's clock is coarse: rewrite until the timestamps move (or give up).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    store::FileIdentity now = *before;
    while (now == *before && std::chrono::steady_clock::now() < deadline) {
      int fd = ::open(p.c_str(), O_WRONLY);
      REQUIRE(fd >= 0);
      REQUIRE(::pwrite(fd, "Z", 1, 50) == 1);
      ::close(fd);
      auto id = store::identity_of(p);
      REQUIRE(id.has_value());
      now = *id;
    }
    CHECK(now.inode == before->inode);
    CHECK(now.size == before->size);
    CHECK(now.mtime_ns != before->mtime_ns);
    CHECK_FALSE(s.manifest_still_matches("m", kA));
  }
  SECTION("replacing a file by rename") {
    const auto p = s.revision_dir("m", kA) / "shard-7.bin";
    write_file(p.string() + ".new", contents["shard-7.bin"]);
    fs::rename(p.string() + ".new", p);
    CHECK_FALSE(s.manifest_still_matches("m", kA));
  }
  SECTION("replacing a file by a symlink to identical content") {
    const auto p = s.revision_dir("m", kA) / "shard-9.bin";
    write_file(dir / "elsewhere.bin", contents["shard-9.bin"]);
    fs::remove(p);
    fs::create_symlink(dir / "elsewhere.bin", p);
    CHECK_FALSE(s.manifest_still_matches("m", kA));
  }
  SECTION("deleting a file") {
    fs::remove(s.revision_dir("m", kA) / "shard-63.bin");
    CHECK_FALSE(s.manifest_still_matches("m", kA));
  }
}

TEST_CASE("check_manifest tells a revision never verified from one whose files changed since") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot snap{"org/model", "main", kA, {}};
  std::map<std::string, std::string> contents{{"a.bin", std::string(10, 'a')}, {"b.bin", std::string(20, 'b')}};
  for (const auto& [path, text] : contents) snap.files.push_back(listed(path, text, true));
  install_verified(s, "m", snap, contents);
  CHECK(s.check_manifest("m", kA) == store::ManifestCheck::matches);
  // A revision with files but no manifest: never verified.
  REQUIRE(s.prepare_revision("m", kB).has_value());
  write_file(s.revision_dir("m", kB) / "a.bin", contents["a.bin"]);
  CHECK(s.check_manifest("m", kB) == store::ManifestCheck::absent);
  CHECK(s.check_manifest("other", kA) == store::ManifestCheck::absent);

  SECTION("a file gone") {
    fs::remove(s.revision_dir("m", kA) / "b.bin");
    CHECK(s.check_manifest("m", kA) == store::ManifestCheck::changed);
  }
  SECTION("a file of another size") {
    write_file(s.revision_dir("m", kA) / "a.bin.new", "longer than it was");
    fs::rename(s.revision_dir("m", kA) / "a.bin.new", s.revision_dir("m", kA) / "a.bin");
    CHECK(s.check_manifest("m", kA) == store::ManifestCheck::changed);
  }
  SECTION("a manifest that cannot be read") {
    write_file(s.revision_dir("m", kA) / ".modeld" / "manifest.json", "{");
    CHECK(s.check_manifest("m", kA) == store::ManifestCheck::changed);
  }
  CHECK_FALSE(s.manifest_still_matches("m", kA));
}

TEST_CASE("read_if_settled reads at once, and not at all while a relink holds the store") {
  TempDir dir;
  Store s(dir.path);
  bool read = false;
  CHECK(s.read_if_settled([&] { read = true; }));
  CHECK(read);
  read = false;
  {
    store::detail::Relinking relinking(s, {});
    CHECK_FALSE(s.read_if_settled([&] { read = true; }));
  }
  CHECK_FALSE(read);
  CHECK(s.read_if_settled([&] { read = true; }));
  CHECK(read);
}

TEST_CASE("unchanged files are hard-linked from an older revision and changed ones listed missing") {
  TempDir dir;
  Store s(dir.path);
  std::map<std::string, std::string> old_contents{{"model.safetensors", "weights v1"},
                                                  {"config.json", R"({"a": 1})"},
                                                  {"sub/tokenizer.model", "spm"},
                                                  {"changed.safetensors", "old weights"}};
  repo::Snapshot a{"org/model", "main", kA,
                  {listed("changed.safetensors", "old weights", true), listed("config.json", R"({"a": 1})", false),
                   listed("model.safetensors", "weights v1", true), listed("sub/tokenizer.model", "spm", false)}};
  install_verified(s, "m", a, old_contents);
  // The same content under a new path, a changed file, and a file new in this revision.
  repo::Snapshot b{"org/model", "main", kB,
                  {listed("changed.safetensors", "new weights", true), listed("config.json", R"({"a": 1})", false),
                   listed("moved/model.safetensors", "weights v1", true), listed("new.txt", "hello", false),
                   listed("sub/tokenizer.model", "spm", false)}};
  REQUIRE(s.prepare_revision("m", kB).has_value());

  auto missing = s.link_unchanged_and_list_missing("m", b);
  REQUIRE(missing.has_value());
  std::vector<std::string> paths;
  for (const auto& f : *missing) paths.push_back(f.path);
  CHECK(paths == std::vector<std::string>{"changed.safetensors", "new.txt"});
  CHECK(inode(s.revision_dir("m", kB) / "config.json") == inode(s.revision_dir("m", kA) / "config.json"));
  CHECK(inode(s.revision_dir("m", kB) / "moved/model.safetensors") ==
        inode(s.revision_dir("m", kA) / "model.safetensors"));
  CHECK(inode(s.revision_dir("m", kB) / "sub/tokenizer.model") ==
        inode(s.revision_dir("m", kA) / "sub/tokenizer.model"));
  // Linking changes ctime; the older revision's manifest is refreshed so it still matches.
  CHECK(s.manifest_still_matches("m", kA));

  // A file already present with the listed size counts as present; a run again links nothing new.
  write_file(s.revision_dir("m", kB) / "new.txt", "hello");
  auto again = s.link_unchanged_and_list_missing("m", b);
  REQUIRE(again.has_value());
  REQUIRE(again->size() == 1);
  CHECK(again->front().path == "changed.safetensors");
}

TEST_CASE("a file changed since its revision was verified is not linked") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot a{"org/model", "main", kA, {listed("w.bin", "0123456789", true)}};
  install_verified(s, "m", a, {{"w.bin", "0123456789"}});
  // Replaced by a same-size file with other content: a new inode, so the identity differs.
  const auto p = s.revision_dir("m", kA) / "w.bin";
  write_file(p.string() + ".x", "9876543210");
  fs::rename(p.string() + ".x", p);
  repo::Snapshot b{"org/model", "main", kB, {listed("w.bin", "0123456789", true)}};
  auto missing = s.link_unchanged_and_list_missing("m", b);
  REQUIRE(missing.has_value());
  REQUIRE(missing->size() == 1);
  CHECK_FALSE(fs::exists(s.revision_dir("m", kB) / "w.bin"));
}

TEST_CASE("a file of a verified revision edited in place is listed missing again, one only hard-linked is not") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot a{"org/model", "main", kA, {listed("c.json", "{}", false), listed("w.bin", "0123456789", true)}};
  install_verified(s, "m", a, {{"c.json", "{}"}, {"w.bin", "0123456789"}});
  let_the_clock_pass(dir.path, newest_ctime(s, "m", kA));
  // Same size, same inode, other bytes: a new mtime. A hard link moves c.json's ctime only.
  write_file(s.revision_dir("m", kA) / "w.bin", "9876543210");
  fs::create_hard_link(s.revision_dir("m", kA) / "c.json", dir.path / "c-link");
  CHECK(s.changed_since_verification("m", kA) == std::vector<std::string>{"w.bin"});
  auto plan = s.plan_missing("m", a);
  REQUIRE(plan.has_value());
  REQUIRE(plan->missing.size() == 1);
  CHECK(plan->missing.front().path == "w.bin");
  CHECK(plan->changed == std::vector<std::string>{"w.bin"});
  auto missing = s.link_unchanged_and_list_missing("m", a);
  REQUIRE(missing.has_value());
  REQUIRE(missing->size() == 1);
  CHECK(missing->front().path == "w.bin");
}

TEST_CASE("a listing path that escapes the revision folder is plan_invalid") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot b{"org/model", "main", kB, {listed("../../escape", "x", false)}};
  auto r = s.link_unchanged_and_list_missing("m", b);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::plan_invalid);
}

TEST_CASE("list reports models, their link, revisions and size with hard links counted once") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot a{"org/model", "main", kA, {listed("w.bin", std::string(1000, 'w'), true)}};
  install_verified(s, "m", a, {{"w.bin", std::string(1000, 'w')}});
  repo::Snapshot b{"org/model", "main", kB, a.files};
  b.commit = kB;
  REQUIRE(s.prepare_revision("m", kB).has_value());
  REQUIRE(s.link_unchanged_and_list_missing("m", b).has_value());
  REQUIRE(s.switch_link("m", kB).has_value());
  REQUIRE(s.prepare_revision("other", kC).has_value());
  write_file(s.revision_dir("other", kC) / ".modeld" / "partial" / "x.part", std::string(300, 'p'));
  write_file(s.revision_dir("other", kC) / ".modeld" / "partial" / "x.part.json", "{}");

  auto models = s.list();
  REQUIRE(models.size() == 2);
  CHECK(models[0].name == "m");
  CHECK(models[0].linked_commit == kB);
  CHECK(models[0].commits == std::vector<std::string>{kA, kB});
  auto manifest_bytes = fs::file_size(s.revision_dir("m", kA) / ".modeld" / "manifest.json");
  CHECK(models[0].size_bytes == 1000 + manifest_bytes);
  CHECK(models[1].name == "other");
  CHECK_FALSE(models[1].linked_commit.has_value());
  CHECK(models[1].size_bytes == 302);
  CHECK(s.partial_bytes("other", kC) == 300);
}

TEST_CASE("removing a model refuses invalid names and never follows a symlink out of models_dir") {
  TempDir outside;
  write_file(outside / "precious.txt", "keep me");
  TempDir dir;
  Store s(dir.path);
  REQUIRE(s.prepare_revision("m", kA).has_value());
  write_file(s.revision_dir("m", kA) / "w.bin", std::string(500, 'w'));
  fs::create_directory_symlink(outside.path, s.revision_dir("m", kA) / "evil");
  fs::create_symlink(outside / "precious.txt", s.revision_dir("m", kA) / "evil-file");
  REQUIRE(s.switch_link("m", kA).has_value());

  for (std::string bad : {"", "..", "../m", ".store", "M", "a/b"}) {
    auto r = s.remove_model(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::bad_request);
  }

  auto freed = s.remove_model("m");
  REQUIRE(freed.has_value());
  CHECK(*freed == 500);
  CHECK(read_file(outside / "precious.txt") == "keep me");
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / "m")));
  CHECK_FALSE(fs::exists(dir / ".store" / "m"));
  CHECK(s.list().empty());
}

TEST_CASE("a model link that is planted outside models_dir is removed, not followed") {
  TempDir outside;
  write_file(outside / "precious.txt", "keep me");
  TempDir dir;
  Store s(dir.path);
  fs::create_directory_symlink(outside.path, dir / "m");
  REQUIRE(s.remove_model("m").has_value());
  CHECK(read_file(outside / "precious.txt") == "keep me");
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / "m")));
}

TEST_CASE("a real folder in place of the model link is left alone") {
  TempDir dir;
  Store s(dir.path);
  write_file(dir / "m" / "mine.txt", "user data");
  auto r = s.remove_model("m");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::io_error);
  CHECK(read_file(dir / "m" / "mine.txt") == "user data");
}

TEST_CASE("removing other revisions keeps the linked one and counts shared files as not freed") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot a{"org/model", "main", kA, {listed("w.bin", std::string(1000, 'w'), true)}};
  install_verified(s, "m", a, {{"w.bin", std::string(1000, 'w')}});
  write_file(s.revision_dir("m", kA) / "only-a.bin", std::string(70, 'a'));
  repo::Snapshot b = a;
  b.commit = kB;
  REQUIRE(s.prepare_revision("m", kB).has_value());
  REQUIRE(s.link_unchanged_and_list_missing("m", b).has_value());
  REQUIRE(s.switch_link("m", kB).has_value());

  auto manifest_bytes = fs::file_size(s.revision_dir("m", kA) / ".modeld" / "manifest.json");
  auto freed = s.remove_other_revisions("m", kB);
  REQUIRE(freed.has_value());
  CHECK(*freed == 70 + manifest_bytes);
  CHECK_FALSE(fs::exists(s.revision_dir("m", kA)));
  CHECK(read_file(s.revision_dir("m", kB) / "w.bin") == std::string(1000, 'w'));
  CHECK(read_file(dir / "m" / "w.bin") == std::string(1000, 'w'));

  // The revision in service survives even when the caller names another one to keep.
  REQUIRE(s.prepare_revision("m", kC).has_value());
  REQUIRE(s.remove_other_revisions("m", kC).has_value());
  CHECK(fs::exists(s.revision_dir("m", kB)));
}

TEST_CASE("identity_of reads device, inode, size and nanosecond times and refuses symlinks") {
  TempDir dir;
  write_file(dir / "f", "12345");
  auto id = store::identity_of(dir / "f");
  REQUIRE(id.has_value());
  struct stat st {};
  REQUIRE(::stat((dir / "f").c_str(), &st) == 0);
  CHECK(id->inode == st.st_ino);
  CHECK(id->device == st.st_dev);
  CHECK(id->size == 5);
  CHECK(id->mtime_ns == st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
  fs::create_symlink(dir / "f", dir / "l");
  auto l = store::identity_of(dir / "l");
  REQUIRE_FALSE(l.has_value());
  CHECK(l.error().code == Errc::io_error);
  auto free = store::free_bytes(dir.path);
  REQUIRE(free.has_value());
  CHECK(*free > 0);
  CHECK_FALSE(store::free_bytes(dir / "absent").has_value());
}

TEST_CASE("the disk plan evicts never-active and least recently active models first, only as needed") {
  using namespace std::chrono;
  const system_clock::time_point never{};
  const auto t = [](int h) { return system_clock::time_point{} + hours(24 * 365 * 50 + h); };
  std::vector<store::EvictionCandidate> c{{"recent", 50, t(10)}, {"old", 30, t(1)}, {"unused", 20, never},
                                          {"middle", 40, t(5)}};

  SECTION("fits without evicting") {
    auto p = store::plan_disk(100, 200, 100, c);
    CHECK(p.fits);
    CHECK(p.evict.empty());
  }
  SECTION("evicts in order until it fits") {
    auto p = store::plan_disk(150, 200, 100, c);  // 50 short
    CHECK(p.fits);
    REQUIRE(p.evict.size() == 2);
    CHECK(p.evict[0].name == "unused");
    CHECK(p.evict[1].name == "old");
  }
  SECTION("free below the reserve does not wrap around") {
    auto p = store::plan_disk(10, 50, 100, c);  // needs 10 + 50 short of the reserve = 60
    CHECK(p.fits);
    REQUIRE(p.evict.size() == 3);
    CHECK(p.evict[2].name == "middle");
    CHECK(p.bytes_free == 50);
    CHECK(p.reserve == 100);
  }
  SECTION("does not fit even after evicting everything") {
    auto p = store::plan_disk(1000, 200, 100, c);
    CHECK_FALSE(p.fits);
    CHECK(p.evict.size() == 4);
    CHECK(p.bytes_needed == 1000);
  }
  SECTION("exactly enough counts as fitting") {
    auto p = store::plan_disk(120, 200, 100, c);  // 20 short: "unused" frees exactly 20
    CHECK(p.fits);
    REQUIRE(p.evict.size() == 1);
  }
  SECTION("huge numbers do not overflow") {
    auto p = store::plan_disk(UINT64_MAX, UINT64_MAX, UINT64_MAX, c);
    CHECK_FALSE(p.fits);
    auto q = store::plan_disk(0, 0, 0, {});
    CHECK(q.fits);
  }
}

TEST_CASE("a revision sharing files with the one modeld removes still matches its manifest, until a real change") {
  TempDir dir;
  Store s(dir.path);
  const std::string weights(4096, 'w');
  std::map<std::string, std::string> va{{"model.safetensors", weights}, {"config.json", R"({"v": 1})"}};
  repo::Snapshot a{"org/model", "main", kA, {listed("config.json", va["config.json"], false),
                                            listed("model.safetensors", weights, true)}};
  install_verified(s, "m", a, va);
  REQUIRE(s.switch_link("m", kA).has_value());

  // A new commit changes config.json only: the weights are hard-linked (nlink 1 -> 2, ctime moves).
  let_the_clock_pass(dir.path, newest_ctime(s, "m", kA));
  std::map<std::string, std::string> vb{{"model.safetensors", weights}, {"config.json", R"({"v": 2})"}};
  repo::Snapshot b{"org/model", "main", kB, {listed("config.json", vb["config.json"], false),
                                            listed("model.safetensors", weights, true)}};
  REQUIRE(s.prepare_revision("m", kB).has_value());
  auto missing = s.link_unchanged_and_list_missing("m", b);
  REQUIRE(missing.has_value());
  REQUIRE(missing->size() == 1);
  CHECK(s.manifest_still_matches("m", kA));  // the revision in service, while the next one is planned
  CHECK(s.manifest_still_matches_settled("m", kA));
  install_verified(s, "m", b, vb);
  REQUIRE(s.switch_link("m", kB).has_value());

  // The switch done, the old revision goes (nlink 2 -> 1, ctime moves again).
  let_the_clock_pass(dir.path, newest_ctime(s, "m", kB));
  const auto shared = s.revision_dir("m", kB) / "model.safetensors";
  const auto before = store::identity_of(shared);
  REQUIRE(before.has_value());

  SECTION("the kept revision still matches") {
    REQUIRE(s.remove_other_revisions("m", kB).has_value());
    CHECK_FALSE(fs::exists(s.revision_dir("m", kA)));
    auto after = store::identity_of(shared);
    REQUIRE(after.has_value());
    CHECK(after->ctime_ns != before->ctime_ns);  // the removal did move the ctime
    CHECK(s.manifest_still_matches("m", kB));
    CHECK(s.manifest_still_matches_settled("m", kB));

    // An edit in place of the same size is still seen.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto now = *after;
    while (now.mtime_ns == after->mtime_ns && std::chrono::steady_clock::now() < deadline) {
      int fd = ::open(shared.c_str(), O_WRONLY);
      REQUIRE(fd >= 0);
      REQUIRE(::pwrite(fd, "Z", 1, 10) == 1);
      ::close(fd);
      auto id = store::identity_of(shared);
      REQUIRE(id.has_value());
      now = *id;
    }
    CHECK(now.mtime_ns != after->mtime_ns);
    CHECK_FALSE(s.manifest_still_matches("m", kB));
  }
  SECTION("a change seen before the removal is not re-recorded by it") {
    // chmod moves only the ctime: a change modeld did not make, so it stays a difference.
    REQUIRE(::chmod(shared.c_str(), 0600) == 0);
    CHECK_FALSE(s.manifest_still_matches("m", kB));
    let_the_clock_pass(dir.path, store::identity_of(shared)->ctime_ns);
    REQUIRE(s.remove_other_revisions("m", kB).has_value());
    CHECK_FALSE(s.manifest_still_matches("m", kB));
  }
  SECTION("a truncated file is still seen after the removal") {
    REQUIRE(::truncate(shared.c_str(), 100) == 0);
    REQUIRE(s.remove_other_revisions("m", kB).has_value());
    CHECK_FALSE(s.manifest_still_matches("m", kB));
  }
}

TEST_CASE("removing a model keeps the manifest of another model that shares its files true") {
  TempDir dir;
  Store s(dir.path);
  const std::string weights(2048, 'x');
  repo::Snapshot a{"org/model", "main", kA, {listed("model.safetensors", weights, true)}};
  install_verified(s, "x", a, {{"model.safetensors", weights}});
  REQUIRE(s.switch_link("x", kA).has_value());
  // Model y holds the same file by hard link (as an adoption from x's store makes it).
  REQUIRE(s.prepare_revision("y", kA).has_value());
  fs::create_hard_link(s.revision_dir("x", kA) / "model.safetensors", s.revision_dir("y", kA) / "model.safetensors");
  install_verified(s, "y", a, {{"model.safetensors", weights}});
  let_the_clock_pass(dir.path, newest_ctime(s, "y", kA));
  REQUIRE(s.remove_model("x").has_value());
  CHECK(s.manifest_still_matches("y", kA));
}

TEST_CASE("removing other revisions spares those named, and removing one revision takes its link too, the last one the model's folder") {
  TempDir dir;
  Store s(dir.path);
  repo::Snapshot a{"org/model", "main", kA, {listed("w.bin", std::string(1000, 'w'), true)}};
  install_verified(s, "m", a, {{"w.bin", std::string(1000, 'w')}});
  REQUIRE(s.switch_link("m", kA).has_value());
  for (const auto& c : {kB, kC}) REQUIRE(s.prepare_revision("m", c).has_value());
  REQUIRE(s.remove_other_revisions("m", kA, {kB}).has_value());
  CHECK(fs::exists(s.revision_dir("m", kA)));
  CHECK(fs::exists(s.revision_dir("m", kB)));
  CHECK_FALSE(fs::exists(s.revision_dir("m", kC)));

  auto one = s.remove_revision("m", kB);
  REQUIRE(one.has_value());
  CHECK_FALSE(fs::exists(s.revision_dir("m", kB)));
  CHECK(s.linked_commit("m") == kA);
  auto linked = s.remove_revision("m", kA);
  REQUIRE(linked.has_value());
  CHECK(*linked > 1000);
  CHECK_FALSE(fs::exists(s.revision_dir("m", kA)));
  CHECK_FALSE(fs::exists(fs::symlink_status(dir / "m")));
  CHECK_FALSE(s.linked_commit("m"));
  CHECK_FALSE(fs::exists(dir / ".store" / "m"));  // the last revision gone: the model is absent, not partial
  auto gone = s.remove_revision("m", kA);
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code == Errc::not_found);
  CHECK(s.remove_revision("m", "main").error().code == Errc::bad_request);
}
