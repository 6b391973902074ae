#pragma once
// The store requests' disk work (maintenance.cpp): `modelctl verify`, the check at start, `rm`.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// `modelctl verify`: on the disk pool, re-hashes every file of the revision models_dir/NAME
/// points to (else the newest verified one) against its manifest and runs verify's structural
/// checks; a clean result rewrites the manifest with the files' current identities. Errors:
/// not_found when no verified revision of `name` is on disk; io_error (manifest unreadable or
/// not writable).
boost::asio::awaitable<Result<VerifyReport>> verify_on_disk(Services& s, const std::string& name);

/// Fast re-verification of revision `commit` of model `name` (at daemon start): a stat per file
/// against its manifest on the disk pool, logged with its time in ms under `fields`. When a file
/// changed and `rehash` is set, every file is re-hashed (verify_on_disk) and each problem logged.
/// Returns whether the files may be served: unchanged, or re-hashed clean.
boost::asio::awaitable<bool> files_still_trusted(Services& s, const std::string& name, const std::string& commit,
                                                 const sys::Fields& fields, bool rehash);

/// `modelctl rm`: on the disk pool, Store::remove_model (store folders and link, never through
/// a symlink out of models_dir). Errors as remove_model.
boost::asio::awaitable<Result<Removal>> remove_from_disk(Services& s, const std::string& name);

/// `modelctl rm --commit`: on the disk pool, Store::remove_revision (one revision, and the link
/// when it points there). Errors as remove_revision.
boost::asio::awaitable<Result<Removal>> remove_revision_from_disk(Services& s, const std::string& name,
                                                                  const std::string& commit);

}  // namespace modeld::deploy
