#pragma once
// Checks that a checkpoint on disk is what the listing says and that an inference server can
// load it: hashes, safetensors structure (hub-protocol.md "safetensors"), index coverage,
// config.json and tokenizer presence. Headers only are read for structure, never tensor data.

#include "repo/snapshot.hpp"
#include "util/error.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace modeld::verify {

/// One thing wrong with a checkpoint: which file, which tensor (if any), what.
struct Problem {
  Errc code = Errc::checkpoint_incomplete;
  std::string file;     ///< repository-relative path
  std::string tensor;   ///< empty when the problem is not about one tensor
  std::string message;  ///< complete sentence naming file and tensor
};

/// The outcome of a verification; ok() when there are no problems.
struct Report {
  std::vector<Problem> problems;
  bool ok() const { return problems.empty(); }
  /// The first problem as an Error (Errc of that problem, message with a count of the rest).
  Error to_error() const;
};

/// One tensor entry of a safetensors header.
struct TensorInfo {
  std::string dtype;                 ///< "BF16", "F32", "I8", ...
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;           ///< offset in the data buffer, bytes
  std::uint64_t end = 0;
};

/// A parsed and validated safetensors header.
struct SafetensorsHeader {
  std::uint64_t header_size = 0;  ///< N, the JSON length in bytes
  std::uint64_t data_size = 0;    ///< file size - 8 - N
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  ///< "__metadata__"
};

/// Reads and validates the header of the safetensors file at `path`: 8 <= file size,
/// N <= 100,000,000, JSON object, known dtypes, END-BEGIN == elements x dtype size, entries cover
/// the data buffer contiguously from 0, 8+N+buffer == file size. Errors: safetensors_invalid or
/// io_error, naming the file (as `display_name`) and tensor.
Result<SafetensorsHeader> read_safetensors_header(const std::filesystem::path& path,
                                                  const std::string& display_name);

/// Checks the structure of the checkpoint in `dir` whose listing is `files` (after filters):
/// every listed file present with its size; every *.safetensors header valid; every shard
/// the index names present, each tensor the index maps to a shard in that shard's header,
/// tensors in shards but not in the index reported; config.json parses as a JSON object.
Report check_structure(const std::filesystem::path& dir, const std::vector<repo::RepoFile>& files);

/// Re-hashes every listed file in `dir` (sha256 for LFS, git blob sha1 otherwise), `parallel`
/// files at once, and reports each mismatch or missing file.
Report check_hashes(const std::filesystem::path& dir, const std::vector<repo::RepoFile>& files,
                    unsigned parallel);

/// Files that the checkpoint needs but the filters drop: shards of an index that is included
/// (before the download the index cannot be read, so: *.safetensors in the index's folder whose
/// name starts with the index's prefix, "model" for model.safetensors.index.json), and tokenizer
/// files at the repository root (tokenizer.json, tokenizer.model, tokenizer_config.json,
/// special_tokens_map.json, tiktoken.model, *.tiktoken). `all` is the unfiltered listing and
/// `kept` the filtered one; returns the dropped paths in listing order, empty when nothing needed
/// is dropped.
std::vector<std::string> needed_but_filtered(const std::vector<repo::RepoFile>& all,
                                             const std::vector<repo::RepoFile>& kept);

}  // namespace modeld::verify
