#pragma once
// Giving freed heap memory back to the system.

namespace modeld::util {

/// Returns the free pages of every malloc arena to the system (glibc's malloc_trim(0)), so that
/// RSS falls back after a burst of large, short-lived allocations (the records of a listing of
/// 100,000 files). Locks each arena while it walks it: a few ms for a heap of tens of MB.
void release_free_memory();

}  // namespace modeld::util
