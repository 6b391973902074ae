// The store's layout: revision folders, the model link and its atomic switch, listing and
// deletion. Deletion never follows a symlink, so a link planted inside a model folder cannot make
// modeld delete anything outside models_dir.

#include "store/store.hpp"

#include "store/store_detail.hpp"
#include "util/files.hpp"
#include "repo/ids.hpp"
#include "util/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <set>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

namespace modeld::store {

namespace fs = std::filesystem;

namespace detail {

bool valid_commit(std::string_view commit) {
  if (commit.empty() || commit.size() > 128 || commit.front() == '.') return false;
  return std::all_of(commit.begin(), commit.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

Result<void> check_names(std::string_view name, std::string_view commit) {
  if (!repo::valid_model_name(name))
    return make_error(Errc::bad_request, fmt::format("model name '{}' is not valid", name));
  if (!valid_commit(commit))
    return make_error(Errc::bad_request, fmt::format("model {}: commit '{}' is not a valid folder name", name, commit));
  return {};
}

namespace {
template <class F>
void walk_files(const fs::path& root, F&& on_file) {
  std::error_code ec;
  // The default options do not follow directory symlinks; lstat keeps file symlinks out too.
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) on_file(it->path(), st);
  }
}
}  // namespace

std::uint64_t tree_bytes(const fs::path& root, std::set<InodeKey>& seen) {
  std::uint64_t total = 0;
  walk_files(root, [&](const fs::path&, const struct stat& st) {
    if (seen.emplace(static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)).second)
      total += static_cast<std::uint64_t>(st.st_size);
  });
  return total;
}

void collect_inodes(const fs::path& root, std::set<InodeKey>& seen) {
  walk_files(root, [&](const fs::path&, const struct stat& st) {
    seen.emplace(static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino));
  });
}

// Sub-folders of `dir` that are real directories (never symlinks), sorted.
std::vector<std::string> subdirectories(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISDIR(st.st_mode)) out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_real_directory(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace detail

namespace {

using detail::is_real_directory;
using detail::subdirectories;

std::atomic<unsigned> temp_counter{0};

}  // namespace

Store::Store(fs::path models_dir) : models_dir_(std::move(models_dir)) {}

fs::path Store::revision_dir(const std::string& name, const std::string& commit) const {
  return models_dir_ / ".store" / name / commit;
}

fs::path Store::model_path(const std::string& name) const { return models_dir_ / name; }

Result<void> Store::prepare_revision(const std::string& name, const std::string& commit) {
  if (auto r = detail::check_names(name, commit); !r) return r.error();
  auto dir = revision_dir(name, commit) / metadata_dir / "partial";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(Errc::io_error, fmt::format("{}: create directory: {}", dir.string(), ec.message()));
  return {};
}

std::optional<std::string> Store::linked_commit(const std::string& name) const {
  if (!repo::valid_model_name(name)) return std::nullopt;
  char buf[4096];
  ssize_t n = ::readlink(model_path(name).c_str(), buf, sizeof buf - 1);
  if (n < 0) return std::nullopt;
  fs::path target(std::string(buf, static_cast<std::size_t>(n)));
  // Only a link of the form switch_link() writes names a revision of ours.
  if (target.parent_path() != fs::path(".store") / name) return std::nullopt;
  auto commit = target.filename().string();
  if (!detail::valid_commit(commit)) return std::nullopt;
  return commit;
}

Result<void> Store::switch_link(const std::string& name, const std::string& commit) {
  if (auto r = detail::check_names(name, commit); !r) return r.error();
  if (!is_real_directory(revision_dir(name, commit)))
    return make_error(Errc::not_found, fmt::format("{}: no such revision folder", revision_dir(name, commit).string()));
  const auto link = model_path(name);
  // The temporary name starts with '.', so list() never takes it for a model.
  const auto tmp = models_dir_ / fmt::format(".{}.link-{}-{}", name, ::getpid(), temp_counter.fetch_add(1));
  ::unlink(tmp.c_str());
  const auto target = fs::path(".store") / name / commit;  // relative: the tree may be moved or bind-mounted
  if (::symlink(target.c_str(), tmp.c_str()) != 0) return util::errno_error(errno, tmp, "symlink");
  // rename(2) replaces the old link in one step: a reader sees the old or the new revision.
  if (::rename(tmp.c_str(), link.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return util::errno_error(err, link, "replace link");
  }
  return util::fsync_directory(models_dir_);
}

namespace {

// "X.link-PID-N" with X not empty: the temporary names of switch_link (".NAME.link-PID-N") and of
// planning's hard links into a revision (manifest.cpp's link_over: "FILE.link-PID-N").
bool is_link_temp_name(const std::string& f) {
  const auto at = f.rfind(".link-");
  if (at == std::string::npos || at == 0) return false;
  const auto rest = std::string_view(f).substr(at + 6);
  const auto dash = rest.find('-');
  auto digits = [](std::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dash != std::string_view::npos && digits(rest.substr(0, dash)) && digits(rest.substr(dash + 1));
}

// The paths (relative to the revision) its manifest lists; none when it has no manifest.
std::set<std::string> listed_paths(const Store& store, const std::string& name, const std::string& commit) {
  std::set<std::string> out;
  if (auto m = store.read_manifest(name, commit); m && *m)
    for (const auto& f : (*m)->files) out.insert(f.path);
  return out;
}

// The regular files under revision `rev` with a hard-link temporary's name (modeld's own folder
// left out), relative to `rev`.
std::vector<std::string> link_temps_in(const fs::path& rev) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(rev, ec), end; !ec && it != end; it.increment(ec)) {
    const auto rel = it->path().lexically_relative(rev).generic_string();
    if (it->is_directory(ec) && !it->is_symlink(ec) && is_reserved_path(rel)) {
      it.disable_recursion_pending();
      continue;
    }
    struct stat st {};
    if (is_link_temp_name(it->path().filename().string()) && ::lstat(it->path().c_str(), &st) == 0 &&
        S_ISREG(st.st_mode))
      out.push_back(rel);
  }
  return out;
}

// Removes the hard-link temporaries of revision `commit` of `name` that its manifest does not
// list (read only when there is one); appends their paths relative to `models_dir` to `removed`.
void remove_revision_link_temps(const Store& store, const std::string& name, const std::string& commit,
                                std::vector<std::string>& removed) {
  const auto rev = store.revision_dir(name, commit);
  const auto temps = link_temps_in(rev);
  if (temps.empty()) return;
  const auto listed = listed_paths(store, name, commit);
  std::set<fs::path> touched;
  for (const auto& rel : temps) {
    const auto p = rev / rel;
    if (listed.contains(rel) || ::unlink(p.c_str()) != 0) continue;
    removed.push_back(p.lexically_relative(store.models_dir()).generic_string());
    touched.insert(p.parent_path());
  }
  for (const auto& d : touched) (void)util::fsync_directory(d);
}

}  // namespace

std::vector<std::string> Store::remove_link_temps() const {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(models_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    auto f = it->path().filename().string();
    struct stat st {};
    if (f[0] != '.' || !is_link_temp_name(f) || ::lstat(it->path().c_str(), &st) != 0 || !S_ISLNK(st.st_mode))
      continue;
    if (::unlink(it->path().c_str()) == 0) removed.push_back(std::move(f));
  }
  if (!removed.empty()) (void)util::fsync_directory(models_dir_);
  // The revisions themselves, not list(), which would also sum every model's bytes.
  const auto store_root = models_dir_ / ".store";
  if (!is_real_directory(store_root)) return removed;
  for (const auto& n : subdirectories(store_root))
    if (repo::valid_model_name(n) && is_real_directory(store_root / n))
      for (const auto& c : subdirectories(store_root / n))
        if (detail::valid_commit(c)) remove_revision_link_temps(*this, n, c, removed);
  return removed;
}

std::uint64_t Store::partial_bytes(const std::string& name, const std::string& commit) const {
  if (!detail::check_names(name, commit)) return 0;
  std::uint64_t total = 0;
  std::error_code ec;
  const auto root = revision_dir(name, commit) / metadata_dir / "partial";
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const auto fname = it->path().filename().string();
    auto ends = [&](std::string_view s) { return fname.size() >= s.size() && fname.compare(fname.size() - s.size(), s.size(), s) == 0; };
    if (ends(partial_sidecar_suffix) || ends(".json")) continue;
    total += static_cast<std::uint64_t>(st.st_size);
  }
  return total;
}

std::vector<StoredModel> Store::list() const {
  std::map<std::string, StoredModel> found;
  const auto store_root = models_dir_ / ".store";
  if (is_real_directory(store_root))
    for (const auto& n : subdirectories(store_root))
      if (repo::valid_model_name(n)) found[n].name = n;
  std::error_code ec;
  for (fs::directory_iterator it(models_dir_, ec), end; !ec && it != end; it.increment(ec)) {
    auto n = it->path().filename().string();
    struct stat st {};
    // Only links of ours: a symlink an operator put there (a folder to adopt) is not a model of
    // the store, and eviction must never take it for one.
    if (repo::valid_model_name(n) && ::lstat(it->path().c_str(), &st) == 0 && S_ISLNK(st.st_mode) && linked_commit(n))
      found[n].name = n;
  }
  std::vector<StoredModel> out;
  for (auto& [n, m] : found) {
    m.linked_commit = linked_commit(n);
    const auto dir = store_root / n;
    if (is_real_directory(store_root) && is_real_directory(dir)) {
      for (auto& c : subdirectories(dir))
        if (detail::valid_commit(c)) m.commits.push_back(c);
      std::set<detail::InodeKey> seen;
      m.size_bytes = detail::tree_bytes(dir, seen);
    }
    out.push_back(std::move(m));
  }
  return out;
}

Result<std::uint64_t> Store::remove_model(const std::string& name) {
  if (!repo::valid_model_name(name))
    return make_error(Errc::bad_request, fmt::format("model name '{}' is not valid", name));
  const auto store_root = models_dir_ / ".store";
  struct stat st {};
  if (::lstat(store_root.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return make_error(Errc::io_error, fmt::format("{}: not a directory; refusing to delete through it", store_root.string()));

  const auto link = model_path(name);
  if (::lstat(link.c_str(), &st) == 0) {
    if (!S_ISLNK(st.st_mode))
      return make_error(Errc::io_error,
                        fmt::format("{}: not a link made by modeld; left alone, nothing deleted", link.string()));
  } else if (errno != ENOENT) {
    return util::errno_error(errno, link, "stat");
  }

  const auto dir = store_root / name;
  std::set<detail::InodeKey> seen;
  std::uint64_t freed = is_real_directory(dir) ? detail::tree_bytes(dir, seen) : 0;
  // Files other models share by hard link (an adoption from this model's store) keep their
  // manifests true. Held from the first unlink (the link's) on, so read_if_settled readers never
  // walk models_dir while this deletion may wait on the disk.
  detail::Relinking relinking(*this, seen, [&](const std::string& n, const std::string&) { return n == name; });
  if (::unlink(link.c_str()) != 0 && errno != ENOENT) return util::errno_error(errno, link, "remove link");
  std::error_code ec;
  // remove_all deletes a symlink itself, never what it points to.
  fs::remove_all(dir, ec);
  relinking.finish();
  if (ec) return make_error(Errc::io_error, fmt::format("{}: remove: {}", dir.string(), ec.message()));
  if (auto r = util::fsync_directory(models_dir_); !r) return r.error();
  return freed;
}

Result<std::uint64_t> Store::remove_other_revisions(const std::string& name, const std::string& keep_commit,
                                                    const std::vector<std::string>& spare) {
  if (auto r = detail::check_names(name, keep_commit); !r) return r.error();
  // The revision the link points to is never deleted, even when the caller names another.
  const auto linked = linked_commit(name);
  return remove_revisions_if(name, [&](const std::string& c) {
    return c != keep_commit && !(linked && c == *linked) && std::find(spare.begin(), spare.end(), c) == spare.end();
  });
}

Result<std::uint64_t> Store::remove_revision(const std::string& name, const std::string& commit) {
  if (auto r = detail::check_names(name, commit); !r) return r.error();
  if (!repo::is_commit_id(commit))
    return make_error(Errc::bad_request, fmt::format("'{}' is not a commit id (40 hex digits)", commit));
  const auto rev = revision_dir(name, commit);
  if (!is_real_directory(models_dir_ / ".store") || !is_real_directory(rev))
    return make_error(Errc::not_found, fmt::format("model {} has no revision {} on disk", name, commit));
  // A link to the revision would dangle: it goes first (the caller refuses the one in service).
  if (linked_commit(name) == commit) {
    const auto link = model_path(name);
    if (::unlink(link.c_str()) != 0 && errno != ENOENT) return util::errno_error(errno, link, "remove link");
    if (auto r = util::fsync_directory(models_dir_); !r) return r.error();
  }
  auto freed = remove_revisions_if(name, [&](const std::string& c) { return c == commit; });
  if (!freed) return freed;
  // The model's last revision gone: its empty folder goes too, so the model reads as absent, not
  // partial (rmdir(2) removes nothing else: it fails on a folder that still holds anything).
  const auto store_root = models_dir_ / ".store";
  if (::rmdir((store_root / name).c_str()) == 0)
    if (auto r = util::fsync_directory(store_root); !r) return r.error();
  return freed;
}

Result<std::uint64_t> Store::remove_revisions_if(const std::string& name,
                                                 const std::function<bool(const std::string&)>& doomed_if) {
  const auto store_root = models_dir_ / ".store";
  const auto dir = store_root / name;
  if (!is_real_directory(store_root) || !is_real_directory(dir)) return std::uint64_t{0};
  // Files the kept revisions share by hard link are not freed by deleting the others.
  std::set<detail::InodeKey> seen;
  std::vector<std::string> doomed;
  std::set<detail::InodeKey> unlinked;  // inodes whose link count the removal changes
  for (const auto& c : subdirectories(dir)) {
    if (!doomed_if(c)) {
      detail::collect_inodes(dir / c, seen);
      continue;
    }
    doomed.push_back(c);
    detail::collect_inodes(dir / c, unlinked);
  }
  detail::Relinking relinking(*this, unlinked, [&](const std::string& n, const std::string& c) {
    return n == name && doomed_if(c);
  });
  std::uint64_t freed = 0;
  for (const auto& c : doomed) {
    const auto rev = dir / c;
    std::uint64_t bytes = detail::tree_bytes(rev, seen);
    std::error_code ec;
    fs::remove_all(rev, ec);
    if (ec) return make_error(Errc::io_error, fmt::format("{}: remove: {}", rev.string(), ec.message()));
    freed += bytes;
  }
  relinking.finish();
  if (auto r = util::fsync_directory(dir); !r) return r.error();
  return freed;
}

}  // namespace modeld::store
