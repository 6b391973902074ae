// Compiled by the layering checks (tests/layering/CMakeLists.txt): builds in a target that links
// a stage depending on deploy (control), and must fail to compile in one linking modeld_wire only:
// the wire contract's stage sees util and repo, never the stages that fill or serve its types.

#include "deploy/deployment.hpp"

namespace modeld::test {

/// Names a type of deploy's header, so the include is not the only thing compiled.
const deploy::Deployment* layering_deploy_probe = nullptr;

}  // namespace modeld::test
