// Adopting a model folder made outside modeld (`hf download --local-dir`, or a copy by hand at
// models_dir/NAME): every file is hashed against the listing before it joins a revision, and
// joins it as a hard link, so the folder itself is never modified and no byte is copied.
// `hf download`'s own records only spare hashing files they prove stale.

#include "store/store.hpp"

#include "store/store_detail.hpp"
#include "util/files.hpp"
#include "repo/ids.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "verify/verify.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace modeld::store {

namespace fs = std::filesystem;

namespace {

std::atomic<unsigned> adopt_counter{0};

// The first component of `rel` below `root` that is a symlink or not a directory, else "".
std::string link_on_the_way(const fs::path& root, const std::string& rel) {
  fs::path at = root;
  const fs::path r(rel);
  for (auto it = r.begin(); it != r.end(); ++it) {
    at /= *it;
    if (std::next(it) == r.end()) break;
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) return at.string();
    if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) return at.string();
  }
  return {};
}

}  // namespace

std::optional<HfDownloadRecord> read_hf_download_record(const fs::path& folder, const std::string& path) {
  if (!util::safe_relative_path(path)) return std::nullopt;
  const auto record = folder / ".cache" / "huggingface" / "download" / (path + ".metadata");
  auto text = util::read_file(record, 4096);
  if (!text) return std::nullopt;
  HfDownloadRecord out;
  std::size_t pos = 0;
  std::string lines[3];
  for (auto& line : lines) {
    const auto nl = text->find('\n', pos);
    if (nl == std::string::npos && pos >= text->size()) return std::nullopt;
    line = std::string(util::trim(std::string_view(*text).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos)));
    pos = nl == std::string::npos ? text->size() : nl + 1;
  }
  out.commit = lines[0];
  out.etag = util::ascii_lower(lines[1]);
  char* end = nullptr;
  out.timestamp = std::strtod(lines[2].c_str(), &end);
  if (out.etag.empty() || lines[2].empty() || end != lines[2].c_str() + lines[2].size()) return std::nullopt;
  // A file written after its record is no longer what the record describes (1 s of slack for
  // coarse mtimes, as huggingface_hub allows).
  struct stat st {};
  if (::stat((folder / path).c_str(), &st) != 0) return std::nullopt;
  const double mtime = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec / 1e9;
  if (mtime - 1 > out.timestamp) return std::nullopt;
  return out;
}

std::optional<fs::path> Store::foreign_folder(const std::string& name) const {
  if (!repo::valid_model_name(name)) return std::nullopt;
  const auto p = model_path(name);
  struct stat lst {}, st {};
  if (::lstat(p.c_str(), &lst) != 0) return std::nullopt;
  if (S_ISDIR(lst.st_mode)) return p;
  if (!S_ISLNK(lst.st_mode) || linked_commit(name)) return std::nullopt;
  if (::stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return std::nullopt;
  return p;
}

Result<Adoption> Store::scan_adoption(const std::string& name, const std::string& commit,
                                      const std::vector<repo::RepoFile>& files, const fs::path& folder) const {
  if (auto r = detail::check_names(name, commit); !r) return r.error();
  Adoption out;
  out.folder = folder;
  struct stat st {};
  out.hf_metadata = ::stat((folder / ".cache" / "huggingface" / "download").c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  // Hard links need the store's file system; models_dir/.store may not exist yet in a dry run.
  struct stat store_st {};
  if (::stat((models_dir_ / ".store").c_str(), &store_st) != 0 && ::stat(models_dir_.c_str(), &store_st) != 0)
    return util::errno_error(errno, models_dir_, "stat");

  for (const auto& f : files) {
    if (!util::safe_relative_path(f.path)) continue;  // planning refuses such listings before this
    const auto src = folder / f.path;
    if (::lstat(src.c_str(), &st) != 0) continue;  // simply not there: downloaded
    if (auto via = link_on_the_way(folder, f.path); !via.empty()) {
      out.rejected.push_back({f.path, fmt::format("{}: reached through {}, a symbolic link or not a folder",
                                                   src.string(), via)});
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      out.rejected.push_back({f.path, fmt::format("{}: {}", src.string(),
                                                  S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file")});
      continue;
    }
    if (static_cast<std::uint64_t>(st.st_size) != f.size) {
      out.rejected.push_back(
          {f.path, fmt::format("{}: {} bytes, the listing says {}", src.string(), st.st_size, f.size)});
      continue;
    }
    if (st.st_dev != store_st.st_dev) {
      out.rejected.push_back({f.path, fmt::format("{}: on another file system than {}; it would have to be copied, "
                                                  "so it is downloaded (move the folder under models_dir to adopt it)",
                                                  src.string(), models_dir_.string())});
      continue;
    }
    const std::string want = util::ascii_lower(f.is_lfs() ? *f.lfs_sha256 : f.blob_id);
    if (auto rec = read_hf_download_record(folder, f.path); rec && rec->etag != want) {
      out.rejected.push_back({f.path, fmt::format("{}: hf download recorded {} (commit {}), the listing says {}",
                                                  src.string(), rec->etag, rec->commit, want)});
      continue;
    }
    out.candidates.push_back(f);
    out.candidate_bytes = util::add_bytes(out.candidate_bytes, f.size);
  }
  return out;
}

Result<Adoption> Store::adopt(const std::string& name, const std::string& commit,
                              const std::vector<repo::RepoFile>& files, const fs::path& folder, unsigned parallel) {
  auto scanned = scan_adoption(name, commit, files, folder);
  if (!scanned) return scanned.error();
  Adoption out = std::move(*scanned);
  if (out.candidates.empty()) return out;

  // What each file looked like before hashing: a file that changes meanwhile is not adopted.
  std::map<std::string, FileIdentity> before;
  for (const auto& f : out.candidates)
    if (auto id = identity_of(folder / f.path)) before.emplace(f.path, *id);

  const auto report = verify::check_hashes(folder, out.candidates, parallel);
  std::map<std::string, std::string> problems;
  for (const auto& p : report.problems) problems.emplace(p.file, p.message);

  // The folder's files may be hard links of a verified revision's (a copy made with `cp -al`, a
  // symlink into the store): linking them changes ctimes those manifests record.
  std::set<detail::InodeKey> inodes;
  for (const auto& [path, id] : before) inodes.emplace(id.device, id.inode);
  detail::Relinking relinking(*this, inodes);
  const auto target = revision_dir(name, commit);
  for (const auto& f : out.candidates) {
    const auto src = folder / f.path;
    if (auto bad = problems.find(f.path); bad != problems.end()) {
      out.rejected.push_back({f.path, fmt::format("{}/{}", folder.string(), bad->second)});
      continue;
    }
    auto now = identity_of(src);
    auto was = before.find(f.path);
    if (!now || was == before.end() || *now != was->second) {
      out.rejected.push_back({f.path, fmt::format("{}: changed while it was hashed", src.string())});
      continue;
    }
    const auto dest = target / f.path;
    std::error_code ec;
    fs::create_directories(dest.parent_path(), ec);
    if (ec)
      return make_error(Errc::io_error,
                        fmt::format("{}: create directory: {}", dest.parent_path().string(), ec.message()));
    auto tmp = dest;
    tmp += fmt::format(".adopt-{}-{}", ::getpid(), adopt_counter.fetch_add(1));
    ::unlink(tmp.c_str());
    if (::link(src.c_str(), tmp.c_str()) != 0) {
      const int err = errno;
      out.rejected.push_back({f.path, util::errno_error(err, src, "hard link into the store").message});
      continue;
    }
    if (::rename(tmp.c_str(), dest.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      out.rejected.push_back({f.path, util::errno_error(err, dest, "rename").message});
      continue;
    }
    out.adopted.push_back(f.path);
    out.adopted_bytes = util::add_bytes(out.adopted_bytes, f.size);
  }
  relinking.finish();
  if (!out.adopted.empty())
    if (auto r = util::fsync_directory(target); !r) return r.error();
  return out;
}

Result<std::optional<fs::path>> Store::set_aside_foreign(const std::string& name) {
  if (!repo::valid_model_name(name))
    return make_error(Errc::bad_request, fmt::format("model name '{}' is not valid", name));
  const auto p = model_path(name);
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<fs::path>{};
    return util::errno_error(errno, p, "stat");
  }
  if (S_ISLNK(st.st_mode) && linked_commit(name)) return std::optional<fs::path>{};
  const auto aside_root = models_dir_ / ".adopted";
  std::error_code ec;
  fs::create_directories(aside_root, ec);
  if (ec) return make_error(Errc::io_error, fmt::format("{}: create directory: {}", aside_root.string(), ec.message()));
  const auto stamp = util::compact_utc_stamp(std::chrono::system_clock::now());
  fs::path dest = aside_root / fmt::format("{}-{}", name, stamp);
  for (int n = 2; ::lstat(dest.c_str(), &st) == 0; ++n) dest = aside_root / fmt::format("{}-{}-{}", name, stamp, n);
  if (::rename(p.c_str(), dest.c_str()) != 0) return util::errno_error(errno, p, fmt::format("move to {}", dest.string()));
  if (auto r = util::fsync_directory(aside_root); !r) return r.error();
  if (auto r = util::fsync_directory(models_dir_); !r) return r.error();
  return std::optional<fs::path>(dest);
}

}  // namespace modeld::store
