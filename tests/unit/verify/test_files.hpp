#pragma once
// Test helpers shared by the verify and store unit tests: a temporary folder that cleans up
// after itself, file writing, and a builder for small valid safetensors files.

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace modeld::test {

/// A fresh folder under the system temp directory, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("modeld-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& rel) const { return path / rel; }
};

/// Writes `content` to `path`, creating its parent folders.
inline void write_file(const std::filesystem::path& path, const std::string& content) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

/// Reads a whole file.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// One tensor of a test safetensors file.
struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
};

/// Byte size of the common dtypes used in tests.
inline std::uint64_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;
}

/// A safetensors file from a raw JSON header and a data buffer of `data_bytes` bytes.
inline std::string safetensors_raw(const std::string& header, std::uint64_t data_bytes) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  for (std::uint64_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i * 7));
  return out;
}

/// The JSON header of a valid file holding `tensors` back to back, in the given order.
inline nlohmann::json safetensors_header(const std::vector<Tensor>& tensors, std::uint64_t* data_bytes = nullptr) {
  nlohmann::json h = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::uint64_t n = dtype_size(t.dtype);
    for (auto d : t.shape) n *= d;
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (data_bytes) *data_bytes = offset;
  return h;
}

/// A complete valid safetensors file holding `tensors`, with `metadata` when not empty.
inline std::string safetensors_file(const std::vector<Tensor>& tensors, const nlohmann::json& metadata = {}) {
  std::uint64_t bytes = 0;
  auto h = safetensors_header(tensors, &bytes);
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  return safetensors_raw(h.dump(), bytes);
}

}  // namespace modeld::test
