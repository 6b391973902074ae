// The Deployer's events as fields (wire::Event), filled from a deployment record.
#include "deploy/control.hpp"

namespace modeld::deploy {

Event deployment_event(EventKind kind, const Deployment& d) {
  Event e;
  e.kind = kind;
  e.id = d.id;
  e.model = d.model;
  e.phase = d.phase;
  e.state = d.state;
  e.error = d.error;
  if (kind == EventKind::progress) e.progress = d.progress;
  if (kind == EventKind::progress && d.phase == Phase::warming) e.warm = d.warm;
  return e;
}

}  // namespace modeld::deploy
