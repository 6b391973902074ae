#pragma once
// Incremental hashes with OpenSSL EVP: SHA-256 of LFS file contents, and the git blob SHA-1
// (sha1("blob {size}\0" + content)) that the Hub reports for non-LFS files (hub-protocol.md).

#include <cstdint>
#include <memory>
#include <span>
#include <string>

struct evp_md_ctx_st;

namespace modeld::verify {

/// Which digest a file is checked against.
enum class HashKind { sha256, git_sha1 };

/// An incremental hash of one kind; feed bytes in order with update(), then hex().
class Hasher {
 public:
  /// Starts a hash; for git_sha1 the header "blob {size}\0" is fed first, so `size` (bytes)
  /// must be the content's full length.
  Hasher(HashKind kind, std::uint64_t size);
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;

  /// Adds the next bytes of content.
  void update(std::span<const unsigned char> data);
  void update(std::span<const char> data);

  /// Finishes and returns the lower-case hex digest; the Hasher may not be used afterwards.
  std::string hex();

  /// The content bytes fed so far (not counting the git header).
  std::uint64_t bytes() const { return bytes_; }

 private:
  evp_md_ctx_st* ctx_ = nullptr;
  std::uint64_t bytes_ = 0;
};

/// Hashes a whole file, reading in 4 MiB blocks; throws nothing, returns "" and sets `err`
/// (errno) on a read error.
std::string hash_file(const std::string& path, HashKind kind, std::uint64_t size, int& err);

}  // namespace modeld::verify
