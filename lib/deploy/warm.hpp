#pragma once
// warming (warm.cpp): reading the new revision into the page cache before the switch.

#include "deploy/phase.hpp"

namespace modeld::deploy {

/// What warming did: the figures for DEPLOYMENT.warm (nullopt with serve.warm = "off") and the
/// journal's closing line ("warmed 410 GB of 547 GB: RAM budget ...").
struct Warmed {
  std::optional<WarmReport> report;
  std::string note;
};

/// warming: with serve.warm = "auto", warm_revision of the run's revision, cancellable, its
/// progress reported to `decisions`; with "off", one journal line and nothing else.
boost::asio::awaitable<Result<Warmed>> run_warming(Services& s, const Run& run, Decisions& decisions);

/// Warming's progress as the driver sees it (called on the event loop).
using WarmProgressFn = std::function<void(const WarmReport&)>;

/// Reads revision `commit` of `model` (its manifest's files: the safetensors index's shards
/// first, sorted, then the rest, sorted) into the page cache with warm::warm_files on threads of
/// its own, within MemAvailable minus daemon.warm_reserve (MODELD_TEST_WARM_BUDGET bytes instead,
/// and MODELD_TEST_WARM_RATE bytes/s at most, in builds with test hooks). Logs a start and a
/// closing line under `fields`; `progress` (may be empty) gets the figures on the loop. With
/// `cancellable`, a cancel of the awaiting coroutine stops the readers and returns cancelled.
/// Errors: the manifest's or /proc/meminfo's (io_error, checkpoint_incomplete), cancelled, and
/// io_error "cannot read FILE of MODEL at COMMIT12, at byte N: ..." (about FILE) for a read error.
boost::asio::awaitable<Result<Warmed>> warm_revision(Services& s, const config::ModelConfig& model,
                                                     const std::string& commit, const sys::Fields& fields,
                                                     const WarmProgressFn& progress, bool cancellable);

/// The order warming reads a revision's `paths` in: the shards (the index's `shards`, or every
/// *.safetensors when it is empty) sorted by name, as vLLM and transformers load them, then the
/// other files sorted. Does not block.
std::vector<std::string> warm_order(std::vector<std::string> paths, const std::set<std::string>& shards);

/// The reserve of MemAvailable warming leaves when daemon.warm_reserve is unset, in bytes:
/// max(8 GiB, 10% of `mem_total`).
std::uint64_t default_warm_reserve(std::uint64_t mem_total);

/// Bytes of the run's revision in the page cache now (mincore, on the disk pool); nullopt when
/// its manifest cannot be read or no file could be measured.
boost::asio::awaitable<std::optional<std::uint64_t>> resident_at_launch(Services& s, const Run& run);

}  // namespace modeld::deploy
