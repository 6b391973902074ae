#include "fetch/partial.hpp"

#include "util/files.hpp"

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
  return j.dump() + "\n";
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

fs::path partial_dir(const fs::path& dest_dir) { return dest_dir / ".modeld" / "partial"; }

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
  fd_ = -1;
}

Result<std::uint64_t> PartialFile::open() {
  close();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return util::errno_error(ec.value(), dir_, "create directory");

  // Keep the bytes only when the sidecar says they are a prefix of exactly this file.
  bool keep = false;
  if (auto text = util::read_file(sidecar_, 1u << 16)) {
    auto found = Sidecar::parse(*text);
    keep = found && *found == expected_;
  }
  if (keep) {
    fd_ = ::open(part_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ >= 0) {
      struct stat st {};
      if (::fstat(fd_, &st) != 0) return util::errno_error(errno, part_, "stat");
      auto size = static_cast<std::uint64_t>(st.st_size);
      if (size <= expected_.size) return size;
    } else if (errno != ENOENT) {
      return util::errno_error(errno, part_, "open");
    }
    close();
  }

  // Start over: the sidecar goes first, so a partial never exists without its description.
  ::unlink(part_.c_str());
  if (auto r = util::write_file_atomically(sidecar_, expected_.to_json()); !r) return r.error();
  fd_ = ::open(part_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return util::errno_error(errno, part_, "create");
  if (auto r = util::fsync_directory(dir_); !r) return r.error();
  return std::uint64_t{0};
}

Result<std::size_t> PartialFile::read_at(std::uint64_t offset, std::span<char> buf) {
  for (;;) {
    ssize_t n = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) return util::errno_error(errno, part_, "read");
  }
}

Result<void> PartialFile::write_at(std::uint64_t offset, std::span<const char> data) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return util::errno_error(errno, part_, "write");
    }
    offset += static_cast<std::uint64_t>(n);
    data = data.subspan(static_cast<std::size_t>(n));
  }
  return {};
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
  return util::fsync_directory(dir_);
}

void PartialFile::discard() {
  close();
  ::unlink(part_.c_str());
  ::unlink(sidecar_.c_str());
}

}  // namespace modeld::fetch
