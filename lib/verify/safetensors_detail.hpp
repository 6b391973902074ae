#pragma once
// Internal to lib/verify: the safetensors reader with the name of the offending tensor reported
// separately, so check_structure can fill Problem::tensor.

#include "verify/verify.hpp"

#include <exception>
#include <string>

namespace modeld::verify {

/// The text of a JSON parse error without nlohmann's "[json.exception...] " prefix, e.g.
/// "parse error at line 1, column 17: syntax error ...".
std::string json_error_text(const std::exception& e);

/// As read_safetensors_header(); on error, sets `*bad_tensor` (when given) to the tensor the
/// problem concerns, or "" for a problem with the file as a whole.
Result<SafetensorsHeader> read_safetensors_header_detail(const std::filesystem::path& path,
                                                         const std::string& display_name,
                                                         std::string* bad_tensor);

}  // namespace modeld::verify
