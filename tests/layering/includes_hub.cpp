// Compiled by the layering checks (tests/layering/CMakeLists.txt): builds in a target that links a
// stage depending on hub, and must fail to compile in one linking modeld_verify only.

#include "hub/hub.hpp"

namespace modeld::test {

/// Names a type of hub's header, so the include is not the only thing compiled.
const hub::RetryPolicy* layering_probe = nullptr;

}  // namespace modeld::test
