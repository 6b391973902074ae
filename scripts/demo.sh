#!/bin/sh
# The demo: installs the dependencies, builds, starts the bundled hub with two generated
# checkpoints, boots a private systemd, runs modeld as its unit, deploys one model and then the
# other with `modelctl deploy --wait`, and shows the new model answering a completion.
# Run as root on Debian 12. Pass --keep to leave everything running and print how to look at it.
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh modeld modelctl
exec /usr/bin/python3 scripts/demo.py "$@"
