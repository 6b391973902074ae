// verifying: every listed file hashed (inline by fetch, or here), structure checked, manifest.
#include "deploy/verify.hpp"

#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "verify/verify.hpp"


#include <thread>

namespace modeld::deploy {

boost::asio::awaitable<Result<void>> run_verifying(Services& s, const Run& run) {
  const auto& snap = *run.snapshot;
  const auto dir = s.store.revision_dir(run.model.name, snap.commit);

  // A stat per file (blocking: on the disk pool).
  bool unchanged = false;
  if (run.missing.empty())
    unchanged = co_await util::on_pool<bool>(s.disk_pool,
                                             [&] { return s.store.manifest_still_matches(run.model.name, snap.commit); });
  if (unchanged) {
    sys::logf(sys::Level::info, run.fields(), "files unchanged since their verification at commit {}: trusted",
              snap.commit.substr(0, 12));
    co_return Result<void>{};
  }

  // Files the engine did not hash on arrival (already on disk, hard-linked) are hashed now.
  std::vector<repo::RepoFile> unhashed;
  for (const auto& f : snap.files)
    if (!run.fetched.contains(f.path)) unhashed.push_back(f);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  auto report = co_await util::on_pool<verify::Report>(s.disk_pool, [&] {
    verify::Report r = verify::check_hashes(dir, unhashed, cores);
    auto structure = verify::check_structure(dir, snap.files);
    r.problems.insert(r.problems.end(), structure.problems.begin(), structure.problems.end());
    return r;
  });
  if (!report.ok()) {
    for (const auto& p : report.problems) {
      sys::Fields f = run.fields();
      f.extra.emplace_back("MODELD_FILE", p.file);
      if (!p.tensor.empty()) f.extra.emplace_back("MODELD_TENSOR", p.tensor);
      sys::log(sys::Level::error, f, p.message);
    }
    co_return report.to_error();
  }

  // The manifest: a stat per file and an atomic write with fsync (blocking: on the disk pool).
  store::Manifest m;
  m.repo = snap.repo;
  m.revision = run.model.revision;
  m.commit = snap.commit;
  m.verified_at = util::rfc3339(std::chrono::system_clock::now());
  auto written = co_await util::on_pool<Result<void>>(s.disk_pool, [&]() -> Result<void> {
    for (const auto& f : snap.files) {
      store::ManifestFile mf;
      mf.path = f.path;
      mf.size = f.size;
      mf.sha256 = f.lfs_sha256.value_or("");
      mf.git_sha1 = f.blob_id;
      auto id = store::identity_of(dir / f.path);
      if (!id) return id.error();
      mf.identity = *id;
      m.files.push_back(std::move(mf));
    }
    return s.store.write_manifest(run.model.name, m);
  });
  if (!written) co_return written.error();
  sys::logf(sys::Level::info, run.fields(), "verified {} files ({}; {} hashed now, {} while downloading)",
            snap.files.size(), util::format_bytes(m.size_bytes()), unhashed.size(), run.fetched.size());
  co_return Result<void>{};
}

}  // namespace modeld::deploy
