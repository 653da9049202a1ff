"""The container files, checked without a Docker engine.

There is no Docker on the machines that run these tests, so the compose
files and the Dockerfile are checked against what is installed instead:
they parse; every flag they pass exists in the installed Flower CLI, is not
deprecated, and is accepted with its value; the images are Flower's at the
installed Flower version; addresses, ports, networks and partitions agree
between services; every volume they mount exists in the repository or is
made by the scripts in ``deploy/``; every compose file is TLS-only with
SuperNode authentication (there is no plaintext variant: no ``--insecure``
anywhere, every connection verified with the federation's CA, every
SuperNode with its own key); the GPU variant reserves GPUs.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import flwr
import pytest
import yaml
from conftest import REPO
from packaging.specifiers import SpecifierSet

FLOWER = flwr.__version__
BIN = Path(sys.executable).parent
FILES = {"base": "docker-compose.yml", "gpu": "docker-compose.gpu.yml", "resident": "docker-compose.resident.yml"}
VARIANTS = {"base": ["base"], "gpu": ["base", "gpu"], "resident": ["base", "resident"]}
FLOWER_IMAGES = {"flwr/superlink": "flower-superlink", "flwr/supernode": "flower-supernode"}
FEDWEIGH_PROCESSES = {"fedweigh-superexec": "resident", "fedweigh-supernode": "supernode"}
"""fedweigh's own site processes (Flower's CLIs with fedweigh's changes): each a module of fedweigh/flower/, which the
image holds as the package /app/bin/fedweigh_flower."""
IMAGE_PACKAGE = "fedweigh_flower"
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
# Compose merges an overlay's volumes into the base's by container path; command
# and entrypoint it replaces whole. (Ports it appends, so overlays here add none.)
_MERGED_BY_TARGET = {"volumes"}


# --------------------------------------------------------------------------------------
# Reading compose files as Docker Compose would
# --------------------------------------------------------------------------------------


def interpolate(value: Any) -> Any:
    """Resolve ``${VAR:-default}`` to its default, as on a machine that sets nothing."""
    if isinstance(value, str):

        def default(match: re.Match[str]) -> str:
            if match.group(2) is None:
                raise AssertionError(f"${{{match.group(1)}}} has no default in {value!r}")
            return match.group(2)

        return _VARIABLE.sub(default, value)
    if isinstance(value, list):
        return [interpolate(item) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item) for key, item in value.items()}
    return value


@functools.cache
def load(name: str) -> dict[str, Any]:
    with (REPO / FILES[name]).open() as handle:
        return interpolate(yaml.safe_load(handle))


def _target(entry: Any) -> str:
    return str(entry).split(":")[1] if ":" in str(entry) else str(entry)


def merge(base: Any, overlay: Any, key: str = "") -> Any:
    """Docker Compose's merge of an overlay file into a base file (the parts used here)."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for name, value in overlay.items():
            merged[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return merged
    if key in _MERGED_BY_TARGET and isinstance(base, list) and isinstance(overlay, list):
        kept = [entry for entry in base if _target(entry) not in {_target(e) for e in overlay}]
        return kept + list(overlay)
    return copy.deepcopy(overlay)  # scalars, command, entrypoint, other lists


def variant(name: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for part in VARIANTS[name]:
        config = merge(config, load(part))
    return config


def services(name: str) -> dict[str, dict[str, Any]]:
    return variant(name)["services"]


def command(service: Mapping[str, Any]) -> list[str]:
    return [str(arg) for arg in service.get("command", [])]


def option(service: Mapping[str, Any], flag: str) -> str:
    args = command(service)
    assert args.count(flag) == 1, f"{flag} given {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def supernodes(config: Mapping[str, dict[str, Any]]) -> list[str]:
    return sorted(name for name in config if re.fullmatch(r"supernode-\d+", name))


def dockerfile_entrypoint() -> str:
    match = re.search(r'^ENTRYPOINT \["([^"]+)"', (REPO / "Dockerfile").read_text(), re.M)
    assert match, "the Dockerfile has no exec-form ENTRYPOINT"
    return match.group(1)


def cli_of(service: Mapping[str, Any]) -> str:
    """The Flower executable a service runs."""
    if "entrypoint" in service:
        return Path(list(service["entrypoint"])[0]).name  # the image's /app/bin/fedweigh-superexec: ours
    image = str(service.get("image", ""))
    for repository, cli in FLOWER_IMAGES.items():
        if image.startswith(f"{repository}:"):
            return cli
    assert "build" in service, f"unknown image {image!r}"
    return dockerfile_entrypoint()


# --------------------------------------------------------------------------------------
# The installed Flower CLI
# --------------------------------------------------------------------------------------


@functools.cache
def cli_options(cli: str) -> dict[str, str]:
    """Every flag of ``cli --help`` with its help text."""
    text = subprocess.run([BIN / cli, "--help"], capture_output=True, text=True, timeout=120, check=True).stdout
    options: dict[str, str] = {}
    flags: list[str] = []
    section = text[text.index("options:") :]
    for line in section.splitlines()[1:]:
        if line.startswith("  -"):
            header, _, description = line.strip().partition("  ")
            flags = re.findall(r"--[A-Za-z0-9][\w-]*", header)
            for flag in flags:
                options[flag] = description.strip()
        elif line.startswith("   "):
            for flag in flags:
                options[flag] = f"{options[flag]} {line.strip()}".strip()
    assert "--help" in options, f"could not read the options of {cli}"
    return options


@functools.cache
def accepts(cli: str, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """Let the CLI's own parser check ``args`` (values, choices) before ``--help`` stops it."""
    return subprocess.run([BIN / cli, *args, "--help"], capture_output=True, text=True, timeout=120, check=False)


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_compose_file_parses_and_overlays_only_known_services(name):
    config = load(name)
    assert isinstance(config.get("services"), dict) and config["services"]
    base = load("base")["services"]
    for service, body in config["services"].items():
        assert service in base or body.get("profiles"), f"{FILES[name]}: {service} is not in docker-compose.yml"
        if name != "base" and service in base:
            assert "ports" not in body, f"{FILES[name]}: {service} would publish its port twice"


@pytest.mark.parametrize("name", VARIANTS)
def test_every_flag_exists_in_the_installed_flower_cli(name):
    for service, body in services(name).items():
        cli = cli_of(body)
        assert cli in {"flower-superlink", "flower-supernode", "flower-superexec", *FEDWEIGH_PROCESSES}, service
        known = cli_options(cli)
        for flag in (arg for arg in command(body) if arg.startswith("--")):
            assert flag in known, f"{service}: {cli} has no {flag}"
            assert "deprecated" not in known[flag].lower(), f"{service}: {flag} is deprecated: {known[flag]}"
        result = accepts(cli, tuple(command(body)))
        assert result.returncode == 0, f"{service}: {cli} rejects {command(body)}:\n{result.stderr[-2000:]}"


def test_images_are_flower_images_at_the_installed_version():
    pin = SpecifierSet(
        next(
            dep.split("]", 1)[1]
            for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
            if dep.startswith("flwr[")
        )
    )
    assert FLOWER in pin
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(rf"^ARG FLWR_VERSION={re.escape(FLOWER)}$", dockerfile, re.M)
    assert re.search(r"^FROM flwr/superexec:\$\{FLWR_VERSION\}$", dockerfile, re.M)
    assert dockerfile_entrypoint() == "flower-superexec"
    for name in FILES:
        for service, body in load(name)["services"].items():
            image = str(body.get("image", ""))
            if image.startswith("flwr/"):
                assert image.rsplit(":", 1)[1] == FLOWER, f"{FILES[name]}: {service} uses {image}"
            if "build" in body:
                assert image.startswith(f"fedweigh-superexec:{FLOWER}"), f"{service}: {image}"
                assert body["build"]["args"]["FLWR_VERSION"] == FLOWER


def test_dockerfile_installs_every_dependency_but_flower(tmp_path):
    """Run the Dockerfile's own dependency filter on this pyproject.toml."""
    dockerfile = (REPO / "Dockerfile").read_text()
    snippet = re.search(r'python -c "import re, tomllib;[^"]+"', dockerfile)
    assert snippet, "the dependency filter moved; update this test"
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    output = subprocess.run(  # through sh, as RUN does, with this interpreter as `python`
        ["sh", "-c", snippet.group(0)],
        cwd=tmp_path,
        env={"PATH": f"{BIN}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert output == [dep for dep in dependencies if not dep.startswith("flwr[")]
    assert any(dep.startswith("flwr-datasets") for dep in output)  # not mistaken for flwr
    run = re.search(r"^RUN (.*?[^\\])$", dockerfile, re.M | re.S).group(1)
    assert subprocess.run(["sh", "-n"], input=run, text=True, check=False).returncode == 0


@pytest.mark.parametrize("name", VARIANTS)
def test_addresses_ports_and_partitions_agree(name):
    config = services(name)
    link = config["superlink"]
    port = option(link, "--port")
    assert option(link, "--host") == "0.0.0.0"
    published = [str(mapping) for mapping in link["ports"]]
    assert len(published) == 1 and published[0].endswith(f"{port}:{port}"), published
    assert option(config["superexec-serverapp"], "--runtime-api-address") == f"superlink:{port}"
    assert set(config["superexec-serverapp"]["networks"]) & set(link["networks"])

    nodes = supernodes(config)
    assert len(nodes) >= 3
    partitions = []
    for node in nodes:
        body, number = config[node], node.split("-")[1]
        assert option(body, "--superlink") == f"superlink:{port}"
        assert option(body, "--isolation") == "process"  # its ClientApps run in its SuperExec service
        assert option(body, "--host") == "0.0.0.0"
        assert set(body["networks"]) & set(link["networks"]), f"{node} cannot reach the SuperLink"
        executor = config[f"superexec-clientapp-{number}"]
        assert option(executor, "--runtime-api-address") == f"{node}:{option(body, '--port')}"
        assert set(executor["networks"]) & set(body["networks"]), f"{node}'s SuperExec cannot reach it"
        others = {net for other in nodes if other != node for net in config[other]["networks"]}
        assert not set(executor["networks"]) & (others - set(body["networks"])), f"{node}'s site is not private"
        node_config = dict(pair.split("=") for pair in option(body, "--node-config").split())
        partitions.append(int(node_config["partition-id"]))
        assert int(node_config["num-partitions"]) == len(nodes)
    assert sorted(partitions) == list(range(len(nodes)))

    declared = set(variant(name).get("networks", {}))
    for service, body in config.items():
        assert set(body.get("networks", [])) <= declared, service
        assert set(body.get("depends_on", [])) <= set(config), service


@pytest.fixture(scope="module")
def made_by_scripts(tmp_path_factory) -> set[str]:
    """Repository-relative paths that deploy/make-*.sh write (run into a scratch copy)."""
    scratch = tmp_path_factory.mktemp("deploy")
    subprocess.run([REPO / "deploy/make-certificates.sh", "-o", scratch / "certificates"], check=True, timeout=60)
    nodes = supernodes(services("base"))
    runtime = [arg for node in nodes for arg in ("-s", node)]
    subprocess.run([REPO / "deploy/make-certificates.sh", "-o", scratch / "certificates", *runtime], check=True)
    subprocess.run([REPO / "deploy/make-supernode-keys.sh", "-o", scratch / "keys", *nodes], check=True, timeout=60)
    return {f"deploy/{path.relative_to(scratch)}" for path in scratch.rglob("*") if path.is_file()}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_mounted_volume_exists_or_is_made_by_a_deploy_script(name, made_by_scripts):
    declared = set(variant(name).get("volumes", {}))
    for service, body in services(name).items():
        for volume in body.get("volumes", []):
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{service}: named volume {source} is not declared"
                continue
            relative = Path(source).as_posix().removeprefix("./")
            assert not source.startswith("/"), f"{service}: {source} is outside the repository"
            if (REPO / relative).exists():
                continue
            assert relative in made_by_scripts, f"{service}: {source} neither exists nor is made by deploy/*.sh"
            assert (REPO / relative).parent.is_dir(), f"{service}: the folder of {source} is not in the repository"


def mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Container path to host path of a service's bind mounts."""
    return {str(v).split(":")[1]: str(v).split(":")[0] for v in service.get("volumes", []) if str(v).startswith(".")}


def test_no_compose_file_runs_without_tls():
    """Every compose file in the repository, overlays and profiles included: no plaintext anywhere."""
    found = sorted(path.name for path in REPO.glob("docker-compose*.y*ml"))
    assert found == sorted(FILES.values()), f"compose files not checked here: {set(found) - set(FILES.values())}"
    for name, file in FILES.items():
        assert "--insecure" not in (REPO / file).read_text(), f"{file} mentions --insecure"
        for service, body in load(name)["services"].items():
            args = command(body)
            assert not any(arg.startswith("--insecure") for arg in args), f"{file}: {service} runs without TLS"


@pytest.mark.parametrize("name", VARIANTS)
def test_every_connection_is_tls_verified_by_the_ca_and_every_supernode_authenticated(name, made_by_scripts):
    """The SuperLink serves TLS and refuses unregistered SuperNodes; each client side verifies with ca.crt."""
    config = services(name)
    link = config["superlink"]
    assert "--enable-supernode-auth" in command(link)
    superlink_tls = {"--ssl-ca-certfile": "ca.crt", "--ssl-certfile": "server.crt", "--ssl-keyfile": "server.key"}
    for server in [service for service in config if service.startswith("superlink")]:  # and the simulation one
        for flag, file in superlink_tls.items():
            assert mounts(config[server])[option(config[server], flag)] == f"./deploy/certificates/{file}", server
    executor = config["superexec-serverapp"]
    assert mounts(executor)[option(executor, "--root-certificates")] == "./deploy/certificates/ca.crt"

    keys = set()
    for node in supernodes(config):
        body, number = config[node], node.split("-")[1]
        mounted = mounts(body)
        assert mounted[option(body, "--root-certificates")] == "./deploy/certificates/ca.crt"  # the SuperLink
        keys.add(mounted[option(body, "--auth-supernode-private-key")])
        # Its Runtime API, for its SuperExec: a certificate for its own name, verified by the same CA.
        assert mounted[option(body, "--ssl-certfile")] == f"./deploy/certificates/{node}.crt"
        assert mounted[option(body, "--ssl-keyfile")] == f"./deploy/certificates/{node}.key"
        assert mounted[option(body, "--ssl-ca-certfile")] == "./deploy/certificates/ca.crt"
        clientapps = config[f"superexec-clientapp-{number}"]
        assert mounts(clientapps)[option(clientapps, "--root-certificates")] == "./deploy/certificates/ca.crt"
        visible = {src for service in (body, clientapps) for src in mounts(service).values()}
        secrets = {src for src in visible if src.endswith(".key") or "/keys/" in src}
        assert secrets == {f"./deploy/certificates/{node}.key", f"./deploy/keys/{node}"}, f"{node} sees {secrets}"
    assert keys == {f"./deploy/keys/{node}" for node in supernodes(config)}  # one key per node, its own
    for service, body in config.items():
        if service not in {"superlink", "superlink-simulation"}:
            assert not {"./deploy/certificates/server.key", "./deploy/certificates/ca.key"} & set(
                mounts(body).values()
            ), f"{service} sees the SuperLink's or the CA's key"


def test_certificates_name_every_server_as_its_clients_call_it(tmp_path):
    """The script's certificates, made as docs/deployment.md says, verify for the names the compose file uses."""
    config = services("base")
    nodes = supernodes(config)
    certificates = tmp_path / "certificates"
    subprocess.run(
        [REPO / "deploy/make-certificates.sh", "-o", certificates, "-c", str(len(nodes))], check=True, timeout=60
    )
    superlink = option(config[nodes[0]], "--superlink").split(":")[0]
    names = {"server": superlink} | {
        node: option(config[f"superexec-clientapp-{node.split('-')[1]}"], "--runtime-api-address").split(":")[0]
        for node in nodes
    }
    for file, host in names.items():
        verify = ["openssl", "verify", "-CAfile", certificates / "ca.crt", "-verify_hostname", host]
        result = subprocess.run([*verify, certificates / f"{file}.crt"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{file}.crt does not verify for {host}: {result.stdout}{result.stderr}"
    # The `flwr` CLI on the Docker host reaches the published port on 127.0.0.1.
    verify = ["openssl", "verify", "-CAfile", certificates / "ca.crt", "-verify_ip", "127.0.0.1"]
    assert subprocess.run([*verify, certificates / "server.crt"], capture_output=True, check=False).returncode == 0
    wrong = ["openssl", "verify", "-CAfile", certificates / "ca.crt", "-verify_hostname", "elsewhere.example.org"]
    assert subprocess.run([*wrong, certificates / "server.crt"], capture_output=True, check=False).returncode != 0


def subject_alt_names(certificate) -> str:
    """The subjectAltName extension of a certificate, as openssl prints it."""
    command = ["openssl", "x509", "-in", certificate, "-noout", "-ext", "subjectAltName"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_certificate_script_puts_names_and_addresses_in_the_certificate(tmp_path):
    script = REPO / "deploy/make-certificates.sh"
    subprocess.run([script, "-o", tmp_path, "-n", "link.example.org", "-i", "10.9.8.7"], check=True, timeout=60)
    san = subject_alt_names(tmp_path / "server.crt")
    assert "DNS:link.example.org" in san and "IP Address:10.9.8.7" in san and "DNS:localhost" in san
    assert oct((tmp_path / "server.key").stat().st_mode & 0o777) == "0o600"
    bad = subprocess.run([script, "-o", tmp_path, "-i", "10.9.8"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "-i expects an IPv4 or IPv6 address" in bad.stderr


def test_certificate_script_reuses_its_ca_and_can_leave_out_loopback(tmp_path):
    """-L: only the names given (a certificate for one host, useless for any other); the CA is kept and signs it."""
    script = REPO / "deploy/make-certificates.sh"
    subprocess.run([script, "-o", tmp_path], check=True, capture_output=True, timeout=60)
    ca = (tmp_path / "ca.crt").read_bytes()
    subprocess.run([script, "-o", tmp_path, "-n", "elsewhere.example.org", "-L"], check=True, capture_output=True)
    assert (tmp_path / "ca.crt").read_bytes() == ca
    san = subject_alt_names(tmp_path / "server.crt")
    assert "DNS:elsewhere.example.org" in san and "localhost" not in san and "127.0.0.1" not in san
    verify = ["openssl", "verify", "-CAfile", tmp_path / "ca.crt"]
    assert subprocess.run([*verify, tmp_path / "server.crt"], capture_output=True, check=False).returncode == 0
    loopback = subprocess.run([*verify, "-verify_ip", "127.0.0.1", tmp_path / "server.crt"], capture_output=True)
    assert loopback.returncode != 0
    bad = subprocess.run([script, "-o", tmp_path, "-s", "ca"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "would overwrite ca.crt" in bad.stderr


def test_gpu_variant_reserves_gpus_for_every_clientapp(made_by_scripts):
    config = services("gpu")
    for name in [*(f"superexec-clientapp-{n.split('-')[1]}" for n in supernodes(config)), "superexec-serverapp"]:
        devices = config[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
        assert config[name]["build"]["args"]["TORCH_INDEX_URL"] == ""  # PyPI's CUDA wheels
    simulation = config["superlink-simulation"]
    assert simulation["profiles"] == ["simulation"] and cli_of(simulation) == "flower-superlink"
    assert "--simulation" in command(simulation)
    assert config["superlink"]["image"] == f"flwr/superlink:{FLOWER}"  # the GPU file leaves the SuperLink alone


def test_resident_variant_runs_fedweigh_s_site_processes_from_the_app_image():
    """docker-compose.resident.yml: each site's SuperExec is fedweigh-superexec and its SuperNode fedweigh-supernode,
    both from the app image, which holds the package of fedweigh's changes to Flower alone."""
    config = services("resident")
    app = load("base")["x-app"]
    for node in supernodes(config):
        superexec = config[f"superexec-clientapp-{node.split('-')[1]}"]
        assert cli_of(superexec) == "fedweigh-superexec"
        assert option(superexec, "--runtime-api-address") == f"{node}:9094"  # its own SuperNode, as in the base
        assert option(config[node], "--isolation") == "process"  # so the SuperNode starts no SuperExec of its own
        assert cli_of(config[node]) == "fedweigh-supernode"
        assert (config[node]["image"], config[node]["build"]) == (interpolate(app["image"]), interpolate(app["build"]))
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = re.search(rf"^COPY --chown=app:app (.+) /app/bin/{IMAGE_PACKAGE}/$", dockerfile, re.M).group(1).split()
    dockerignore = (REPO / ".dockerignore").read_text().splitlines()
    modules = ["__init__", "objects", *FEDWEIGH_PROCESSES.values()]  # objects: the prompt pulls both use
    assert set(copied) == {f"fedweigh/flower/{module}.py" for module in modules}
    for source in copied:
        assert f"!{source}" in dockerignore
        # The image has Flower (with what Flower itself requires) and the app's dependencies, not the app: the
        # package must stand alone, importing only Flower, Flower's own requirements (httpx, its Runtime API
        # client), the standard library and itself.
        tree = ast.parse((REPO / source).read_text())
        nodes = list(ast.walk(tree))
        imported = {alias.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for alias in n.names}
        imported |= {
            n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.module and not n.level
        }
        requires = importlib.metadata.requires("flwr")
        flower_requires = {re.split(r"[ <>=!~;\[]", r)[0] for r in requires if "extra" not in r}
        assert "httpx" in flower_requires
        assert imported <= {"__future__", "flwr", *flower_requires, *sys.stdlib_module_names}, (source, imported)
    for program, module in FEDWEIGH_PROCESSES.items():
        assert f"exec python -m {IMAGE_PACKAGE}.{module}" in dockerfile and f"/app/bin/{program}" in dockerfile


def test_the_image_sets_the_process_environment_fedweighs_launchers_set():
    from fedweigh.allocator import PROCESS_ENV

    dockerfile = (REPO / "Dockerfile").read_text()
    for var, value in PROCESS_ENV.items():
        assert re.search(rf"^\s*(ENV\s+)?{var}={value}\b", dockerfile, re.M), f"the Dockerfile does not set {var}"
