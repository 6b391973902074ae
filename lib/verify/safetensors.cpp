// The safetensors header reader (hub-protocol.md "safetensors"). It reads the 8-byte length and
// the JSON header only, never tensor data, so checking a 600 GB checkpoint costs a few reads.

#include "verify/safetensors_detail.hpp"
#include "verify/verify.hpp"
#include "util/files.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>

namespace modeld::verify {

namespace {

// The reference reader's cap on N; larger headers are refused before any allocation.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// Sizes in bits, as safetensors defines them; sub-byte types (F4, F6_*) must fill whole bytes.
std::uint64_t dtype_bits(std::string_view dtype) {
  struct Entry {
    std::string_view name;
    std::uint64_t bits;
  };
  static constexpr Entry kTypes[] = {
      {"BOOL", 8},     {"U8", 8},       {"I8", 8},       {"F8_E5M2", 8},  {"F8_E4M3", 8},
      {"F8_E8M0", 8},  {"F4", 4},       {"F6_E2M3", 6},  {"F6_E3M2", 6},  {"I16", 16},
      {"U16", 16},     {"F16", 16},     {"BF16", 16},    {"I32", 32},     {"U32", 32},
      {"F32", 32},     {"F64", 64},     {"I64", 64},     {"U64", 64},     {"C64", 64},
  };
  for (const auto& t : kTypes)
    if (t.name == dtype) return t.bits;
  return 0;
}

Error invalid(const std::string& file, std::string_view tensor, std::string_view problem,
              std::string* bad_tensor) {
  if (bad_tensor) *bad_tensor = std::string(tensor);
  if (tensor.empty())
    return make_error(Errc::safetensors_invalid, fmt::format("{}: {}", file, problem));
  return make_error(Errc::safetensors_invalid, fmt::format("{}: tensor '{}': {}", file, tensor, problem));
}

bool read_exactly(int fd, void* buf, std::size_t len, off_t offset) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::pread(fd, p, len, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = 0;  // end of file: the file shrank while being read
      return false;
    }
    p += n;
    len -= static_cast<std::size_t>(n);
    offset += n;
  }
  return true;
}

}  // namespace

std::string json_error_text(const std::exception& e) {
  // nlohmann prefixes "[json.exception.parse_error.101] "; the rest names line and column.
  std::string_view w = e.what();
  if (!w.empty() && w.front() == '[')
    if (auto close = w.find("] "); close != std::string_view::npos) w.remove_prefix(close + 2);
  return std::string(w);
}

namespace {

// A byte for a message: quoted when printable, else in hex.
std::string describe_byte(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02x}", c);
}

// Parses one tensor entry into `out`; returns the problem in words, or "" when it is valid.
std::string parse_entry(const nlohmann::json& v, TensorInfo& out) {
  if (!v.is_object()) return "entry is not a JSON object";
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return "missing \"dtype\" string";
  out.dtype = dt->get<std::string>();
  std::uint64_t bits = dtype_bits(out.dtype);
  if (bits == 0) return fmt::format("unknown dtype \"{}\"", out.dtype);

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) return "missing \"shape\" array";
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) return "shape holds something other than a non-negative integer";
    auto n = d.get<std::uint64_t>();
    out.shape.push_back(n);
    if (n != 0 && elements > std::numeric_limits<std::uint64_t>::max() / n) overflow = true;
    else elements *= n;
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return "\"data_offsets\" is not [BEGIN, END] of non-negative integers";
  out.begin = (*off)[0].get<std::uint64_t>();
  out.end = (*off)[1].get<std::uint64_t>();
  if (out.begin > out.end) return fmt::format("data_offsets [{}, {}] end before they begin", out.begin, out.end);

  // An empty dimension makes the tensor empty whatever the other dimensions say.
  if (std::find(out.shape.begin(), out.shape.end(), 0u) != out.shape.end()) {
    elements = 0;
    overflow = false;
  }
  if (overflow || (elements != 0 && bits > std::numeric_limits<std::uint64_t>::max() / elements))
    return "shape is too large to address";
  std::uint64_t total_bits = elements * bits;
  if (total_bits % 8 != 0)
    return fmt::format("{} elements of {} do not fill whole bytes", elements, out.dtype);
  std::uint64_t expect = total_bits / 8;
  if (out.end - out.begin != expect)
    return fmt::format("data_offsets [{}, {}] span {} bytes but shape and {} need {}", out.begin, out.end,
                       out.end - out.begin, out.dtype, expect);
  return {};
}

}  // namespace

namespace {

// The JSON text of the header of the open file `fd` (`file_size` bytes): the 8-byte little-endian
// length N, then N bytes that must open with '{'. io_error when reading fails, safetensors_invalid
// (naming no tensor) for a length or an opening the format refuses.
Result<std::string> read_header_text(int fd, const std::string& file, std::uint64_t file_size,
                                     std::string* bad_tensor) {
  if (file_size < 8)
    return invalid(file, {}, fmt::format("{} bytes is too short for the 8-byte header length", file_size),
                   bad_tensor);
  unsigned char len_bytes[8];
  if (!read_exactly(fd, len_bytes, 8, 0))
    return make_error(Errc::io_error, fmt::format("{}: read: {}", file, errno ? std::strerror(errno) : "file shrank"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes)
    return invalid(file, {}, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes),
                   bad_tensor);
  if (8 + n > file_size)
    return invalid(file, {}, fmt::format("header length {} runs past the end of the {}-byte file", n, file_size),
                   bad_tensor);

  std::string text(static_cast<std::size_t>(n), '\0');
  if (n > 0 && !read_exactly(fd, text.data(), text.size(), 8))
    return make_error(Errc::io_error, fmt::format("{}: read: {}", file, errno ? std::strerror(errno) : "file shrank"));
  // The reference reader refuses a header that does not open with '{' before parsing it; saying
  // what it opens with tells an array ('[') from binary junk or a zero length.
  if (text.empty()) return invalid(file, {}, "header is empty: length 0, not a JSON object", bad_tensor);
  if (text.front() != '{')
    return invalid(file, {},
                   fmt::format("header is not a JSON object: it starts with {} instead of '{{'",
                               describe_byte(static_cast<unsigned char>(text.front()))),
                   bad_tensor);
  return text;
}

// Fills `h`'s metadata and tensors from the header object `j`; safetensors_invalid for an entry
// the format refuses (naming its tensor).
Result<void> parse_entries(const nlohmann::json& j, const std::string& file, SafetensorsHeader& h,
                           std::string* bad_tensor) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return invalid(file, {}, "\"__metadata__\" is not a JSON object", bad_tensor);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return invalid(file, {}, fmt::format("\"__metadata__\" value of \"{}\" is not a string", m.key()),
                         bad_tensor);
        h.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    TensorInfo info;
    if (auto problem = parse_entry(*it, info); !problem.empty()) return invalid(file, it.key(), problem, bad_tensor);
    h.tensors.emplace(it.key(), std::move(info));
  }
  return {};
}

// Whether `h`'s tensors cover its data exactly once, without holes, overlaps or trailing bytes;
// safetensors_invalid otherwise (`file_size` bytes in the file, for the message).
Result<void> check_coverage(const SafetensorsHeader& h, const std::string& file, std::uint64_t file_size,
                            std::string* bad_tensor) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : h.tensors) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  std::uint64_t covered = 0;
  for (const auto& [name, info] : by_offset) {
    if (info->begin > covered)
      return invalid(file, *name, fmt::format("leaves a hole: data starts at {} but the previous tensor ends at {}",
                                               info->begin, covered),
                     bad_tensor);
    if (info->begin < covered)
      return invalid(file, *name,
                     fmt::format("overlaps the previous tensor: data starts at {} before {}", info->begin, covered),
                     bad_tensor);
    covered = info->end;
  }
  // The file size must be exactly 8 + N + the bytes the tensors cover: more is trailing data no
  // reader maps (often a sign of two files concatenated), less means tensors run past the end.
  const auto n = h.header_size;
  if (covered < h.data_size)
    return invalid(file, {},
                   fmt::format("{} trailing bytes after the last tensor: the tensors cover {} bytes of data but "
                               "the file holds {} after the header (8 + {} + {} != {} bytes)",
                               h.data_size - covered, covered, h.data_size, n, covered, file_size),
                   bad_tensor);
  if (covered > h.data_size)
    return invalid(file, {},
                   fmt::format("the file ends {} bytes early: the tensors cover {} bytes of data but the file holds "
                               "only {} after the header (8 + {} + {} != {} bytes)",
                               covered - h.data_size, covered, h.data_size, n, covered, file_size),
                   bad_tensor);
  return {};
}

}  // namespace

Result<SafetensorsHeader> read_safetensors_header_detail(const std::filesystem::path& path,
                                                         const std::string& display_name,
                                                         std::string* bad_tensor) {
  const std::string& file = display_name;
  if (bad_tensor) bad_tensor->clear();
  const util::OwnedFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0)
    return make_error(Errc::io_error, fmt::format("{}: open: {}", file, std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0)
    return make_error(Errc::io_error, fmt::format("{}: stat: {}", file, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return make_error(Errc::io_error, fmt::format("{}: not a regular file", file));
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  auto text = read_header_text(f.get(), file, file_size, bad_tensor);
  if (!text) return text.error();

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() names the byte position within the header ("at line 1, column 17").
    return invalid(file, {}, fmt::format("header is not valid JSON: {}", json_error_text(e)), bad_tensor);
  }
  if (!j.is_object()) return invalid(file, {}, "header is not a JSON object", bad_tensor);

  SafetensorsHeader h;
  h.header_size = text->size();
  h.data_size = file_size - 8 - h.header_size;
  if (auto r = parse_entries(j, file, h, bad_tensor); !r) return r.error();
  if (auto r = check_coverage(h, file, file_size, bad_tensor); !r) return r.error();
  return h;
}

Result<SafetensorsHeader> read_safetensors_header(const std::filesystem::path& path,
                                                  const std::string& display_name) {
  return read_safetensors_header_detail(path, display_name, nullptr);
}

}  // namespace modeld::verify
