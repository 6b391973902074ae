#pragma once
// The safetensors index (model.safetensors.index.json): which shard holds which tensor. Read in
// one place for planning (the index from the Hub, before any shard is downloaded) and verifying
// (the index on disk).

#include "util/error.hpp"

#include <map>
#include <set>
#include <string>
#include <string_view>

namespace modeld::verify {

/// An index's weight_map grouped by shard: the shard's repository path (the index's own folder
/// joined with the name the index gives) -> the tensors the index maps to it.
using ShardTensors = std::map<std::string, std::set<std::string>>;

/// Parses the safetensors index `text`, repository file `index_path`, into its shards and their
/// tensors; does not block. Errors, all safetensors_invalid with a message naming `index_path`:
/// not valid JSON, no "weight_map" object, or a weight_map entry whose shard is not a string
/// (naming the tensor, also stored in `*bad_tensor` when given).
Result<ShardTensors> parse_safetensors_index(std::string_view text, const std::string& index_path,
                                             std::string* bad_tensor = nullptr);

}  // namespace modeld::verify
