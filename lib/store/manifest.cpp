// Manifests (the record that a revision was verified), their fast re-check by file identity,
// and hard-linking unchanged files from older verified revisions.

#include "store/store.hpp"
#include "util/json.hpp"

#include "store/store_detail.hpp"
#include "util/files.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <map>
#include <set>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

namespace modeld::store {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::size_t kMaxManifestBytes = 64u << 20;

fs::path manifest_path(const fs::path& revision) { return revision / metadata_dir / "manifest.json"; }

json to_json(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"path", f.path},
                     {"size", f.size},
                     {"sha256", f.sha256},
                     {"git_sha1", f.git_sha1},
                     {"identity",
                      {{"dev", f.identity.device},
                       {"ino", f.identity.inode},
                       {"size", f.identity.size},
                       {"mtime_ns", f.identity.mtime_ns},
                       {"ctime_ns", f.identity.ctime_ns}}}});
  return {{"repo", m.repo},
          {"revision", m.revision},
          {"commit", m.commit},
          {"verified_at", m.verified_at},
          {"files", std::move(files)}};
}

// Throws nlohmann::json::exception on a missing or mistyped field; the caller turns it into an Error.
Manifest from_json(const json& j) {
  Manifest m;
  m.repo = j.at("repo").get<std::string>();
  m.revision = j.at("revision").get<std::string>();
  m.commit = j.at("commit").get<std::string>();
  m.verified_at = j.at("verified_at").get<std::string>();
  for (const auto& f : j.at("files")) {
    ManifestFile mf;
    mf.path = f.at("path").get<std::string>();
    mf.size = f.at("size").get<std::uint64_t>();
    mf.sha256 = f.at("sha256").get<std::string>();
    mf.git_sha1 = f.at("git_sha1").get<std::string>();
    const auto& id = f.at("identity");
    mf.identity.device = id.at("dev").get<std::uint64_t>();
    mf.identity.inode = id.at("ino").get<std::uint64_t>();
    mf.identity.size = id.at("size").get<std::uint64_t>();
    mf.identity.mtime_ns = id.at("mtime_ns").get<std::int64_t>();
    mf.identity.ctime_ns = id.at("ctime_ns").get<std::int64_t>();
    m.files.push_back(std::move(mf));
  }
  return m;
}

// The path-independent content key a file is matched by across revisions: sha256 for LFS
// files, the git blob sha1 otherwise, and the size.
std::string content_key(const std::string& sha256, const std::string& git_sha1, std::uint64_t size) {
  return sha256.empty() ? fmt::format("sha1:{}:{}", git_sha1, size) : fmt::format("sha256:{}:{}", sha256, size);
}

std::atomic<unsigned> temp_counter{0};

}  // namespace

std::uint64_t Manifest::size_bytes() const {
  std::set<detail::InodeKey> seen;
  std::uint64_t total = 0;
  for (const auto& f : files)
    if (f.identity.inode == 0 || seen.emplace(f.identity.device, f.identity.inode).second) total = util::add_bytes(total, f.size);
  return total;
}

Result<std::optional<Manifest>> Store::read_manifest(const std::string& name, const std::string& commit) const {
  if (auto r = detail::check_names(name, commit); !r) return r.error();
  const auto path = manifest_path(revision_dir(name, commit));
  auto text = util::read_file(path, kMaxManifestBytes);
  if (!text) {
    if (text.error().code == Errc::not_found) return std::optional<Manifest>{};
    return make_error(Errc::io_error, text.error().message);
  }
  try {
    return std::optional<Manifest>(from_json(json::parse(*text)));
  } catch (const json::exception& e) {
    return make_error(Errc::io_error, fmt::format("{}: not a valid manifest: {}", path.string(), e.what()));
  }
}

Result<void> Store::write_manifest(const std::string& name, const Manifest& manifest) {
  if (auto r = detail::check_names(name, manifest.commit); !r) return r.error();
  const auto path = manifest_path(revision_dir(name, manifest.commit));
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return make_error(Errc::io_error, fmt::format("{}: create directory: {}", path.parent_path().string(), ec.message()));
  return util::write_file_atomically(path, util::dump_json(to_json(manifest), 1) + "\n");
}

std::vector<std::string> Store::changed_since_verification(const std::string& name, const std::string& commit) const {
  std::vector<std::string> out;
  auto m = read_manifest(name, commit);
  if (!m || !*m || (*m)->commit != commit) return out;
  const auto dir = revision_dir(name, commit);
  for (const auto& f : (*m)->files) {
    if (!util::safe_relative_path(f.path)) continue;
    auto now = identity_of(dir / f.path);
    if (!now || !now->same_but_ctime(f.identity)) out.push_back(f.path);
  }
  return out;
}

bool Store::manifest_still_matches(const std::string& name, const std::string& commit) const {
  return check_manifest(name, commit) == ManifestCheck::matches;
}

ManifestCheck Store::check_manifest(const std::string& name, const std::string& commit) const {
  auto m = read_manifest(name, commit);
  if (m && !*m) return ManifestCheck::absent;
  if (!m || (*m)->commit != commit) return ManifestCheck::changed;
  const auto dir = revision_dir(name, commit);
  for (const auto& f : (*m)->files) {
    if (!util::safe_relative_path(f.path)) return ManifestCheck::changed;
    auto id = identity_of(dir / f.path);
    if (!id || *id != f.identity || id->size != f.size) return ManifestCheck::changed;
  }
  return ManifestCheck::matches;
}

bool Store::read_if_settled(const std::function<void()>& read) const {
  std::shared_lock settled(relinking_, std::try_to_lock);
  if (!settled.owns_lock()) return false;
  read();
  return true;
}

bool Store::manifest_still_matches_settled(const std::string& name, const std::string& commit) const {
  std::shared_lock settled(relinking_);
  return manifest_still_matches(name, commit);
}

Result<std::vector<repo::RepoFile>> Store::link_unchanged_and_list_missing(const std::string& name,
                                                                          const repo::Snapshot& snapshot,
                                                                          std::vector<std::string>* changed) {
  auto found = find_missing(name, snapshot, true);
  if (!found) return found.error();
  if (changed) *changed = std::move(found->changed);
  return std::move(found->missing);
}

Result<MissingFiles> Store::plan_missing(const std::string& name, const repo::Snapshot& snapshot) {
  return find_missing(name, snapshot, false);
}

namespace {

// A verified revision of the same model that planning may hard-link unchanged files from.
struct Source {
  std::string commit;
  Manifest manifest;
};

// Every revision of `name` other than `commit` whose manifest can be read (one that cannot is
// simply not a source).
std::vector<Source> link_sources(const Store& store, const std::string& name, const std::string& commit) {
  std::vector<Source> sources;
  struct stat st {};
  const auto model_root = store.models_dir() / ".store" / name;
  if (::lstat(model_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return sources;
  std::error_code ec;
  for (fs::directory_iterator it(model_root, ec), end; !ec && it != end; it.increment(ec)) {
    auto c = it->path().filename().string();
    if (c == commit || !detail::valid_commit(c)) continue;
    if (auto m = store.read_manifest(name, c); m && *m) sources.push_back({c, std::move(**m)});
  }
  return sources;
}

// Where each content key can be found in `sources`: key -> (source, file) indices.
using KeyIndex = std::map<std::string, std::vector<std::pair<std::size_t, std::size_t>>>;

KeyIndex index_by_content(const std::vector<Source>& sources) {
  KeyIndex by_key;
  for (std::size_t s = 0; s < sources.size(); ++s)
    for (std::size_t i = 0; i < sources[s].manifest.files.size(); ++i) {
      const auto& mf = sources[s].manifest.files[i];
      if (util::safe_relative_path(mf.path)) by_key[content_key(mf.sha256, mf.git_sha1, mf.size)].emplace_back(s, i);
    }
  return by_key;
}

// Hard-links `src` to `dest` under a temporary name renamed over whatever stale file is in the
// way; false when that fails (e.g. EXDEV, EMLINK: the file is downloaded instead).
bool link_over(const fs::path& src, const fs::path& dest) {
  std::error_code ec;
  fs::create_directories(dest.parent_path(), ec);
  if (ec) return false;
  auto tmp = dest;
  tmp += fmt::format(".link-{}-{}", ::getpid(), temp_counter.fetch_add(1));
  ::unlink(tmp.c_str());
  if (::link(src.c_str(), tmp.c_str()) != 0) return false;
  if (::rename(tmp.c_str(), dest.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

// Whether the store holds `f`'s content in a file of `sources` that still has its verified
// identity (only such a file is trusted without re-hashing); when `link`, also whether linking
// it to `dest` succeeded (the dry run stops at the decision).
bool link_unchanged(const Store& store, const std::string& name, const std::vector<Source>& sources,
                    const KeyIndex& by_key, const repo::RepoFile& f, const fs::path& dest, bool link) {
  auto found = by_key.find(f.lfs_sha256 ? content_key(*f.lfs_sha256, "", f.size) : content_key("", f.blob_id, f.size));
  if (found == by_key.end()) return false;
  for (auto [s, i] : found->second) {
    const auto& mf = sources[s].manifest.files[i];
    const auto src = store.revision_dir(name, sources[s].commit) / mf.path;
    auto before = identity_of(src);
    if (!before || *before != mf.identity) continue;
    if (!link || link_over(src, dest)) return true;
  }
  return false;
}

}  // namespace

Result<MissingFiles> Store::find_missing(const std::string& name, const repo::Snapshot& snapshot, bool link) {
  if (auto r = detail::check_names(name, snapshot.commit); !r) return r.error();
  for (const auto& f : snapshot.files)
    if (!util::safe_relative_path(f.path))
      return make_error(Errc::plan_invalid, fmt::format("{}: path escapes the model folder", f.path));
  const auto target = revision_dir(name, snapshot.commit);
  if (link) {
    std::error_code ec;
    fs::create_directories(target, ec);
    if (ec) return make_error(Errc::io_error, fmt::format("{}: create directory: {}", target.string(), ec.message()));
  }

  // Verified revisions of the same model, and where each content key can be found in them.
  const auto sources = link_sources(*this, name, snapshot.commit);
  const auto by_key = index_by_content(sources);

  // Linking changes the ctime of the sources' files: the manifests that record them (the sources'
  // and any other) are re-recorded after, and nothing checks them half-way.
  std::optional<detail::Relinking> relinking;
  if (link) {
    std::set<detail::InodeKey> inodes;
    for (const auto& s : sources)
      for (const auto& mf : s.manifest.files) inodes.emplace(mf.identity.device, mf.identity.inode);
    relinking.emplace(*this, inodes);
  }

  MissingFiles out;
  const auto changed = changed_since_verification(name, snapshot.commit);
  const std::set<std::string> damaged(changed.begin(), changed.end());
  for (const auto& f : snapshot.files) {
    const auto dest = target / f.path;
    struct stat st {};
    if (::lstat(dest.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == f.size) {
      // Verified once and changed since (an edit in place, a copy over it): downloaded again,
      // promoted by rename over it only once it hashes right.
      if (damaged.contains(f.path)) {
        out.changed.push_back(f.path);
        out.missing.push_back(f);
        continue;
      }
      out.present_bytes = util::add_bytes(out.present_bytes, f.size);
      continue;  // present; its hash is checked by the fetch engine or verification later
    }
    if (link_unchanged(*this, name, sources, by_key, f, dest, link))
      out.linkable_bytes = util::add_bytes(out.linkable_bytes, f.size);
    else
      out.missing.push_back(f);
  }

  if (relinking) relinking->finish();
  return out;
}

}  // namespace modeld::store
