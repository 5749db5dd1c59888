"""deploy/Dockerfile, for real (issue 21): where Docker runs, the image is built and a
metadata and a data server container serve a client on a private network; unless that
passed in this run, the image's own entry commands run in a clean virtual environment
made from a wheel of the repository instead, so a skip of the image test (the daemon
answers, then debootstrap or the wheel build fails) never leaves the Dockerfile
untested (``STAGER_TEST_IMAGE_STANDIN=1`` runs the stand-in alone).  Both run auth on,
as the manifests do.

No image registry is needed: the base is Debian 12 made with ``debootstrap`` (python3,
python3-venv) and imported, and the packages are wheels built on this machine and
installed with ``--no-index``.  Both are cached under ``$STAGER_IMAGE_CACHE`` (default
``~/.cache/stager/deploy-image``), so a second run builds only stager's own layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from stager.protocol.routes import route

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "deploy" / "Dockerfile"
CACHE = Path(os.environ.get("STAGER_IMAGE_CACHE")
             or Path.home() / ".cache" / "stager" / "deploy-image")
BASE = "stager-test-base:bookworm-python3"
IMAGE = "stager-test:pytest"
# The same command lines in the containers and in the stand-in (the image's
# entrypoint is `stager`).
META_ARGS = ["meta", "--host", "0.0.0.0", "--port", "7070", "--insecure"]
PAYLOAD = os.urandom(3 << 20)
IMAGE_PASSED: list[bool] = []     # set by the image test when it got to its end


def run(argv: list[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          **kw)  # type: ignore[call-overload]


def why_no_docker() -> str | None:
    """Why this machine cannot build and run the image here, or ``None`` when it can."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    try:
        info = run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 20 s"
    if info.returncode != 0:
        return f"the docker daemon is not reachable: {info.stderr.strip()[-300:]}"
    if run(["docker", "image", "inspect", BASE]).returncode == 0:
        return None
    if not (CACHE / "bookworm-python3.tar").exists():
        if shutil.which("debootstrap") is None:
            return f"no base image {BASE}, and debootstrap (to make one) is not installed"
        if os.geteuid() != 0:
            return f"no base image {BASE}, and debootstrap (to make one) needs root"
    return None


@pytest.fixture(scope="module", autouse=True)
def docker_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start ``dockerd`` for this module when Docker is installed (``make test``'s
    Debian packages) but no daemon answers, as root; stopped again at the end.  Where
    it cannot start, the tests see why (``why_no_docker``) and the stand-in runs."""
    if (shutil.which("dockerd") is None or os.geteuid() != 0
            or os.environ.get("STAGER_TEST_IMAGE_STANDIN") == "1"
            or run(["docker", "info"], timeout=20).returncode == 0):
        yield None
        return
    log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while run(["docker", "info"], timeout=20).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(f"dockerd did not start: {log.read_text(errors='replace')[-1500:]}")
                break
            time.sleep(0.5)
        yield daemon
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (for debootstrap)."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^(?:URIs:|deb)\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s*$", text, re.M) \
            or re.search(r"^(?:URIs:|deb)\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", text, re.M)
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


def ensure_base() -> None:
    """Debian 12 with python3 and python3-venv, as the image ``BASE``: imported from the
    cached root file system, made first with debootstrap if there is none (~70 s)."""
    if run(["docker", "image", "inspect", BASE]).returncode == 0:
        return
    tar = CACHE / "bookworm-python3.tar"
    if not tar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        rootfs = CACHE / "rootfs.tmp"
        shutil.rmtree(rootfs, ignore_errors=True)
        made = run(["debootstrap", "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates", "bookworm",
                    str(rootfs), apt_mirror()], timeout=300)
        if made.returncode != 0:
            pytest.skip(f"debootstrap failed: {made.stdout[-300:]} {made.stderr[-300:]}")
        packed = run(["tar", "-C", str(rootfs), "-cf", f"{tar}.tmp", "."], timeout=120)
        assert packed.returncode == 0, packed.stderr
        os.replace(f"{tar}.tmp", tar)
        shutil.rmtree(rootfs, ignore_errors=True)
    imported = run(["docker", "import", str(tar), BASE], timeout=120)
    assert imported.returncode == 0, imported.stderr


def ensure_wheels() -> Path:
    """Wheels of stager's dependencies (and setuptools, wheel: to build stager itself),
    built here for this Python; kept while ``pyproject.toml`` is unchanged."""
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    wheels = CACHE / f"wheels-py{sys.version_info.major}{sys.version_info.minor}-{key}"
    if not (wheels / ".complete").exists():
        for stale in CACHE.glob("wheels-*"):        # of an older pyproject.toml
            shutil.rmtree(stale, ignore_errors=True)
        made = run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels),
                    str(REPO), "setuptools", "wheel"], timeout=300)
        if made.returncode != 0:
            pytest.skip(f"could not build the dependencies' wheels: {made.stderr[-400:]}")
        for own in wheels.glob("stager-*.whl"):
            own.unlink()                  # the image builds stager from the context
        (wheels / ".complete").touch()
    return wheels


def build_context(tmp: Path, wheels: Path) -> Path:
    """The repository's files (tracked and new, not ignored) and the wheels."""
    listed = run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"])
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, cannot list the build context: {listed.stderr}")
    context = tmp / "context"
    for name in filter(None, listed.stdout.split("\0")):
        if (REPO / name).is_file():
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, context / name)
    shutil.copytree(wheels, context / ".wheels")
    return context


def build_image(tmp: Path) -> float:
    ensure_base()
    context = build_context(tmp, ensure_wheels())
    old = run(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE]).stdout.strip()
    start = time.monotonic()
    built = run(["docker", "build", "-q", "-f", str(context / "deploy" / "Dockerfile"),
                 "--build-arg", f"BASE={BASE}", "--build-arg", "EXTRAS=",
                 "--build-arg", "BUILD_PACKAGES=", "--build-arg", "RUNTIME_PACKAGES=",
                 "--build-arg", "PIP_ARGS=--no-index --find-links /src/.wheels",
                 "-t", IMAGE, str(context)], timeout=300,
                env={**os.environ, "DOCKER_BUILDKIT": "0"})   # local base, no registry
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    seconds = time.monotonic() - start
    # What a build leaves behind: the build stage's image, the image it replaced.
    run(["docker", "image", "prune", "-f", "--filter", "label=io.stager.stage=build"])
    if old and old != built.stdout.strip():
        run(["docker", "rmi", old])
    return seconds


class Docker:
    """Containers and a network made for one test, all removed at the end."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.network = f"stager-test-{self.tag}"
        self.names: list[str] = []
        made = run(["docker", "network", "create", self.network])
        assert made.returncode == 0, made.stderr

    def name(self, role: str) -> str:
        return f"stager-{role}-{self.tag}"

    def start(self, role: str, port: int, argv: list[str], token: str = "") -> str:
        name = self.name(role)
        self.names.append(name)
        env = ["-e", f"STAGER_TOKEN={token}"] if token else []
        started = run(["docker", "run", "-d", "--name", name, "--network", self.network,
                       "--read-only", "--tmpfs", "/var/lib/stager:uid=10001,gid=10001",
                       "--health-interval", "1s", "-p", f"127.0.0.1::{port}", *env,
                       IMAGE, *argv])
        assert started.returncode == 0, started.stderr
        return name

    def client(self, *argv: str, token: str, volume: str = "",
               text: bool = True) -> subprocess.CompletedProcess[Any]:
        mount = ["-v", volume] if volume else []
        return subprocess.run(
            ["docker", "run", "--rm", "--network", self.network, "--read-only", *mount,
             "-e", f"STAGER_TOKEN={token}", IMAGE, "--meta",
             f"http://{self.name('meta')}:7070", *argv],
            capture_output=True, text=text, timeout=60)

    def token(self, scope: str) -> str:
        """A new token, minted in the metadata server's container with its admin token
        (as deploy/README.md does with `kubectl exec`)."""
        made = run(["docker", "exec", self.name("meta"), "stager", "--token-file",
                    "/var/lib/stager/admin.token", "token", "create", "--scope", scope])
        assert made.returncode == 0, made.stderr
        return made.stdout.strip().splitlines()[-1]

    def wait_healthy(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = run(["docker", "inspect", "-f", "{{.State.Health.Status}}",
                         name]).stdout.strip()
            if state == "healthy":
                return
            time.sleep(0.5)
        logs = run(["docker", "logs", "--tail", "30", name])
        raise AssertionError(f"{name} is {state!r}: {logs.stdout}{logs.stderr}")

    def published(self, name: str, port: int) -> str:
        out = run(["docker", "port", name, str(port)]).stdout.split()
        return f"http://{out[0]}"

    def close(self) -> None:
        if self.names:
            run(["docker", "rm", "-f", *self.names])
        run(["docker", "network", "rm", self.network])


def target_states(meta_url: str, token: str = "") -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(route("list_targets").url(meta_url), headers=headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        return [t["state"] for t in json.load(resp)["targets"]]


@pytest.mark.skipif(os.environ.get("STAGER_TEST_IMAGE_STANDIN") == "1",
                    reason="STAGER_TEST_IMAGE_STANDIN=1: the stand-in runs instead")
def test_image_serves_a_client_on_a_private_network(tmp_path):
    reason = why_no_docker()
    if reason:
        pytest.skip(f"cannot build or run the image here: {reason} "
                    "(test_entry_commands_in_a_clean_venv stands in)")
    seconds = build_image(tmp_path)
    print(f"built {IMAGE} in {seconds:.0f} s")
    docker = Docker()
    try:
        # As the manifests run them: auth on, the data server's join token from the
        # environment (a Secret there), read-only root file systems.
        meta = docker.start("meta", 7070, [*META_ARGS[:-1], "--auth"])
        docker.wait_healthy(meta)           # the image's HEALTHCHECK, /v1/health
        admin = docker.token("admin")
        data_name = docker.name("data")
        data = docker.start("data", 7071, [
            "--meta", f"http://{meta}:7070", "data", "--host", "0.0.0.0", "--port", "7071",
            "--advertise-url", f"http://{data_name}:7071", "--auth"],
            token=docker.token("join"))
        docker.wait_healthy(data)
        meta_url = docker.published(meta, 7070)
        deadline = time.monotonic() + 30
        while target_states(meta_url, admin) != ["up"]:
            assert time.monotonic() < deadline, target_states(meta_url, admin)
            time.sleep(0.2)
        payload = tmp_path / "payload.bin"
        payload.write_bytes(PAYLOAD)
        payload.chmod(0o644)
        put = docker.client("put", "/in/payload.bin", "/data/payload.bin", token=admin,
                            volume=f"{payload}:/in/payload.bin:ro")
        assert put.returncode == 0, put.stderr
        read = docker.client("cat", "/data/payload.bin", token=admin, text=False)
        assert read.returncode == 0, read.stderr
        assert read.stdout == PAYLOAD
        refused = docker.client("cat", "/data/payload.bin", token="", text=False)
        assert refused.returncode != 0 and b"needs a token" in refused.stderr
        # From the host, through the published port (the metadata server's gateway).
        req = urllib.request.Request(f"{meta_url}/v1/files/data/payload.bin",
                                     headers={"Authorization": f"Bearer {admin}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.read() == PAYLOAD
        # `docker stop` is a SIGTERM, as a pod's deletion is: the target is down at once.
        stopped = time.monotonic()
        assert run(["docker", "stop", data]).returncode == 0
        assert target_states(meta_url, admin) == ["down"]
        assert time.monotonic() - stopped < 10
        IMAGE_PASSED.append(True)
    finally:
        docker.close()


def healthcheck_argv() -> list[str]:
    """The ``HEALTHCHECK ... CMD [...]`` of deploy/Dockerfile."""
    text = DOCKERFILE.read_text().replace("\\\n", "")
    m = re.search(r"^HEALTHCHECK .*?CMD (\[.*\])\s*$", text, re.M)
    assert m, "deploy/Dockerfile has no HEALTHCHECK CMD [...]"
    return list(json.loads(m.group(1)))


def entrypoint() -> list[str]:
    m = re.search(r"^ENTRYPOINT (\[.*\])\s*$", DOCKERFILE.read_text(), re.M)
    assert m, "deploy/Dockerfile has no ENTRYPOINT [...]"
    return list(json.loads(m.group(1)))


def test_entry_commands_in_a_clean_venv(tmp_path):
    """The stand-in where the image did not run: stager installed from a wheel of the
    repository into a fresh virtual environment (no PYTHONPATH, not run from the
    checkout), then the image's entry commands and its health check, as they run in
    the image (auth on, the data server's join token from the environment) but on
    loopback and free ports."""
    if IMAGE_PASSED:
        pytest.skip("the image itself was built and served a client in this run "
                    "(test_image_serves_a_client_on_a_private_network)")
    wheels = ensure_wheels()
    own = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
               "--find-links", str(wheels), "-w", str(tmp_path / "dist"), str(REPO)],
              timeout=180)
    assert own.returncode == 0, own.stderr
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    (wheel,) = (tmp_path / "dist").glob("stager-*.whl")
    # Nothing of the checkout may leak in (PYTHONPATH, the build's stager.egg-info).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAGER_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    installed = run([str(venv / "bin" / "pip"), "install", "-q", "--no-index",
                     "--find-links", str(wheels), str(wheel)], timeout=300, env=env,
                    cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert (venv / "bin" / "stager").exists(), installed.stdout + installed.stderr
    (command,) = entrypoint()
    loopback = {"0.0.0.0": "127.0.0.1", "7070": "0", "7071": "0"}
    procs: list[subprocess.Popen[bytes]] = []

    def serve(role: str, argv: list[str], token: str = "") -> str:
        root = tmp_path / role
        argv = [loopback.get(a, a) for a in argv]
        procs.append(subprocess.Popen([str(venv / "bin" / command), *argv],
                                      env={**env, "STAGER_ROOT": str(root),
                                           "STAGER_TOKEN": token}, cwd=tmp_path,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not (root / "server.json").exists():
            assert time.monotonic() < deadline and procs[-1].poll() is None, role
            time.sleep(0.05)
        return str(json.loads((root / "server.json").read_text())["url"])

    def healthy(root: Path) -> bool:
        check = run(healthcheck_argv(), env={**env, "STAGER_ROOT": str(root)}, cwd=tmp_path)
        return check.returncode == 0

    try:
        meta_url = serve("meta", [*META_ARGS[:-1], "--auth"])
        cli = [str(venv / "bin" / command), "--meta", meta_url]
        admin_file = tmp_path / "meta" / "admin.token"
        admin = admin_file.read_text().strip()

        def token(scope: str) -> str:
            made = run([*cli, "--token-file", str(admin_file), "token", "create",
                        "--scope", scope], env=env, cwd=tmp_path)
            assert made.returncode == 0, made.stderr
            return made.stdout.strip().splitlines()[-1]

        serve("data", ["--meta", meta_url, "data", "--host", "0.0.0.0", "--port", "7071",
                       "--auth"], token=token("join"))
        assert healthy(tmp_path / "meta") and healthy(tmp_path / "data")
        deadline = time.monotonic() + 30
        while target_states(meta_url, admin) != ["up"]:
            assert time.monotonic() < deadline, target_states(meta_url, admin)
            time.sleep(0.1)
        (tmp_path / "payload.bin").write_bytes(PAYLOAD)
        as_admin = {**env, "STAGER_TOKEN": admin}
        put = run([*cli, "put", "payload.bin", "/data/payload.bin"], env=as_admin,
                  cwd=tmp_path)
        assert put.returncode == 0, put.stderr
        read = subprocess.run([*cli, "cat", "/data/payload.bin"], env=as_admin, cwd=tmp_path,
                              capture_output=True, timeout=60)
        assert read.stdout == PAYLOAD
        refused = subprocess.run([*cli, "cat", "/data/payload.bin"], env=env, cwd=tmp_path,
                                 capture_output=True, timeout=60)
        assert refused.returncode != 0 and b"needs a token" in refused.stderr
        procs[1].terminate()                        # as `docker stop` and Kubernetes do
        assert procs[1].wait(15) == 0
        assert target_states(meta_url, admin) == ["down"]
        assert not healthy(tmp_path / "data")       # the check fails on a dead server
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
