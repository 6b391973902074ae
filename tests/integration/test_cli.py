"""The programs' command lines without a running systemd: configuration checks and an
unreachable daemon."""

from __future__ import annotations

import subprocess
from pathlib import Path

from modeld_env import BUILD_DIR, SOURCE_DIR

MODELD = str(BUILD_DIR / "modeld")
MODELCTL = str(BUILD_DIR / "modelctl")


def test_the_shipped_example_configuration_is_valid():
    r = subprocess.run([MODELD, "--check-config", "--config", str(SOURCE_DIR / "config" / "modeld.toml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_model_examples_are_valid_together_once_renamed(tmp_path: Path):
    # Kimi-K2.5 on every GPU, MiniMax-M2.5 on GPUs 0-3 and Qwen3 on GPUs 4-7, as shipped.
    (tmp_path / "modeld.toml").write_text((SOURCE_DIR / "config" / "modeld.toml").read_text())
    (tmp_path / "models.d").mkdir()
    names = []
    for f in sorted((SOURCE_DIR / "config" / "models.d").iterdir()):
        if f.name.endswith(".toml") or f.name.endswith(".toml.example"):
            name = f.name.removesuffix(".example")
            (tmp_path / "models.d" / name).write_text(f.read_text())
            names.append(name)
    assert names == ["kimi-k2-5.toml", "minimax-m2-5.toml", "qwen3-235b.toml"]
    r = subprocess.run([MODELD, "--check-config", "--config", str(tmp_path / "modeld.toml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 model(s)" in r.stdout, r.stdout


def _model(name: str, serve: str) -> str:
    return f'[models.{name}]\nrepo = "org/{name}"\n[models.{name}.serve]\ncommand = ["x"]\n{serve}'


def test_check_config_refuses_one_port_for_models_on_disjoint_gpus_naming_both(tmp_path: Path):
    cfg = tmp_path / "modeld.toml"
    cfg.write_text("[daemon]\n")
    (tmp_path / "models.d").mkdir()
    a = tmp_path / "models.d" / "a.toml"
    b = tmp_path / "models.d" / "b.toml"
    a.write_text(_model("low", "gpu_ids = [0, 1, 2, 3]\nport = 8000\n"))
    b.write_text(_model("high", "gpu_ids = [4, 5, 6, 7]\nport = 8000\n"))
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{b}:6:8: models.high.serve.port = 8000 is also the port of model 'low' ({a}:6)" in r.stderr, r.stderr
    # Overlapping GPU sets never serve together: the same port is fine.
    b.write_text(_model("high", "gpu_ids = [3, 4]\nport = 8000\n"))
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_check_config_refuses_cuda_visible_devices_beside_gpu_ids(tmp_path: Path):
    cfg = tmp_path / "modeld.toml"
    cfg.write_text(_model("m", 'gpu_ids = [0]\nenvironment = { CUDA_VISIBLE_DEVICES = "0" }\n'))
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{cfg}:6:17:" in r.stderr and "CUDA_VISIBLE_DEVICES" in r.stderr, r.stderr
    cfg.write_text(_model("m", 'environment = { CUDA_VISIBLE_DEVICES = "0" }\n'))
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_typo_in_the_configuration_names_file_line_column_and_key(tmp_path: Path):
    cfg = tmp_path / "modeld.toml"
    cfg.write_text('[daemon]\nmodels_dir = "/srv/models"\n\n[hub]\nparalel_files = 4\n')
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{cfg}:5:1:" in r.stderr
    assert "paralel_files" in r.stderr and "parallel_files" in r.stderr


def test_a_typo_in_a_model_file_names_that_file(tmp_path: Path):
    cfg = tmp_path / "modeld.toml"
    cfg.write_text("[daemon]\n")
    (tmp_path / "models.d").mkdir()
    model = tmp_path / "models.d" / "m.toml"
    model.write_text('[models.m]\nrepo = "org/m"\nrevison = "main"\n[models.m.serve]\ncommand = ["x"]\n')
    r = subprocess.run([MODELD, "--check-config", "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{model}:3:1:" in r.stderr and "revison" in r.stderr


def test_the_daemon_refuses_to_start_on_an_invalid_configuration(tmp_path: Path):
    cfg = tmp_path / "modeld.toml"
    cfg.write_text("[daemon]\nsocket = 5\n")
    r = subprocess.run([MODELD, "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "socket" in r.stderr


def test_modelctl_names_the_socket_when_the_daemon_is_unreachable(tmp_path: Path):
    sock = tmp_path / "nothing.sock"
    r = subprocess.run([MODELCTL, "--socket", str(sock), "status"], capture_output=True, text=True)
    assert r.returncode == 3
    assert str(sock) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_modelctl_takes_the_socket_from_the_environment(tmp_path: Path):
    sock = tmp_path / "env.sock"
    r = subprocess.run([MODELCTL, "--json", "status"], capture_output=True, text=True,
                       env={"MODELD_SOCKET": str(sock), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 3
    assert str(sock) in r.stderr


def test_modelctl_refuses_a_name_that_is_no_model_name_before_asking_the_daemon(tmp_path: Path):
    sock = tmp_path / "absent.sock"  # never reached: the name is refused first (exit 2, not 3)
    for argv in (["plan", ""], ["deploy", "a\x1b[31m"], ["rm", "../etc"], ["verify", "Upper"]):
        r = subprocess.run([MODELCTL, "--socket", str(sock), *argv], capture_output=True, text=True)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "is not a model name" in r.stderr, r.stderr
        assert "\x1b" not in r.stderr  # control bytes are shown escaped, never sent to the terminal
