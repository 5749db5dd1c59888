"""deploy/k8s: every kustomization renders, every object validates against the
Kubernetes API schemas (strict: an unknown field fails), and every ``stager`` command
line in it is one the CLI accepts (issue 21).

The kustomizations render with ``kubectl kustomize`` where kubectl is installed, and
with stager/testing/kustomize.py (the features deploy/k8s uses, kustomize's semantics)
where it is not, as on a fresh CI machine; where kubectl is installed the two renderings
are compared, object for object.  STAGER_TEST_NO_KUBECTL=1 renders without kubectl
here too.  The schemas come with the ``kubernetes-validate`` package (the dev extra).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stager.cli.main import build_parser
from stager.cli.servers import server_config

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the dev "
                                                       "extra: pip install -e '.[dev]'")
pytest.importorskip("jsonpatch", reason="jsonpatch is in the dev extra: pip install -e '.[dev]'")

from stager.testing import kustomize  # noqa: E402  (needs yaml and jsonpatch)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ("base", "overlays/small", "overlays/postgres")
TEMPLATES = tuple(sorted((K8S / "jobs").glob("*.yaml")))
# The newest schemas the package ships, and the oldest Kubernetes still widely run.
VERSIONS = (kv.latest_version(), "1.29.0")
# Secrets the manifests name that the operator makes (deploy/README.md says how).
OPERATOR_SECRETS = {"stager-signing-key", "stager-join-token", "stager-mount-token",
                    "stager-meta-store", "stager-stage-token", "stager-s3"}
# Commands other than `stager` a container may run (init containers: file modes).
OTHER_COMMANDS = {"install", "chown"}
SERVER_PORTS = {"meta": 7070, "data": 0}

kubectl = None if os.environ.get("STAGER_TEST_NO_KUBECTL") == "1" else shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(kubectl is None, reason="kubectl is not installed (or "
                                   "STAGER_TEST_NO_KUBECTL=1): nothing to compare with")


def render(kustomization: str) -> list[dict[str, Any]]:
    """The kustomization rendered by kubectl where it is installed, else by ours."""
    if kubectl is None:
        return kustomize.render(K8S / kustomization)
    return kubectl_render(K8S / kustomization)


def kubectl_render(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(kubectl), "kustomize", str(directory)],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def in_order(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kubectl sorts by kind; ours keeps resource order.  Compare in one order."""
    def key(o: dict[str, Any]) -> tuple[str, ...]:
        meta = o["metadata"]
        return o["apiVersion"], o["kind"], meta.get("namespace", ""), meta["name"]
    return sorted(objects, key=key)


def plain(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def base_files() -> list[Path]:
    listed = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["resources"]
    return [K8S / "base" / name for name in listed]


def validate(objects: list[dict[str, Any]]) -> None:
    assert objects
    for obj in objects:
        for version in VERSIONS:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                where = "/".join(str(p) for p in exc.path)
                raise AssertionError(f"{obj['kind']} {obj['metadata'].get('name')} "
                                     f"(Kubernetes {version}): {where}: {exc.message}"
                                     ) from None


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        spec = obj.get("spec", {})
        if "template" in spec:
            meta = obj["metadata"]
            yield f"{obj['kind']}/{meta.get('name', meta.get('generateName'))}", \
                spec["template"]["spec"]


def command_lines(pod: dict[str, Any]) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """Every command line a pod runs: its containers' (the image's entrypoint is
    ``stager``) and their exec hooks."""
    for container in pod.get("initContainers", []) + pod["containers"]:
        argv = [*container.get("command", ["stager"]), *container.get("args", [])]
        yield container, expand(argv, container)
        for hook in container.get("lifecycle", {}).values():
            if "exec" in hook:
                yield container, expand(hook["exec"]["command"], container)


def expand(argv: list[str], container: dict[str, Any]) -> list[str]:
    """``$(VAR)`` as the kubelet expands it; only variables the container defines."""
    defined = {e["name"] for e in container.get("env", [])}

    def one(m: re.Match[str]) -> str:
        assert m.group(1) in defined, f"$({m.group(1)}) is not in the container's env"
        return {"POD_IP": "10.1.2.3", "NODE_NAME": "node-1"}.get(m.group(1), "x")

    return [re.sub(r"\$\((\w+)\)", one, a) for a in argv]


def check_commands(objects: list[dict[str, Any]]) -> int:
    """Parse every ``stager`` command line with the CLI's own parser (a wrong flag
    exits 2), and build the servers' configuration from it as ``stager meta`` and
    ``stager data`` would (a server that would refuse to start fails here)."""
    parser = build_parser()
    seen = 0
    for name, pod in pod_specs(objects):
        for container, argv in command_lines(pod):
            if argv[0] != "stager":
                assert argv[0] in OTHER_COMMANDS, f"{name}: {argv}"
                continue
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                raise AssertionError(f"{name}: not a valid stager command: {argv}") from None
            seen += 1
            if args.command in SERVER_PORTS:
                server_config(args, SERVER_PORTS[args.command])
                check_server(name, container, args)
    return seen


def check_server(name: str, container: dict[str, Any], args: Any) -> None:
    """A server listens on the port the pod declares, which its probes and the scrape
    annotation name, and a data server advertises that port."""
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "http"]
    assert args.port == port, name
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/health", "port": "http"}, name
    if args.command == "data":
        assert args.advertise_url.endswith(f":{port}"), name
        assert args.root, f"{name}: a data server's root is its target"


def check_scrape(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] not in ("StatefulSet", "DaemonSet"):
            continue
        template = obj["spec"]["template"]
        notes = template["metadata"].get("annotations", {})
        ports = {p["containerPort"] for c in template["spec"]["containers"]
                 for p in c.get("ports", [])}
        if ports:
            assert notes["prometheus.io/scrape"] == "true"
            assert notes["prometheus.io/path"] == "/metrics"
            assert int(notes["prometheus.io/port"]) in ports


def secrets_named(objects: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("secretKeyRef", "secretRef"):
                if key in node:
                    found.add(node[key]["name"])
            if "secret" in node and isinstance(node["secret"], dict):
                found.add(node["secret"]["secretName"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    return found


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


# -- without kubectl: the plain files ----------------------------------------------------
@pytest.mark.parametrize("path", [*base_files(), *TEMPLATES],
                         ids=lambda p: str(p.relative_to(K8S)))
def test_plain_manifest_validates(path):
    objects = plain(path)
    validate(objects)
    check_commands(objects)
    assert secrets_named(objects) <= OPERATOR_SECRETS


# -- rendered ----------------------------------------------------------------------------
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_renders_and_validates(kustomization):
    objects = render(kustomization)
    validate(objects)
    assert check_commands(objects) >= 3          # meta, data, mount (+ its preStop)
    check_scrape(objects)
    assert secrets_named(objects) <= OPERATOR_SECRETS
    readme = (DEPLOY / "README.md").read_text()
    for secret in secrets_named(objects):
        assert secret in readme, f"deploy/README.md does not say how to make {secret}"


def test_the_base_is_what_the_issue_asks():
    objects = by_kind(render("base"))
    meta = objects[("StatefulSet", "stager-meta")]
    assert meta["spec"]["replicas"] == 1
    assert meta["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "state"
    assert objects[("Service", "stager-meta-headless")]["spec"]["clusterIP"] == "None"
    data = objects[("DaemonSet", "stager-data")]["spec"]["template"]["spec"]
    assert data["nodeSelector"] == {"stager.io/storage": "true"}
    assert data["volumes"][0]["hostPath"]["path"].startswith("/mnt/nvme")
    assert objects[("PodDisruptionBudget", "stager-data")]["spec"]["maxUnavailable"] == 1
    mount = objects[("DaemonSet", "stager-mount")]["spec"]["template"]["spec"]
    (container,) = mount["containers"]
    assert container["securityContext"]["privileged"] is True
    assert {m["mountPath"]: m.get("mountPropagation") for m in container["volumeMounts"]
            }["/mnt/stager"] == "Bidirectional"
    for pod in (meta["spec"]["template"]["spec"], data):
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_overlays_change_what_they_say():
    small = by_kind(render("overlays/small"))
    assert all(o["metadata"].get("namespace") == "stager"
               for o in small.values() if o["kind"] != "Namespace")
    data = small[("DaemonSet", "stager-data")]["spec"]["template"]["spec"]
    assert data["containers"][0]["image"] == "stager:0.1.0"
    pg = by_kind(render("overlays/postgres"))
    meta = pg[("StatefulSet", "stager-meta")]
    assert meta["spec"]["replicas"] == 3
    env = {e["name"]: e for e in meta["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["STAGER_META_STORE"]["valueFrom"]["secretKeyRef"]["name"] == "stager-meta-store"
    args = pg[("DaemonSet", "stager-data")]["spec"]["template"]["spec"]["containers"][0]["args"]
    metas = build_parser().parse_args(expand(args, {"env": [{"name": "POD_IP"},
                                                            {"name": "NODE_NAME"}]})).meta
    assert metas.split(",") == [f"http://stager-meta-{i}.stager-meta-headless:7070"
                                for i in range(3)]
    assert pg[("PodDisruptionBudget", "stager-meta")]["metadata"]["namespace"] == "stager"


def test_a_wrong_flag_fails_the_check():
    """The command check is not vacuous: an unknown flag and a server that would refuse
    to start (a non-loopback address without --auth) both fail it."""
    (meta,) = [o for o in plain(K8S / "base" / "meta-statefulset.yaml")]
    container = meta["spec"]["template"]["spec"]["containers"][0]
    good = list(container["args"])
    for bad in ([*good, "--no-such-flag"], [a for a in good if a != "--auth"]):
        container["args"] = bad
        with pytest.raises((AssertionError, ValueError)):
            check_commands([meta])
    container["args"] = good
    assert check_commands([meta]) == 1


def test_an_unknown_field_fails_validation():
    (pdb,) = plain(K8S / "base" / "data-pdb.yaml")
    pdb["spec"]["maxUnavaliable"] = 1
    with pytest.raises(AssertionError, match="maxUnavaliable"):
        validate([pdb])


# -- our renderer against kubectl's --------------------------------------------------------
@needs_kubectl
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_our_rendering_is_kubectls(kustomization):
    ours = kustomize.render(K8S / kustomization)
    theirs = kubectl_render(K8S / kustomization)
    assert len(ours) == len(theirs)
    for mine, kubectls in zip(in_order(ours), in_order(theirs), strict=True):
        assert mine == kubectls


# The corners of the supported features that deploy/k8s does not reach today: a
# Namespace under `namespace:` (renamed), a cluster-scoped kind (its namespace kept),
# images at any depth, behind a digest, in a CronJob, a near-miss name, a label that
# replaces one, a patch target that matches nothing, an overlay's patch after the base's
# images.
CORNERS = {
    "base/kustomization.yaml": """
resources: [objects.yaml]
labels:
- pairs: {app: corner, tier: "1"}
images:
- name: nginx
  newTag: "1.27"
- name: registry.local:5000/tool
  newName: tool
""",
    "base/objects.yaml": """
apiVersion: v1
kind: Namespace
metadata: {name: elsewhere}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader, namespace: kept}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
spec:
  containers: [{image: "nginx@sha256:0123"}]
  nested: {deeper: {initContainers: [{image: nginx}]}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cj, namespace: old}
spec:
  schedule: "* * * * *"
  jobTemplate: {spec: {template: {spec: {
    containers: [{name: c, image: "nginx:old"}, {name: t, image: "registry.local:5000/tool:2"}],
    initContainers: [{name: i, image: "docker.io/nginx"}]}}}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: before}}
spec:
  containers: [{name: c, image: "nginxx:1"}]
  ephemeralContainers: [{name: e, image: nginx}]
""",
    "kustomization.yaml": """
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: corners
resources: [base]
patches:
- target: {kind: Pod, name: nobody}
  patch: |-
    - {op: add, path: /spec/hostNetwork, value: true}
- target: {kind: Pod}
  patch: |-
    - {op: add, path: /spec/containers/-, value: {name: d, image: nginx}}
""",
}


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@needs_kubectl
def test_our_rendering_is_kubectls_in_the_corners(tmp_path):
    ours = kustomize.render(write(tmp_path, CORNERS))
    assert {o["metadata"]["name"] for o in ours if o["kind"] == "Namespace"} == {"corners"}
    assert in_order(ours) == in_order(kubectl_render(tmp_path))


def test_the_corners_render_as_kubectl_did(tmp_path):
    """What kubectl 1.32 (kustomize 5.5) rendered for CORNERS, checked where it is
    absent too."""
    objects = by_kind(kustomize.render(write(tmp_path, CORNERS)))
    assert ("Namespace", "corners") in objects
    assert objects[("ClusterRole", "reader")]["metadata"]["namespace"] == "kept"
    assert all(o["metadata"]["labels"]["tier"] == "1" for o in objects.values())
    widget = objects[("Widget", "w")]
    assert widget["metadata"]["namespace"] == "corners"
    assert widget["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert widget["spec"]["nested"]["deeper"]["initContainers"][0]["image"] == "nginx:1.27"
    job = objects[("CronJob", "cj")]
    assert job["metadata"]["namespace"] == "corners"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == ["nginx:1.27", "tool:2"]
    assert pod["initContainers"][0]["image"] == "docker.io/nginx"
    pod = objects[("Pod", "p")]
    assert pod["metadata"]["labels"] == {"app": "corner", "tier": "1"}
    # The overlay's patch adds its container after the base's images ran.
    assert [c["image"] for c in pod["spec"]["containers"]] == ["nginxx:1", "nginx"]
    assert pod["spec"]["ephemeralContainers"][0]["image"] == "nginx"
    assert "hostNetwork" not in pod["spec"]


@pytest.mark.parametrize(("field", "text"), [
    ("commonLabels", "commonLabels: {a: b}\n"),
    ("configMapGenerator", "configMapGenerator: [{name: c, literals: [a=b]}]\n"),
    ("includeSelectors", "labels: [{pairs: {a: b}, includeSelectors: true}]\n"),
    ("digest", "images: [{name: nginx, digest: 'sha256:0'}]\n"),
    ("labelSelector", "patches: [{target: {labelSelector: a=b}, patch: '[]'}]\n"),
    ("path", "patches: [{path: p.yaml, target: {kind: Pod}}]\n"),
    ("strategic-merge", "patches: [{target: {kind: Pod}, patch: 'metadata: {name: p}'}]\n"),
    ("regular expression", "patches: [{target: {name: 'stager-.*'}, patch: '[]'}]\n"),
])
def test_what_it_does_not_do_is_an_error(tmp_path, field, text):
    write(tmp_path, {"kustomization.yaml": "resources: [pod.yaml]\n" + text,
                     "pod.yaml": "{apiVersion: v1, kind: Pod, metadata: {name: p}}\n"})
    with pytest.raises(kustomize.Unsupported, match=re.escape(field)):
        kustomize.render(tmp_path)
