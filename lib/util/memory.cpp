#include "util/memory.hpp"

#include <malloc.h>

namespace modeld::util {

void release_free_memory() { ::malloc_trim(0); }

}  // namespace modeld::util
