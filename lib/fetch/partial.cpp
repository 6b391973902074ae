#include "fetch/partial.hpp"
#include "store/store.hpp"
#include "util/json.hpp"

#include "util/files.hpp"
#include "util/text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace modeld::fetch {

namespace fs = std::filesystem;

std::string Sidecar::to_json() const {
  nlohmann::json j = {
      {"commit", commit},
      {"path", path},
      {"size", size},
      {"digest_kind", kind == verify::HashKind::sha256 ? "sha256" : "git_sha1"},
      {"digest", digest},
  };
  return util::dump_json(j) + "\n";
}

std::optional<Sidecar> Sidecar::parse(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto str = [&](const char* key) -> const std::string* {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  auto size = j.find("size");
  const std::string* commit = str("commit");
  const std::string* path = str("path");
  const std::string* kind = str("digest_kind");
  const std::string* digest = str("digest");
  if (!commit || !path || !kind || !digest || size == j.end() || !size->is_number_unsigned())
    return std::nullopt;
  Sidecar s;
  s.commit = *commit;
  s.path = *path;
  s.size = size->get<std::uint64_t>();
  s.digest = *digest;
  if (*kind == "sha256") {
    s.kind = verify::HashKind::sha256;
  } else if (*kind == "git_sha1") {
    s.kind = verify::HashKind::git_sha1;
  } else {
    return std::nullopt;
  }
  return s;
}

std::string current_boot_id() {
  auto text = util::read_file("/proc/sys/kernel/random/boot_id", 256);
  if (!text) return "";
  std::string id = *text;
  id = std::string(util::trim(id));
  return id;
}

namespace {

nlohmann::json ranges_json(const RangeSet& set) {
  auto out = nlohmann::json::array();
  for (const auto& r : set.items()) out.push_back({r.begin, r.end});
  return out;
}

// [[BEGIN, END], ...] → a RangeSet; nullopt when malformed.
std::optional<RangeSet> parse_ranges(const nlohmann::json& j) {
  if (!j.is_array()) return std::nullopt;
  RangeSet set;
  for (const auto& r : j) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() || !r[1].is_number_unsigned()) return std::nullopt;
    auto b = r[0].get<std::uint64_t>();
    auto e = r[1].get<std::uint64_t>();
    if (e < b) return std::nullopt;
    set.add({b, e});
  }
  return set;
}

}  // namespace

fs::path partial_dir(const fs::path& dest_dir) { return dest_dir / store::metadata_dir / "partial"; }

std::string partial_name(std::string_view repo_path) {
  std::string name;
  for (char c : repo_path) {
    if (c == '%') {
      name += "%25";
    } else if (c == '/') {
      name += "%2F";
    } else {
      name += c;
    }
  }
  if (name.size() > 200) {
    verify::Hasher h(verify::HashKind::sha256, repo_path.size());
    h.update(std::span<const char>(repo_path.data(), repo_path.size()));
    name = h.hex();
  }
  return name + ".part";
}

PartialFile::PartialFile(const fs::path& dest_dir, Sidecar expected)
    : expected_(std::move(expected)),
      dir_(partial_dir(dest_dir)),
      part_(dir_ / partial_name(expected_.path)),
      sidecar_(fs::path(part_) += ".json"),
      final_(dest_dir / expected_.path) {}

PartialFile::~PartialFile() { close(); }

void PartialFile::close() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  fd_ = -1;
  direct_fd_ = -1;
}

Result<RangeSet> PartialFile::open() {
  close();
  boot_id_ = current_boot_id();
  synced_ = RangeSet{};
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return util::errno_error(ec.value(), dir_, "create directory");

  // Keep the bytes only when the sidecar says they belong to exactly this file.
  std::optional<RangeSet> trusted;
  if (auto text = util::read_file(sidecar_, 16u << 20)) {
    auto found = Sidecar::parse(*text);
    if (found && *found == expected_) {
      auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      auto ranges = j.find("ranges");
      if (ranges == j.end()) {
        trusted = RangeSet{};  // a sidecar of modeld 0.1: the partial is a prefix (set below)
      } else {
        auto boot = j.find("boot_id");
        bool same_boot = !boot_id_.empty() && boot != j.end() && boot->is_string() && *boot == boot_id_;
        auto synced = j.find("synced");
        auto synced_set = synced == j.end() ? std::optional<RangeSet>(RangeSet{}) : parse_ranges(*synced);
        auto written = parse_ranges(*ranges);
        if (written && synced_set) {
          synced_ = *synced_set;
          trusted = same_boot ? *written : *synced_set;
        }
      }
      if (trusted) {
        fd_ = ::open(part_.c_str(), O_RDWR | O_CLOEXEC);
        if (fd_ >= 0) {
          struct stat st {};
          if (::fstat(fd_, &st) != 0) return util::errno_error(errno, part_, "stat");
          auto size = static_cast<std::uint64_t>(st.st_size);
          if (size <= expected_.size) {
            open_direct();
            if (ranges == j.end()) trusted->add({0, size});
            trusted->clip(size);  // bytes past the file's end were never written
            synced_.clip(size);
            return *trusted;
          }
        } else if (errno != ENOENT) {
          return util::errno_error(errno, part_, "open");
        }
        close();
      }
    }
  }

  // Start over: the sidecar goes first, so a partial never exists without its description.
  synced_ = RangeSet{};
  ::unlink(part_.c_str());
  if (auto r = util::write_file_atomically(sidecar_, sidecar_json(RangeSet{})); !r) return r.error();
  fd_ = ::open(part_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return util::errno_error(errno, part_, "create");
  open_direct();
  if (auto r = util::fsync_directory(dir_); !r) return r.error();
  return RangeSet{};
}

std::string PartialFile::sidecar_json(const RangeSet& written) const {
  auto j = nlohmann::json::parse(expected_.to_json());
  j["boot_id"] = boot_id_;
  j["ranges"] = ranges_json(written);
  j["synced"] = ranges_json(synced_);
  return util::dump_json(j) + "\n";
}

Result<void> PartialFile::record(const RangeSet& written, bool durable) {
  std::lock_guard lock(record_mutex_);
  if (durable) {
    if (::fdatasync(fd_) != 0) return util::errno_error(errno, part_, "fdatasync");
    synced_ = written;
    return util::write_file_atomically(sidecar_, sidecar_json(written));
  }
  // Same-boot record: an atomic rename without fsync (a power loss keeps the older, durable one).
  auto tmp = fs::path(sidecar_) += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return util::errno_error(errno, tmp, "create");
  std::string text = sidecar_json(written);
  std::string_view rest = text;
  while (!rest.empty()) {
    ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return util::errno_error(err, tmp, "write");
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), sidecar_.c_str()) != 0) return util::errno_error(errno, sidecar_, "rename");
  return {};
}

Result<std::size_t> PartialFile::read_at(std::uint64_t offset, std::span<char> buf) {
  for (;;) {
    ssize_t n = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return util::errno_error(errno, part_, "read");
  }
}

void PartialFile::open_direct() {
  // File systems without O_DIRECT (tmpfs) refuse it with EINVAL: all writes are buffered then.
  direct_fd_ = ::open(part_.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
}

namespace {

Result<void> pwrite_all(int fd, std::uint64_t offset, std::span<const char> data, const fs::path& path) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return util::errno_error(errno, path, "write");
    }
    offset += static_cast<std::uint64_t>(n);
    data = data.subspan(static_cast<std::size_t>(n));
  }
  return {};
}

}  // namespace

Result<void> PartialFile::write_at(std::uint64_t offset, std::span<const char> data) {
  // The aligned middle goes around the page cache when it can: on a busy host the copy into the
  // page cache costs more CPU than hashing the bytes, and a 547 GB download would evict every
  // other file from the cache. The unaligned head and tail (a few KiB at most) are buffered.
  if (direct_fd_ >= 0 && data.size() >= kDirectAlign) {
    std::size_t head = static_cast<std::size_t>((kDirectAlign - offset % kDirectAlign) % kDirectAlign);
    std::size_t middle = (data.size() - std::min(head, data.size())) / kDirectAlign * kDirectAlign;
    auto address = reinterpret_cast<std::uintptr_t>(data.data() + head);
    if (head < data.size() && middle > 0 && address % kDirectAlign == 0) {
      if (auto r = pwrite_all(fd_, offset, data.first(head), part_); !r) return r;
      auto direct = pwrite_all(direct_fd_, offset + head, data.subspan(head, middle), part_);
      if (!direct && direct.error().code != Errc::disk_full) {
        // A file system that accepted O_DIRECT at open but refuses this write: go buffered.
        ::close(direct_fd_);
        direct_fd_ = -1;
        return pwrite_all(fd_, offset, data, part_);
      }
      if (!direct) return direct;
      return pwrite_all(fd_, offset + head + middle, data.subspan(head + middle), part_);
    }
  }
  return pwrite_all(fd_, offset, data, part_);
}

Result<void> PartialFile::truncate(std::uint64_t length) {
  if (::ftruncate(fd_, static_cast<off_t>(length)) != 0) return util::errno_error(errno, part_, "truncate");
  return {};
}

Result<void> PartialFile::sync() {
  if (::fsync(fd_) != 0) return util::errno_error(errno, part_, "fsync");
  return {};
}

Result<void> PartialFile::promote() {
  close();
  std::error_code ec;
  fs::create_directories(final_.parent_path(), ec);
  if (ec) return util::errno_error(ec.value(), final_.parent_path(), "create directory");
  if (auto r = util::durable_rename(part_, final_); !r) return r;
  if (::unlink(sidecar_.c_str()) != 0 && errno != ENOENT) return util::errno_error(errno, sidecar_, "unlink");
  ::unlink((fs::path(sidecar_) += ".tmp").c_str());
  return util::fsync_directory(dir_);
}

void PartialFile::discard() {
  close();
  ::unlink(part_.c_str());
  ::unlink(sidecar_.c_str());
  ::unlink((fs::path(sidecar_) += ".tmp").c_str());
}

}  // namespace modeld::fetch
