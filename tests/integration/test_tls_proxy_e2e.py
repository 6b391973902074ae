"""End to end, TLS and proxies: a TLS hub trusted through hub.ca_file (and refused without it or
with a certificate for another name), the same hub reached through a real CONNECT proxy
(tinyproxy) with NO_PROXY bypassing it, and through a TLS-intercepting proxy standing in for
Dragonfly (mitmproxy's mitmdump) whose CA modeld trusts through hub.ca_file.

The proxy variables reach modeld as Environment= lines of modeld.service's test drop-in, as an
administrator would set them. Everything listens on 127.0.0.1; waits have deadlines."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from modeld_env import Hub, ModeldEnv, free_port, make_ca, make_leaf, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MODELS = ["trusted", "untrusted", "wrongname", "viaproxy", "bypass", "intercepted", "notintercepted"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d / "hub-ca", "modeld test hub CA")
    good = make_leaf(ca, d / "hub-ca", "hub")  # localhost, 127.0.0.1
    wrong = make_leaf(ca, d / "hub-ca", "wrong", sans="DNS:wrong.example")
    mitm_ca = make_ca(d / "mitm-ca", "modeld test intercepting proxy CA")
    return {"ca": ca[0], "good": good, "wrong": wrong, "mitm_ca": mitm_ca}


@pytest.fixture(scope="module")
def env(tmp_path_factory, pki):
    work = tmp_path_factory.mktemp("tls")
    cert, key = pki["good"]
    e = ModeldEnv(workdir=work, hub_args=["--tls-cert", str(cert), "--tls-key", str(key)],
                  config_extra=f'ca_file = "{pki["ca"]}"')
    e.pki = pki
    e.ports = {}
    tables = ""
    for i, name in enumerate(MODELS):
        e.add_repo(f"acme/{name}", shards=2, shard_size=200_000, seed=300 + i)
        e.ports[name] = free_port()
        tables += model_table(name, f"acme/{name}", e.ports[name])
    try:
        e.start(tables)
        assert e.hub.endpoint.startswith("https://")
        yield e
    finally:
        e.stop()


@pytest.fixture
def restore(env):
    """Puts modeld back to the plain TLS set-up (the hub's CA trusted, no proxy) after a test."""
    yield
    if (env.config_extra, env.environment, env.endpoint) != (f'ca_file = "{env.pki["ca"]}"', {}, None):
        env.endpoint = None
        env.reconfigure(config_extra=f'ca_file = "{env.pki["ca"]}"', environment={})


def hub_downloads(env, name: str) -> int:
    return len([r for r in env.hub.requests() if (r.get("file") or "").startswith(f"acme/{name}/")])


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    def listening():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(f"{what} to listen on {port}", listening, timeout=timeout)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def failed_with_certificate_error(env, name: str) -> dict:
    dep = env.deploy_and_wait(name, 1)
    assert dep["state"] == "failed" and dep["phase"] == "planning", dep
    assert dep["error"]["code"] == "network_error", dep["error"]
    assert "certificate" in dep["error"]["message"].lower(), dep["error"]
    assert hub_downloads(env, name) == 0
    return dep


# --- TLS -----------------------------------------------------------------------------------------

def test_a_tls_hub_whose_ca_is_in_ca_file_deploys(env):
    dep = env.deploy_and_wait("trusted")
    assert dep["state"] == "succeeded"
    assert env.status()["active"]["model"] == "trusted"
    assert hub_downloads(env, "trusted") >= 2  # listing and files went over TLS to both origins
    assert env.hub.stats()["cdn_body_bytes"] > 0


def test_without_ca_file_a_tls_hub_is_refused_naming_the_certificate(env, restore):
    env.reconfigure(config_extra="")
    failed_with_certificate_error(env, "untrusted")
    assert env.status()["active"]["model"] == "trusted"


def test_a_certificate_for_another_host_name_is_refused(env, restore, tmp_path):
    cert, key = env.pki["wrong"]
    other = Hub(env.repos, tmp_path, ["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        env.reconfigure(endpoint=other.endpoint)
        dep = env.deploy_and_wait("wrongname", 1)
        assert dep["state"] == "failed" and dep["phase"] == "planning", dep
        assert dep["error"]["code"] == "network_error", dep["error"]
        msg = dep["error"]["message"].lower()
        assert "certificate" in msg or "host" in msg, dep["error"]
        assert not [r for r in other.requests()], "no request may be sent to a host that failed verification"
    finally:
        other.stop()


# --- a CONNECT proxy -------------------------------------------------------------------------------

@pytest.fixture
def tinyproxy(tmp_path):
    exe = shutil.which("tinyproxy")
    if not exe:
        pytest.skip("tinyproxy is not installed")
    port = free_port()
    log = tmp_path / "tinyproxy.log"
    conf = tmp_path / "tinyproxy.conf"
    # No ConnectPort line: CONNECT to any port is allowed (tinyproxy.conf(5)).
    conf.write_text(f"""Port {port}
Listen 127.0.0.1
Timeout 60
LogFile "{log}"
LogLevel Info
MaxClients 50
Allow 127.0.0.1
DisableViaHeader Yes
""")
    out = open(tmp_path / "tinyproxy.out", "wb")
    proc = subprocess.Popen([exe, "-d", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        wait_port(port, proc, "tinyproxy")
        yield {"port": port, "log": log}
    finally:
        stop(proc)
        out.close()


def connects(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [line.split("): ", 1)[1] for line in log.read_text(errors="replace").splitlines()
            if "Request (file descriptor" in line and "CONNECT " in line]


def test_a_connect_proxy_carries_the_downloads_and_no_proxy_bypasses_it(env, restore, tinyproxy):
    proxy = f"http://127.0.0.1:{tinyproxy['port']}"
    env.reconfigure(environment={"HTTPS_PROXY": proxy})
    dep = env.deploy_and_wait("viaproxy")
    assert dep["state"] == "succeeded"
    seen = connects(tinyproxy["log"])
    assert f"CONNECT 127.0.0.1:{env.hub.port} HTTP/1.1" in seen, seen
    assert f"CONNECT 127.0.0.1:{env.hub.cdn_port} HTTP/1.1" in seen, seen

    # NO_PROXY names the hub's host: straight there, even with a proxy that is not listening.
    dead = free_port()
    env.reconfigure(environment={"HTTPS_PROXY": f"http://127.0.0.1:{dead}", "NO_PROXY": "localhost,127.0.0.1"})
    before = len(connects(tinyproxy["log"]))
    dep = env.deploy_and_wait("bypass")
    assert dep["state"] == "succeeded"
    assert len(connects(tinyproxy["log"])) == before


# --- a TLS-intercepting proxy (Dragonfly's role) -----------------------------------------------------

@pytest.fixture
def mitmdump(env, tmp_path):
    exe = shutil.which("mitmdump")
    if not exe:
        pytest.skip("mitmdump is not installed")
    confdir = tmp_path / "mitm-conf"
    confdir.mkdir()
    cert, key = env.pki["mitm_ca"]
    # mitmproxy's CA file holds the private key and the certificate, in that order.
    (confdir / "mitmproxy-ca.pem").write_text(key.read_text() + cert.read_text())
    port = free_port()
    flows = tmp_path / "mitmdump.out"
    out = open(flows, "wb")
    proc = subprocess.Popen(
        [exe, "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
         "--set", f"ssl_verify_upstream_trusted_ca={env.pki['ca']}", "--set", "flow_detail=1"],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_port(port, proc, "mitmdump", timeout=60)
        yield {"port": port, "flows": flows, "ca": cert}
    finally:
        stop(proc)
        out.close()


def test_an_intercepting_proxy_whose_ca_is_in_ca_file_serves_the_downloads(env, restore, mitmdump):
    proxy = f"http://127.0.0.1:{mitmdump['port']}"
    # Only the proxy's CA is trusted: a direct connection to the hub would fail verification.
    env.reconfigure(config_extra=f'ca_file = "{mitmdump["ca"]}"', environment={"HTTPS_PROXY": proxy})
    dep = env.deploy_and_wait("intercepted")
    assert dep["state"] == "succeeded"
    log = mitmdump["flows"].read_text(errors="replace")
    # (mitmdump shortens long URLs in this log: match their beginnings)
    assert f"GET https://127.0.0.1:{env.hub.port}/api/models/" in log, log[-2000:]
    assert f"GET https://127.0.0.1:{env.hub.cdn_port}/repos/" in log, log[-2000:]


def test_an_intercepting_proxy_whose_ca_is_not_trusted_is_refused(env, restore, mitmdump):
    # The hub's own CA is trusted, so only a connection through the proxy can fail.
    env.reconfigure(environment={"HTTPS_PROXY": f"http://127.0.0.1:{mitmdump['port']}"})
    failed_with_certificate_error(env, "notintercepted")
