#pragma once
// downloading (download.cpp): fetching the missing files.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// What downloading fetched.
struct Downloaded {
  std::set<std::string> fetched;  ///< paths downloaded and hashed on arrival
};

/// downloading: fetch the missing files (hashing inline), reporting progress to `decisions`.
boost::asio::awaitable<Result<Downloaded>> run_downloading(Services& s, const Run& run, Decisions& decisions);

}  // namespace modeld::deploy
