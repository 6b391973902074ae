#!/bin/sh
# Installs every Debian 12 package modeld needs to build, test and run its demo.
# Run as root on a fresh Debian 12 host. Safe to run again.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    build-essential cmake ninja-build ccache pkg-config git ca-certificates \
    libboost1.81-dev libsystemd-dev nlohmann-json3-dev libspdlog-dev libfmt-dev \
    catch2 libssl-dev libtomlplusplus-dev libcli11-dev \
    systemd dbus util-linux procps curl python3 python3-pytest >/dev/null
