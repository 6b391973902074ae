// Keeping manifests true across modeld's own links and unlinks (detail::Relinking): a hard link
// made or removed changes the link count, hence the ctime, of every file sharing the inode, and
// the ctime is part of the identity a manifest records. Only the ctime of a file that had its
// recorded identity before the operation, and whose device, inode, size and mtime did not change,
// is re-recorded: an edit in place, a replacement or a truncation stays visible.

#include "store/store_detail.hpp"

#include "util/text.hpp"

namespace modeld::store::detail {

Relinking::Relinking(Store& store, const std::set<InodeKey>& inodes, const Skip& skip)
    : store_(store), lock_(store.relinking_) {
  if (inodes.empty()) return;
  const auto root = store_.models_dir() / ".store";
  if (!is_real_directory(root)) return;
  for (const auto& name : subdirectories(root)) {
    for (const auto& commit : subdirectories(root / name))
      if (check_names(name, commit) && !(skip && skip(name, commit))) remember(name, commit, inodes);
  }
}

void Relinking::remember(const std::string& name, const std::string& commit, const std::set<InodeKey>& inodes) {
  auto m = store_.read_manifest(name, commit);
  if (!m || !*m) return;
  Recorded r{name, std::move(**m), {}};
  const auto dir = store_.revision_dir(name, commit);
  for (std::size_t i = 0; i < r.manifest.files.size(); ++i) {
    const auto& f = r.manifest.files[i];
    if (!inodes.contains({f.identity.device, f.identity.inode}) || !util::safe_relative_path(f.path)) continue;
    if (auto id = identity_of(dir / f.path); id && *id == f.identity) r.files.push_back(i);
  }
  if (!r.files.empty()) recorded_.push_back(std::move(r));
}

void Relinking::finish() {
  for (auto& r : recorded_) {
    const auto dir = store_.revision_dir(r.name, r.manifest.commit);
    bool changed = false;
    for (auto i : r.files) {
      auto& f = r.manifest.files[i];
      auto id = identity_of(dir / f.path);
      if (!id || *id == f.identity || !id->same_but_ctime(f.identity)) continue;
      f.identity.ctime_ns = id->ctime_ns;
      changed = true;
    }
    if (changed) (void)store_.write_manifest(r.name, r.manifest);
  }
  recorded_.clear();
  if (lock_.owns_lock()) lock_.unlock();
}

}  // namespace modeld::store::detail
