#include "verify/hash.hpp"

#include "util/text.hpp"

#include <openssl/evp.h>

#include <fmt/format.h>

#include <cerrno>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>
#include <vector>

namespace modeld::verify {

Hasher::Hasher(HashKind kind, std::uint64_t size) : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_) throw std::bad_alloc();
  const EVP_MD* md = kind == HashKind::sha256 ? EVP_sha256() : EVP_sha1();
  if (EVP_DigestInit_ex(ctx_, md, nullptr) != 1) throw std::runtime_error("EVP_DigestInit_ex failed");
  if (kind == HashKind::git_sha1) {
    std::string header = fmt::format("blob {}", size);
    header.push_back('\0');
    EVP_DigestUpdate(ctx_, header.data(), header.size());
  }
}

Hasher::~Hasher() { EVP_MD_CTX_free(ctx_); }

Hasher::Hasher(Hasher&& o) noexcept : ctx_(o.ctx_), bytes_(o.bytes_) { o.ctx_ = nullptr; }

Hasher& Hasher::operator=(Hasher&& o) noexcept {
  if (this != &o) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = o.ctx_;
    bytes_ = o.bytes_;
    o.ctx_ = nullptr;
  }
  return *this;
}

void Hasher::update(std::span<const unsigned char> data) {
  EVP_DigestUpdate(ctx_, data.data(), data.size());
  bytes_ += data.size();
}

void Hasher::update(std::span<const char> data) {
  update(std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(data.data()), data.size()));
}

std::string Hasher::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_, md, &len);
  return util::to_hex(std::span<const unsigned char>(md, len));
}

std::string hash_file(const std::string& path, HashKind kind, std::uint64_t size, int& err) {
  err = 0;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    err = errno;
    return {};
  }
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Hasher h(kind, size);
  std::vector<unsigned char> buf(4u << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      ::close(fd);
      return {};
    }
    if (n == 0) break;
    h.update(std::span<const unsigned char>(buf.data(), static_cast<std::size_t>(n)));
  }
  ::close(fd);
  return h.hex();
}

}  // namespace modeld::verify
