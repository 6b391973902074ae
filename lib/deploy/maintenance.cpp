// verify and rm of a model on disk, outside any deployment (modelctl verify, modelctl rm).
#include "deploy/maintenance.hpp"

#include "store/store.hpp"
#include "util/on_pool.hpp"
#include "util/text.hpp"
#include "util/quantities.hpp"
#include "verify/verify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

namespace modeld::deploy {

namespace {

// The revision verify checks: the one in service under models_dir/NAME, else the newest one
// whose manifest says it was verified. Runs on the disk pool.
Result<store::Manifest> revision_to_verify(store::Store& st, const std::string& name) {
  if (auto linked = st.linked_commit(name)) {
    auto m = st.read_manifest(name, *linked);
    if (!m) return m.error();
    if (!*m)
      return make_error(Errc::not_found,
                        fmt::format("{} points to revision {}, which was never verified (no manifest)",
                                    st.model_path(name).string(), *linked));
    return std::move(**m);
  }
  std::optional<store::Manifest> newest;
  for (const auto& stored : st.list()) {
    if (stored.name != name) continue;
    for (const auto& c : stored.commits) {
      auto m = st.read_manifest(name, c);
      if (!m) return m.error();
      if (*m && (!newest || (*m)->verified_at > newest->verified_at)) newest = std::move(**m);
    }
  }
  if (!newest)
    return make_error(Errc::not_found, fmt::format("model {} has no verified revision on disk under {}", name,
                                                   st.models_dir().string()));
  return std::move(*newest);
}

Result<VerifyReport> verify_blocking(store::Store& st, const std::string& name) {
  auto manifest = revision_to_verify(st, name);
  if (!manifest) return manifest.error();
  const auto dir = st.revision_dir(name, manifest->commit);
  std::vector<repo::RepoFile> files;
  for (const auto& mf : manifest->files) {
    repo::RepoFile f;
    f.path = mf.path;
    f.size = mf.size;
    f.blob_id = mf.git_sha1;
    if (!mf.sha256.empty()) f.lfs_sha256 = mf.sha256;
    files.push_back(std::move(f));
  }
  VerifyReport out;
  out.model = name;
  out.commit = manifest->commit;
  out.files = files.size();
  out.bytes = util::total_size(files);

  // Files are hashed in parallel (one reader per core: the bottleneck of a local NVMe array is
  // the hashing), then the structure is checked from the headers alone.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto report = verify::check_hashes(dir, files, cores);
  auto structure = verify::check_structure(dir, files);
  // A missing or short file is reported by both checks in the same words: once is enough.
  std::set<std::pair<std::string, std::string>> seen;
  for (auto* r : {&report, &structure})
    for (auto& p : r->problems)
      if (seen.emplace(p.file, p.message).second)
        out.problems.push_back({std::string(to_string(p.code)), p.file, p.tensor, p.message});
  if (!out.ok()) return out;

  // Clean: what is on disk is what was verified, so the manifest records the files as they are
  // now, and later plans and status reads trust them again without re-hashing.
  for (auto& mf : manifest->files) {
    auto id = store::identity_of(dir / mf.path);
    if (!id) return id.error();
    mf.identity = *id;
  }
  manifest->verified_at = util::rfc3339(std::chrono::system_clock::now());
  if (auto w = st.write_manifest(name, *manifest); !w) return w.error();
  return out;
}

}  // namespace

boost::asio::awaitable<Result<VerifyReport>> verify_on_disk(Services& s, const std::string& name) {
  // By reference only: GCC 12 mis-copies class objects captured by value in a coroutine.
  co_return co_await util::on_pool<Result<VerifyReport>>(s.disk_pool, [&] { return verify_blocking(s.store, name); });
}

boost::asio::awaitable<bool> files_still_trusted(Services& s, const std::string& name, const std::string& commit,
                                                 const sys::Fields& fields, bool rehash) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool same = co_await util::on_pool<bool>(s.disk_pool, [&] { return s.store.manifest_still_matches_settled(name, commit); });
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (same) {
    sys::logf(sys::Level::info, fields, "files of model {} at {} unchanged since their verification ({:.1f} ms): trusted",
              name, commit.substr(0, 12), ms);
    co_return true;
  }
  if (!rehash) {
    sys::logf(sys::Level::warning, fields,
              "files of model {} at {} changed since their verification (or it has no manifest); run `modelctl "
              "verify {}` to re-hash them",
              name, commit.substr(0, 12), name);
    co_return false;
  }
  sys::logf(sys::Level::warning, fields, "files of model {} at {} changed since their verification: re-hashing them",
            name, commit.substr(0, 12));
  auto report = co_await verify_on_disk(s, name);
  if (!report) {
    sys::logf(sys::Level::error, fields, "cannot re-verify model {}: {}", name, report.error().message);
    co_return false;
  }
  for (const auto& p : report->problems) {
    sys::Fields f = fields;
    f.extra.emplace_back("MODELD_FILE", p.file);
    if (!p.tensor.empty()) f.extra.emplace_back("MODELD_TENSOR", p.tensor);
    sys::log(sys::Level::error, f, p.message);
  }
  if (report->ok())
    sys::logf(sys::Level::notice, fields, "model {} re-hashed: {} files intact", name, report->files);
  co_return report->ok();
}

boost::asio::awaitable<Result<Removal>> remove_from_disk(Services& s, const std::string& name) {
  co_return co_await util::on_pool<Result<Removal>>(s.disk_pool, [&]() -> Result<Removal> {
    auto& st = s.store;
    Removal out;
    out.model = name;
    for (const auto& stored : st.list())
      if (stored.name == name) out.commits = stored.commits;
    auto freed = st.remove_model(name);
    if (!freed) return freed.error();
    out.bytes_freed = *freed;
    return out;
  });
}

boost::asio::awaitable<Result<Removal>> remove_revision_from_disk(Services& s, const std::string& name,
                                                                  const std::string& commit) {
  co_return co_await util::on_pool<Result<Removal>>(s.disk_pool, [&]() -> Result<Removal> {
    auto freed = s.store.remove_revision(name, commit);
    if (!freed) return freed.error();
    return Removal{name, *freed, {commit}};
  });
}

}  // namespace modeld::deploy
