#pragma once
// verifying (verify.cpp): hashing and structural checks, then the revision's manifest.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// verifying: hash files this run did not fetch, check structure (safetensors, index, config),
/// then write the revision's manifest.
boost::asio::awaitable<Result<void>> run_verifying(Services& s, const Run& run);

}  // namespace modeld::deploy
