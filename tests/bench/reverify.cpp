// bench_reverify: how long the fast re-verification of a large model takes.
//
//   bench_reverify --dir DIR [--shards 64] [--shard-size 5GiB] [--iterations 200] [--json]
//
// The daemon trusts a revision without re-hashing when every file still has the identity
// (device, inode, size, mtime, ctime) recorded in its manifest: Store::manifest_still_matches,
// one manifest read and parse plus one lstat per file. This program builds such a revision in
// DIR (DIR/models/.store/bench/COMMIT/: --shards sparse shard files of --shard-size bytes each,
// which take no disk space, plus the small json files of a Hugging Face checkpoint), writes its
// manifest with Store::write_manifest and identity_of, then times manifest_still_matches
// --iterations times (warm: dentries and inodes cached) and prints the median, p99, min and max in
// ms. Run as root it also times one call after `echo 2 > /proc/sys/vm/drop_caches` (dentries and
// inodes dropped, "cold"); otherwise it says why it skipped that. DIR/models is removed at the end.
// Exit 0 on a measurement, 1 when a check fails (manifest_still_matches said false), 2 on bad
// usage or a set-up error.

#include "store/store.hpp"
#include "util/text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using modeld::store::Manifest;
using modeld::store::ManifestFile;
using modeld::store::Store;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kModel = "bench";
// A commit id of the Hub's form (40 hex digits).
constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";

struct Options {
  fs::path dir;
  unsigned shards = 64;
  std::uint64_t shard_size = 5ull << 30;
  unsigned iterations = 200;
  bool json = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "bench_reverify: %s\n", message.c_str());
  std::exit(2);
}

std::uint64_t parse_size(const std::string& text) {
  std::size_t end = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &end);
  } catch (const std::exception&) {
    usage_error(fmt::format("not a size: {}", text));
  }
  const std::string unit = text.substr(end);
  if (unit.empty() || unit == "B") return n;
  if (unit == "KiB") return n << 10;
  if (unit == "MiB") return n << 20;
  if (unit == "GiB") return n << 30;
  if (unit == "MB") return n * 1000 * 1000;
  if (unit == "GB") return n * 1000 * 1000 * 1000;
  usage_error(fmt::format("unknown size unit in {} (B, KiB, MiB, GiB, MB, GB)", text));
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--dir")
      o.dir = value();
    else if (a == "--shards")
      o.shards = static_cast<unsigned>(std::stoul(value()));
    else if (a == "--shard-size")
      o.shard_size = parse_size(value());
    else if (a == "--iterations")
      o.iterations = static_cast<unsigned>(std::stoul(value()));
    else if (a == "--json")
      o.json = true;
    else if (a == "-h" || a == "--help") {
      std::puts("bench_reverify --dir DIR [--shards 64] [--shard-size 5GiB] [--iterations 200] [--json]");
      std::exit(0);
    } else
      usage_error(fmt::format("unknown argument {}", a));
  }
  if (o.dir.empty()) usage_error("--dir DIR is required");
  if (o.shards < 1 || o.iterations < 1) usage_error("--shards and --iterations must be at least 1");
  return o;
}

// Writes `content`, or a sparse file of `size` bytes when content is empty.
void make_file(const fs::path& path, const std::string& content, std::uint64_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) usage_error(fmt::format("{}: create: {}", path.string(), std::strerror(errno)));
  bool ok = content.empty() ? ::ftruncate(fd, static_cast<off_t>(size)) == 0
                            : ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  if (!ok) usage_error(fmt::format("{}: write: {}", path.string(), std::strerror(errno)));
  ::close(fd);
}

// A revision of `o.shards` sparse shards and the small files of a checkpoint, and its manifest.
std::size_t build_revision(Store& st, const Options& o) {
  if (auto r = st.prepare_revision(kModel, kCommit); !r) usage_error(r.error().message);
  const fs::path dir = st.revision_dir(kModel, kCommit);
  Manifest m;
  m.repo = "bench-org/bench-64";
  m.revision = "main";
  m.commit = kCommit;
  m.verified_at = modeld::util::rfc3339(std::chrono::system_clock::now());

  std::vector<std::pair<std::string, std::string>> small = {
      {"config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16384})"},
      {"generation_config.json", R"({"do_sample": true})"},
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"model_max_length": 131072})"},
      {"special_tokens_map.json", R"({"bos_token": "<s>"})"},
      {"README.md", "# bench\n"},
      {".gitattributes", "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"}};
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::string> shard_names;
  for (unsigned k = 1; k <= o.shards; ++k) {
    shard_names.push_back(fmt::format("model-{:05}-of-{:05}.safetensors", k, o.shards));
    weight_map[fmt::format("model.layers.{}.weight", k)] = shard_names.back();
  }
  small.emplace_back("model.safetensors.index.json",
                     nlohmann::json{{"metadata", {{"total_size", o.shard_size * o.shards}}}, {"weight_map", weight_map}}
                         .dump());

  auto add = [&](const std::string& path, const std::string& content, std::uint64_t size, bool lfs) {
    make_file(dir / path, content, size);
    auto id = modeld::store::identity_of(dir / path);
    if (!id) usage_error(id.error().message);
    ManifestFile f;
    f.path = path;
    f.size = id->size;
    // Digests are never read by manifest_still_matches; any well-formed value does.
    if (lfs) f.sha256 = fmt::format("{:064x}", path.size());
    f.git_sha1 = fmt::format("{:040x}", path.size());
    f.identity = *id;
    m.files.push_back(std::move(f));
  };
  for (const auto& name : shard_names) add(name, {}, o.shard_size, true);
  for (const auto& [name, content] : small) add(name, content, 0, false);
  if (auto w = st.write_manifest(kModel, m); !w) usage_error(w.error().message);
  return m.files.size();
}

double ms_of(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Times one manifest_still_matches; exits 1 if it does not hold.
double time_once(const Store& st) {
  auto t0 = Clock::now();
  bool ok = st.manifest_still_matches(kModel, kCommit);
  auto t1 = Clock::now();
  if (!ok) {
    std::fprintf(stderr, "bench_reverify: manifest_still_matches said the untouched revision changed\n");
    std::exit(1);
  }
  return ms_of(t1 - t0);
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least p of the samples at or below it.
  auto rank = static_cast<std::size_t>(std::max(1.0, std::ceil(p * static_cast<double>(v.size()))));
  return v[std::min(rank, v.size()) - 1];
}

// Drops the dentry and inode caches (root only); returns "" or why it could not.
std::string drop_dentries() {
  if (::geteuid() != 0) return "not root";
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("/proc/sys/vm/drop_caches: {}", std::strerror(errno));
  bool ok = ::write(fd, "2", 1) == 1;
  int err = errno;
  ::close(fd);
  if (!ok) return fmt::format("/proc/sys/vm/drop_caches: {}", std::strerror(err));
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const fs::path models = o.dir / "models";
  std::error_code ec;
  fs::remove_all(models, ec);
  Store st(models);
  const std::size_t files = build_revision(st, o);

  time_once(st);  // first call: manifest and inodes come into cache
  std::vector<double> warm;
  warm.reserve(o.iterations);
  for (unsigned i = 0; i < o.iterations; ++i) warm.push_back(time_once(st));

  std::string cold_skip = drop_dentries();
  double cold = cold_skip.empty() ? time_once(st) : -1.0;
  fs::remove_all(models, ec);

  const double median = percentile(warm, 0.5), p99 = percentile(warm, 0.99);
  const double lo = *std::min_element(warm.begin(), warm.end()), hi = *std::max_element(warm.begin(), warm.end());
  if (o.json) {
    nlohmann::json j = {{"shards", o.shards},   {"files", files},      {"shard_size", o.shard_size},
                        {"iterations", o.iterations}, {"median_ms", median}, {"p99_ms", p99},
                        {"min_ms", lo},         {"max_ms", hi}};
    if (cold_skip.empty())
      j["cold_ms"] = cold;
    else
      j["cold_skipped"] = cold_skip;
    std::puts(j.dump().c_str());
    return 0;
  }
  fmt::print("manifest_still_matches on {} files ({} sparse shards of {} bytes + {} small files)\n", files, o.shards,
             o.shard_size, files - o.shards);
  fmt::print("  warm, {} calls: median {:.3f} ms, p99 {:.3f} ms, min {:.3f} ms, max {:.3f} ms\n", o.iterations,
             median, p99, lo, hi);
  if (cold_skip.empty())
    fmt::print("  cold (after echo 2 > /proc/sys/vm/drop_caches), 1 call: {:.3f} ms\n", cold);
  else
    fmt::print("  cold: skipped ({}; dropping the dentry and inode caches needs root)\n", cold_skip);
  return 0;
}
