#pragma once
// The on-disk store (../shared/docs/design.md "Store"): models_dir/.store/NAME/COMMIT/ holds one
// revision's files, models_dir/NAME is a symlink to the revision in service, switched with
// rename(2). Each revision's .modeld/manifest.json is written only after verification.
// Also: disk space and the eviction plan for freeing_disk.

#include "repo/snapshot.hpp"
#include "util/error.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

namespace modeld::store {

namespace detail {
class Relinking;
}

/// What was seen of one file when its revision was verified (for fast re-verification).
struct FileIdentity {
  std::uint64_t device = 0, inode = 0, size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
  /// Whether `other` is the same file with the same content as far as a stat tells (device, inode,
  /// size, mtime), whatever its ctime, which a hard link made or removed, or a chmod, moves.
  bool same_but_ctime(const FileIdentity& other) const {
    return device == other.device && inode == other.inode && size == other.size && mtime_ns == other.mtime_ns;
  }
};

/// One verified file of a manifest.
struct ManifestFile {
  std::string path;
  std::uint64_t size = 0;
  std::string sha256;    ///< LFS files; empty otherwise
  std::string git_sha1;  ///< the listing's blob id (of the pointer for LFS files)
  FileIdentity identity;
};

/// The record that a revision on disk is complete and verified.
struct Manifest {
  std::string repo;
  std::string revision;
  std::string commit;
  std::string verified_at;  ///< RFC 3339
  std::vector<ManifestFile> files;
  /// The sum of the files' sizes in bytes, files recorded with the same device and inode counted once.
  std::uint64_t size_bytes() const;
};

/// The folder inside each revision that holds modeld's own files (`manifest.json`, `partial/`):
/// no file of a repository may be stored under it.
inline constexpr std::string_view metadata_dir = ".modeld";

/// Whether the repository path `path` ('/'-separated) lies under metadata_dir, where a listed
/// file would be overwritten by, or overwrite, modeld's manifest and partial downloads.
constexpr bool is_reserved_path(std::string_view path) {
  return path == metadata_dir || (path.starts_with(metadata_dir) && path.size() > metadata_dir.size() &&
                                  path[metadata_dir.size()] == '/');
}

/// Name suffix of the sidecar the fetch engine keeps beside each partial download in
/// `.modeld/partial/` ("NAME.part" and "NAME.part.json", lib/fetch/partial.hpp); partial_bytes()
/// leaves sidecars out, as it does any other `*.json` file there.
inline constexpr std::string_view partial_sidecar_suffix = ".part.json";

/// Reads the identity of the file at `path` (lstat; a symlink is reported as io_error).
Result<FileIdentity> identity_of(const std::filesystem::path& path);

/// Free bytes for an unprivileged writer on the file system of `path` (statvfs f_bavail).
Result<std::uint64_t> free_bytes(const std::filesystem::path& path);

/// A model found on disk.
struct StoredModel {
  std::string name;
  std::optional<std::string> linked_commit;  ///< where models_dir/NAME points, if anywhere
  std::vector<std::string> commits;          ///< revisions under .store/NAME/
  std::uint64_t size_bytes = 0;              ///< all revisions, partial files included (hard links counted once)
};

/// What a revision still lacks (Store::plan_missing), in bytes as the listing gives them.
struct MissingFiles {
  std::vector<repo::RepoFile> missing;  ///< files to download
  std::uint64_t present_bytes = 0;     ///< listed files already in place with their listed size
  std::uint64_t linkable_bytes = 0;    ///< files another verified revision of the model holds unchanged
  /// Files of a revision verified before whose content may have changed since
  /// (Store::changed_since_verification): listed in `missing` too, to be downloaded again.
  std::vector<std::string> changed;
};

/// What `hf download --local-dir` recorded about one file it wrote, in
/// LOCAL_DIR/.cache/huggingface/download/PATH.metadata (huggingface_hub's _local_folder.py):
/// three lines, the commit, the ETag (the sha256 for LFS files, the git blob id otherwise) and
/// the Unix time the record was written.
struct HfDownloadRecord {
  std::string commit;
  std::string etag;
  double timestamp = 0;  ///< seconds since the epoch
};

/// Reads the record of repository path `path` in the local folder `folder`; nullopt when there is
/// none, it does not have that form, or the file was modified more than 1 s after the record was
/// written (huggingface_hub's own rule: the record no longer describes the file).
std::optional<HfDownloadRecord> read_hf_download_record(const std::filesystem::path& folder, const std::string& path);

/// One listed file that an adoption folder will not supply, and why (a sentence naming it).
struct NotAdopted {
  std::string path;
  std::string reason;
};

/// What a folder made outside modeld (an `hf download --local-dir` or a copy by hand at
/// models_dir/NAME) can supply of a revision (Store::scan_adoption, Store::adopt).
struct Adoption {
  std::filesystem::path folder;          ///< where the files were found
  bool hf_metadata = false;              ///< the folder has `hf download`'s .cache/huggingface/download/
  std::vector<repo::RepoFile> candidates; ///< present with the listed size and not known to differ
  std::uint64_t candidate_bytes = 0;
  std::vector<NotAdopted> rejected;      ///< present but unusable: size, recorded ETag, digest, symlink, file system
  std::vector<std::string> adopted;      ///< after adopt(): hashed, matched and hard-linked into the revision
  std::uint64_t adopted_bytes = 0;
};

/// What checking a revision against its manifest found (Store::check_manifest).
enum class ManifestCheck {
  absent,   ///< no manifest: the revision was never verified
  matches,  ///< every file still has its recorded identity and size
  changed,  ///< verified once, but a file changed or is gone, or the manifest cannot be read
};

/// The store under one models_dir.
class Store {
 public:
  explicit Store(std::filesystem::path models_dir);

  const std::filesystem::path& models_dir() const { return models_dir_; }
  /// models_dir/.store/NAME/COMMIT
  std::filesystem::path revision_dir(const std::string& name, const std::string& commit) const;
  /// models_dir/NAME (the path the serve command gets as {model_dir})
  std::filesystem::path model_path(const std::string& name) const;

  /// Creates models_dir/.store/NAME/COMMIT/.modeld/partial; returns io_error on failure.
  Result<void> prepare_revision(const std::string& name, const std::string& commit);

  /// The commit that models_dir/NAME points to, or nullopt when there is no link.
  std::optional<std::string> linked_commit(const std::string& name) const;

  /// Points models_dir/NAME at revision `commit` atomically (symlink + rename + directory fsync).
  Result<void> switch_link(const std::string& name, const std::string& commit);

  /// Removes, for the daemon's start, the temporaries a modeld killed between a link and its rename
  /// left: switch_link's (".NAME.link-PID-N", symlinks only) in models_dir, and planning's hard
  /// links ("FILE.link-PID-N", regular files its manifest does not list) in each revision; returns
  /// their paths relative to models_dir. Blocks on the disk.
  std::vector<std::string> remove_link_temps() const;

  /// The manifest of a revision, nullopt when there is none; io_error/bad manifest as error.
  Result<std::optional<Manifest>> read_manifest(const std::string& name, const std::string& commit) const;

  /// Writes the manifest of a revision atomically (after verification only).
  Result<void> write_manifest(const std::string& name, const Manifest& manifest);

  /// The files of revision `commit` that its manifest recorded and whose content may differ now:
  /// another inode, size or mtime (a ctime alone, a hard link or chmod, leaves the content), or
  /// gone. Empty when the revision has no readable manifest. Blocks (a stat per file).
  std::vector<std::string> changed_since_verification(const std::string& name, const std::string& commit) const;

  /// Whether the revision has a manifest whose every file still has its recorded identity
  /// (no hashing: a stat per file, never waits; may see a link or unlink of modeld's own half-way).
  bool manifest_still_matches(const std::string& name, const std::string& commit) const;

  /// The revision against its manifest, telling a revision never verified (absent) from one that
  /// was and no longer matches (changed); the same stats as manifest_still_matches, which is
  /// check_manifest() == matches. Blocks (reads the manifest, a stat per file).
  ManifestCheck check_manifest(const std::string& name, const std::string& commit) const;

  /// Runs `read` (store reads: list(), check_manifest()) holding the relinking lock shared, so it
  /// never sees a link or unlink of modeld's own half-way, and returns true; when such an operation
  /// runs now (an rm, an eviction, a clean-up of old revisions, planning's links), returns false at
  /// once without running `read`. Blocks for as long as `read` does.
  bool read_if_settled(const std::function<void()>& read) const;

  /// manifest_still_matches once every link or unlink of modeld's own in progress in this store
  /// (and the re-recording of the ctimes it changed) has finished; blocks: call it on the disk pool.
  bool manifest_still_matches_settled(const std::string& name, const std::string& commit) const;

  /// For a revision about to be fetched: hard-links into it every listed file that another
  /// verified revision of the same model holds with the same digest and size; returns the
  /// listed files that are still missing (not present with the listed size, or changed since the
  /// revision's verification: changed_since_verification, whose paths go to `*changed` when
  /// given). Files already in place are trusted only if a manifest or the fetch engine vouches for
  /// them later. The ctime the links changed is re-recorded in every manifest that held those
  /// files unchanged. Blocks.
  Result<std::vector<repo::RepoFile>> link_unchanged_and_list_missing(const std::string& name,
                                                                      const repo::Snapshot& snapshot,
                                                                      std::vector<std::string>* changed = nullptr);

  /// The dry run of link_unchanged_and_list_missing (the same decisions, for `modelctl plan`):
  /// creates, links and rewrites nothing. bad_request for an invalid name or commit,
  /// plan_invalid for a listed path that escapes the model folder.
  Result<MissingFiles> plan_missing(const std::string& name, const repo::Snapshot& snapshot);

  /// A copy of model `name` made outside modeld: models_dir/NAME when it is a directory, or a
  /// symlink that switch_link did not write and that resolves to a directory; nullopt otherwise.
  std::optional<std::filesystem::path> foreign_folder(const std::string& name) const;

  /// Which of `files` (the listed files still missing from revision `commit`) the folder
  /// `folder` can supply, without hashing anything: a regular file at the listed path, reached
  /// through no symlink below `folder`, on the file system of models_dir (it is hard-linked, never
  /// copied), with the listed size, and whose `hf download` record (if any) names the listed
  /// digest. Reads only metadata; bad_request for invalid names.
  Result<Adoption> scan_adoption(const std::string& name, const std::string& commit,
                                 const std::vector<repo::RepoFile>& files, const std::filesystem::path& folder) const;

  /// scan_adoption, then hashes the candidates (`parallel` files at once, sha256 for LFS files,
  /// git blob sha1 otherwise) and hard-links each file whose digest matches the listing and that
  /// did not change while it was hashed into revision `commit` at its path (temporary name, then
  /// rename). Nothing in `folder` is modified, but for the ctime the links change, which is
  /// re-recorded in any manifest holding those files unchanged. Files that differ are listed in
  /// `rejected` and left to be downloaded. Errors: bad_request (names), io_error (creating
  /// folders in the revision). Blocks (hashing): call it on the disk pool.
  Result<Adoption> adopt(const std::string& name, const std::string& commit, const std::vector<repo::RepoFile>& files,
                         const std::filesystem::path& folder, unsigned parallel);

  /// Moves a foreign folder or symlink at models_dir/NAME (see foreign_folder) out of the way of
  /// switch_link, to models_dir/.adopted/NAME-YYYYMMDDTHHMMSSZ, which modeld never deletes; returns
  /// the new path, or nullopt when models_dir/NAME is absent or already a link of ours. io_error.
  Result<std::optional<std::filesystem::path>> set_aside_foreign(const std::string& name);

  /// Bytes of partial downloads already on disk for a revision.
  std::uint64_t partial_bytes(const std::string& name, const std::string& commit) const;

  /// Every model with anything under models_dir.
  std::vector<StoredModel> list() const;

  /// Deletes every revision of `name` and its link, never following a symlink out of models_dir,
  /// and re-records the ctime of files other models' manifests share with it; returns the bytes
  /// freed. bad_request for an invalid name; io_error when models_dir/NAME is not a symlink (a
  /// user's folder is left alone, nothing is deleted) or a removal fails. Blocks.
  Result<std::uint64_t> remove_model(const std::string& name);

  /// Deletes the revisions of `name` other than `keep_commit` (after a successful switch), those
  /// in `spare` (pulled ahead) and the one the link points to, and re-records the ctime of the
  /// files the kept revisions shared with them (their link count changed); returns the bytes freed
  /// (files still linked from a kept revision not counted). bad_request for an invalid name or
  /// commit, io_error. Blocks.
  Result<std::uint64_t> remove_other_revisions(const std::string& name, const std::string& keep_commit,
                                               const std::vector<std::string>& spare = {});

  /// Deletes revision `commit` of `name` (and models_dir/NAME when it links there), re-recording
  /// the ctime of the files other revisions shared with it; returns the bytes freed (files still
  /// linked from another revision not counted). bad_request for an invalid name or commit,
  /// not_found when the revision is not on disk, io_error. Blocks.
  Result<std::uint64_t> remove_revision(const std::string& name, const std::string& commit);

 private:
  // Deletes the revisions of `name` for which `doomed` holds, counting as freed only files no
  // other revision links; the one implementation of remove_other_revisions and remove_revision.
  Result<std::uint64_t> remove_revisions_if(const std::string& name,
                                            const std::function<bool(const std::string&)>& doomed);

  // The one implementation behind link_unchanged_and_list_missing (link = true) and
  // plan_missing (link = false, nothing on disk changes).
  Result<MissingFiles> find_missing(const std::string& name, const repo::Snapshot& snapshot, bool link);

  friend class detail::Relinking;

  std::filesystem::path models_dir_;
  // Held exclusively while modeld links or unlinks files of verified revisions and re-records
  // their ctimes (detail::Relinking), shared by manifest_still_matches_settled.
  mutable std::shared_mutex relinking_;
};

/// A model that eviction may delete, with when it last served.
struct EvictionCandidate {
  std::string name;
  std::uint64_t size_bytes = 0;
  std::chrono::system_clock::time_point last_active;  ///< epoch when it never served
};

/// The outcome of disk planning.
struct DiskPlan {
  std::uint64_t bytes_needed = 0;     ///< still to download
  std::uint64_t bytes_free = 0;       ///< free on the file system now
  std::uint64_t reserve = 0;          ///< disk_reserve
  std::vector<EvictionCandidate> evict;  ///< in the order they would be deleted
  bool fits = false;                  ///< needed <= free - reserve + evicted bytes
};

/// Chooses what to evict: least recently active first from `candidates` (which the caller has
/// already stripped of the active, pinned and target models) until bytes_needed fits.
DiskPlan plan_disk(std::uint64_t bytes_needed, std::uint64_t bytes_free, std::uint64_t reserve,
                   std::vector<EvictionCandidate> candidates);

}  // namespace modeld::store
