// Checkpoint checks: presence and sizes, safetensors headers, index coverage, config.json,
// re-hashing, and the planning check for files the filters drop but the checkpoint needs.

#include "verify/verify.hpp"

#include "util/files.hpp"
#include "util/text.hpp"
#include "verify/hash.hpp"
#include "verify/index.hpp"
#include "verify/safetensors_detail.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <sys/stat.h>
#include <thread>

namespace modeld::verify {

namespace {

constexpr std::string_view kIndexSuffix = ".safetensors.index.json";
constexpr std::string_view kShardSuffix = ".safetensors";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string_view dirname(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view{} : path.substr(0, slash);
}

std::string_view basename(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

Problem problem(Errc code, std::string file, std::string tensor, std::string message) {
  return Problem{code, std::move(file), std::move(tensor), std::move(message)};
}

// Index files of a checkpoint are limited in size so a hostile one cannot exhaust memory; the
// largest real ones (thousands of tensors) are a few MB.
constexpr std::size_t kMaxIndexBytes = 256u << 20;
constexpr std::size_t kMaxConfigBytes = 16u << 20;

// Tokenizer files a server needs when the repository has them; only at the repository root,
// since copies under e.g. original/ belong to another format of the same model.
bool is_tokenizer_file(std::string_view path) {
  if (path.find('/') != std::string_view::npos) return false;
  static constexpr std::string_view kNames[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                "tiktoken.model", "special_tokens_map.json"};
  for (auto n : kNames)
    if (path == n) return true;
  return ends_with(path, ".tiktoken");
}

}  // namespace

Error Report::to_error() const {
  if (problems.empty()) return make_error(Errc::internal, "verification reported no problem");
  const auto& first = problems.front();
  if (problems.size() == 1) return make_error(first.code, first.message);
  return make_error(first.code, fmt::format("{} (and {} more problem{})", first.message, problems.size() - 1,
                                            problems.size() == 2 ? "" : "s"));
}

namespace {

// The problem of one listed file that is absent, not a regular file or not of its listed size,
// or nullopt when it is present as listed.
std::optional<Problem> presence_problem(const std::filesystem::path& dir, const repo::RepoFile& f) {
  if (!util::safe_relative_path(f.path))
    return problem(Errc::plan_invalid, f.path, {}, fmt::format("{}: path escapes the model folder", f.path));
  struct stat st {};
  auto p = dir / f.path;
  if (::lstat(p.c_str(), &st) != 0) {
    int err = errno;
    return err == ENOENT ? problem(Errc::checkpoint_incomplete, f.path, {}, fmt::format("{}: missing", f.path))
                         : problem(Errc::io_error, f.path, {}, fmt::format("{}: stat: {}", f.path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode))
    return problem(Errc::checkpoint_incomplete, f.path, {}, fmt::format("{}: not a regular file", f.path));
  if (static_cast<std::uint64_t>(st.st_size) != f.size)
    return problem(Errc::size_mismatch, f.path, {},
                   fmt::format("{}: {} bytes on disk, the listing says {}", f.path, st.st_size, f.size));
  return std::nullopt;
}

// The weight map of the index file `path` (shard path, relative to the model folder -> tensors
// the index maps to it), or nullopt after adding the problems that make it unusable to `out`.
std::optional<ShardTensors> read_weight_map(const std::filesystem::path& dir, const std::string& path,
                                            std::vector<Problem>& out) {
  auto text = util::read_file(dir / path, kMaxIndexBytes);
  if (!text) {
    out.push_back(problem(Errc::io_error, path, {}, fmt::format("{}: {}", path, text.error().message)));
    return std::nullopt;
  }
  std::string bad_tensor;
  auto by_shard = parse_safetensors_index(*text, path, &bad_tensor);
  if (!by_shard) {
    out.push_back(problem(by_shard.error().code, path, bad_tensor, by_shard.error().message));
    return std::nullopt;
  }
  return std::move(*by_shard);
}

// Adds to `out` the shards the index file `index` names that are not listed, and the tensors
// that it and the shards' `headers` do not agree on.
void check_index(const std::filesystem::path& dir, const std::string& index, const std::set<std::string>& listed,
                 const std::map<std::string, SafetensorsHeader>& headers, std::vector<Problem>& out) {
  auto by_shard = read_weight_map(dir, index, out);
  if (!by_shard) return;
  for (const auto& [shard, tensors] : *by_shard) {
    if (!listed.count(shard)) {
      out.push_back(problem(Errc::checkpoint_incomplete, shard, {},
                            fmt::format("{}: shard named by {} ({} tensors) is not in the listing", shard, index,
                                        tensors.size())));
      continue;
    }
    auto h = headers.find(shard);
    if (h == headers.end()) continue;  // missing, wrong size or invalid: reported above
    for (const auto& t : tensors)
      if (!h->second.tensors.count(t))
        out.push_back(problem(Errc::checkpoint_incomplete, shard, t,
                              fmt::format("{}: tensor '{}': mapped to this shard by {} but not in its header", shard,
                                          t, index)));
    for (const auto& [t, info] : h->second.tensors)
      if (!tensors.count(t))
        out.push_back(problem(Errc::checkpoint_incomplete, shard, t,
                              fmt::format("{}: tensor '{}': in the shard but {} does not map it here", shard, t,
                                          index)));
  }
}

// The problem of the model folder's config.json (unreadable, not JSON, not an object), if any.
std::optional<Problem> config_problem(const std::filesystem::path& dir) {
  auto text = util::read_file(dir / "config.json", kMaxConfigBytes);
  if (!text) return problem(Errc::io_error, "config.json", {}, text.error().message);
  try {
    auto j = nlohmann::json::parse(*text);
    if (!j.is_object()) return problem(Errc::checkpoint_incomplete, "config.json", {}, "config.json: not a JSON object");
  } catch (const nlohmann::json::parse_error& e) {
    return problem(Errc::checkpoint_incomplete, "config.json", {},
                   fmt::format("config.json: not valid JSON: {}", json_error_text(e)));
  }
  return std::nullopt;
}

}  // namespace

Report check_structure(const std::filesystem::path& dir, const std::vector<repo::RepoFile>& files) {
  Report report;
  auto& out = report.problems;
  std::set<std::string> listed;
  std::set<std::string> present;  // listed, on disk, regular, with the listed size
  for (const auto& f : files) {
    listed.insert(f.path);
    if (auto p = presence_problem(dir, f))
      out.push_back(std::move(*p));
    else
      present.insert(f.path);
  }

  // Every shard header is read once; shards named by an index are looked up here.
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& f : files) {
    if (!ends_with(f.path, kShardSuffix) || !present.count(f.path)) continue;
    std::string bad_tensor;
    auto h = read_safetensors_header_detail(dir / f.path, f.path, &bad_tensor);
    if (!h) {
      out.push_back(problem(h.error().code, f.path, bad_tensor, h.error().message));
      continue;
    }
    headers.emplace(f.path, std::move(*h));
  }

  for (const auto& f : files)
    if (ends_with(f.path, kIndexSuffix) && present.count(f.path)) check_index(dir, f.path, listed, headers, out);

  if (present.count("config.json"))
    if (auto p = config_problem(dir)) out.push_back(std::move(*p));
  return report;
}

Report check_hashes(const std::filesystem::path& dir, const std::vector<repo::RepoFile>& files, unsigned parallel) {
  std::vector<std::optional<Problem>> results(files.size());
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (;;) {
      std::size_t i = next.fetch_add(1);
      if (i >= files.size()) return;
      const auto& f = files[i];
      if (!util::safe_relative_path(f.path)) {
        results[i] = problem(Errc::plan_invalid, f.path, {}, fmt::format("{}: path escapes the model folder", f.path));
        continue;
      }
      auto p = dir / f.path;
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        results[i] = problem(Errc::checkpoint_incomplete, f.path, {}, fmt::format("{}: missing", f.path));
        continue;
      }
      if (static_cast<std::uint64_t>(st.st_size) != f.size) {
        results[i] = problem(Errc::size_mismatch, f.path, {},
                             fmt::format("{}: {} bytes on disk, the listing says {}", f.path, st.st_size, f.size));
        continue;
      }
      const bool lfs = f.is_lfs();
      const std::string expected = util::ascii_lower(lfs ? *f.lfs_sha256 : f.blob_id);
      int err = 0;
      std::string got = hash_file(p.string(), lfs ? HashKind::sha256 : HashKind::git_sha1, f.size, err);
      if (err != 0) {
        results[i] = problem(Errc::io_error, f.path, {}, fmt::format("{}: read: {}", f.path, std::strerror(err)));
      } else if (got != expected) {
        results[i] = problem(Errc::checksum_mismatch, f.path, {},
                             fmt::format("{}: {} is {}, the listing says {}", f.path, lfs ? "sha256" : "git blob sha1",
                                         got, expected));
      }
    }
  };
  unsigned n = std::max(1u, std::min<unsigned>(parallel, static_cast<unsigned>(std::min<std::size_t>(files.size(), 1024))));
  {
    std::vector<std::jthread> threads;
    for (unsigned t = 1; t < n; ++t) threads.emplace_back(worker);
    worker();
  }
  Report report;
  for (auto& r : results)
    if (r) report.problems.push_back(std::move(*r));
  return report;
}

std::vector<std::string> needed_but_filtered(const std::vector<repo::RepoFile>& all,
                                             const std::vector<repo::RepoFile>& kept) {
  std::set<std::string> kept_paths;
  for (const auto& f : kept) kept_paths.insert(f.path);

  // Before the download the index cannot be read, so its shards are recognised by name: in the
  // index's folder and starting with its prefix ("model" for model.safetensors.index.json:
  // model-00001-of-00064.safetensors). Other safetensors beside it (Mistral's
  // consolidated.safetensors) are another format of the same weights and may be dropped;
  // check_structure still checks the real index after the download.
  std::vector<std::pair<std::string, std::string>> indexes;  // (folder, prefix)
  for (const auto& path : kept_paths)
    if (ends_with(path, kIndexSuffix)) {
      auto name = basename(path);
      indexes.emplace_back(std::string(dirname(path)), std::string(name.substr(0, name.size() - kIndexSuffix.size())));
    }

  std::vector<std::string> needed;
  for (const auto& f : all) {
    if (kept_paths.count(f.path)) continue;
    bool need = is_tokenizer_file(f.path);
    if (!need && ends_with(f.path, kShardSuffix)) {
      auto folder = dirname(f.path);
      auto name = basename(f.path);
      for (const auto& [idx_folder, prefix] : indexes)
        if (folder == idx_folder && name.substr(0, prefix.size()) == prefix) need = true;
    }
    if (need) needed.push_back(f.path);
  }
  return needed;
}

}  // namespace modeld::verify
