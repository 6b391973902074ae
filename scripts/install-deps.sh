#!/bin/sh
# Installs every Debian 12 package modeld needs to build, test and run its demo.
# Run as root on a fresh Debian 12 host. Safe to run again.
set -eu
export DEBIAN_FRONTEND=noninteractive
# Packages installed here must not start their services (tinyproxy, prometheus) on a host whose
# PID 1 is not systemd, where invoke-rc.d would run their init scripts: policy-rc.d forbids it
# for the duration of this script (deb-systemd-invoke honours it too).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT INT TERM
fi
# Another apt (unattended-upgrades, a colleague's install) may hold the lock: wait for it, up to
# 10 minutes. DPkg::Lock::Timeout covers dpkg's lock, not the lists lock apt-get update takes, so
# an update that finds that lock taken is tried again; any other failure ends the script at once.
tries=0
while ! out=$(apt-get update -qq -o DPkg::Lock::Timeout=600 2>&1); do
    case "$out" in
        *"Could not get lock"*) ;;
        *) printf '%s\n' "$out" >&2; exit 1 ;;
    esac
    tries=$((tries + 1))
    if [ "$tries" -ge 120 ]; then
        printf '%s\ninstall-deps.sh: another apt held the package lists for 10 minutes; try again when it is done\n' "$out" >&2
        exit 1
    fi
    [ "$tries" -eq 1 ] && echo "install-deps.sh: waiting for another apt to release /var/lib/apt/lists/lock" >&2
    sleep 5
done
apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends \
    build-essential cmake ninja-build ccache pkg-config git ca-certificates \
    libboost1.81-dev libboost-url1.81-dev libsystemd-dev nlohmann-json3-dev libspdlog-dev libfmt-dev \
    catch2 libssl-dev libtomlplusplus-dev libcli11-dev \
    systemd dbus util-linux procps curl python3 python3-pytest \
    openssl tinyproxy mitmproxy aria2 prometheus tmux \
    dpkg-dev file gzip lintian fuse3 python3-fuse e2fsprogs nginx-core \
    ansible ansible-lint python3-apt openssh-server openssh-client iproute2 >/dev/null
# dpkg-dev (dpkg-shlibdeps), file and gzip are what scripts/package.sh's CPack DEB run needs;
# lintian checks the package (docs/packaging.md).
# fuse3 and python3-fuse run tests/fixtures/slow_fs.py, a disk that stalls or has a bad sector on
# purpose (tests/integration/test_slow_disk_e2e.py, test_warm_eio_e2e.py); e2fsprogs (mkfs.ext4) makes the ext4 loop image
# test_warm_e2e.py keeps models on (tmpfs makes mincore meaningless).
# nginx-core (with the slice module) runs the site cache of config/site-cache/ in
# tests/integration/test_site_cache_e2e.py, as its own instance; the package's service stays off.
# ansible and ansible-lint (6.13) check the collection in ansible/ (tests/checks/ansible_collection.py)
# and drive it; python3-apt is what its apt module needs on the hosts it installs modeld on.
# openssh-server, openssh-client and iproute2 make the simulated hosts of tests/integration/fleet.py
# (each runs its own sshd in its own network namespace); the machine's own ssh service stays off.
# tinyproxy (a CONNECT proxy) and mitmproxy (a TLS-intercepting proxy, standing in for
# Dragonfly) are real proxies for the tests; aria2 is a baseline of tests/bench/download.
# The tinyproxy package starts a system service; the tests run their own instances.
systemctl disable --now tinyproxy >/dev/null 2>&1 || true
systemctl disable --now nginx >/dev/null 2>&1 || true
systemctl disable --now ssh.service >/dev/null 2>&1 || true
systemctl disable --now ssh.socket >/dev/null 2>&1 || true
# prometheus is here for promtool (`promtool check metrics` in tests/integration/test_ops_e2e.py);
# its package enables a server and an exporter that nothing here wants running.
# (One at a time: systemctl gives up on the whole list when one unit is missing.)
for unit in prometheus prometheus-node-exporter; do
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
done
