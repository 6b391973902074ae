#include "verify/index.hpp"

#include "verify/safetensors_detail.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace modeld::verify {

Result<ShardTensors> parse_safetensors_index(std::string_view text, const std::string& index_path,
                                             std::string* bad_tensor) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(Errc::safetensors_invalid, fmt::format("{}: not valid JSON: {}", index_path, json_error_text(e)));
  }
  auto wm = j.is_object() ? j.find("weight_map") : j.end();
  if (!j.is_object() || wm == j.end() || !wm->is_object())
    return make_error(Errc::safetensors_invalid, fmt::format("{}: no \"weight_map\" object", index_path));
  // Shard names in the weight map are relative to the index's own folder.
  const auto slash = index_path.rfind('/');
  const std::string folder = slash == std::string::npos ? std::string() : index_path.substr(0, slash + 1);
  ShardTensors out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) {
      if (bad_tensor) *bad_tensor = it.key();
      return make_error(Errc::safetensors_invalid,
                        fmt::format("{}: tensor '{}': shard is not a string", index_path, it.key()));
    }
    out[folder + it->get<std::string>()].insert(it.key());
  }
  return out;
}

}  // namespace modeld::verify
