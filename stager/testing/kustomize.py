"""Render a kustomization as ``kubectl kustomize`` does, for the few features
deploy/k8s uses, so the tests can validate the rendered manifests where kubectl is
not installed (it comes from an apt repository a fresh CI machine lacks; issue 21).

Supported, with kustomize v5's semantics (checked against ``kubectl kustomize`` by
tests/test_deploy_k8s.py wherever kubectl exists):

- ``resources``: YAML files and directories that hold a kustomization, recursively;
- ``patches``: a ``target`` of ``kind`` and ``name`` with an inline JSON6902 patch;
- ``namespace``: set on every namespaced object (an existing one is replaced); a
  cluster-scoped object keeps what it has, and a ``v1`` Namespace is renamed to it;
- ``labels`` with ``pairs`` only (includeSelectors and includeTemplates false): added
  to every object's ``metadata.labels``, nowhere else;
- ``images``: ``name``, ``newName``, ``newTag`` on every ``containers`` and
  ``initContainers`` entry, at any depth, whose image name is ``name`` (a new tag
  drops a digest).

The transformers run in kustomize's order: patches, namespace, labels, images.
Anything else in a kustomization is an error naming it, so that an edit to
deploy/k8s cannot render differently here than under kubectl without a test saying
so.  Objects come back in resource order; kubectl sorts them by kind.

Needs PyYAML and jsonpatch (the dev extra).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

__all__ = ["Unsupported", "render"]

Object = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
API_VERSION = "kustomize.config.k8s.io/v1beta1"
FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
LABEL_FIELDS = {"pairs", "includeSelectors", "includeTemplates"}
IMAGE_FIELDS = {"name", "newName", "newTag"}
PATCH_FIELDS = {"target", "patch"}
TARGET_FIELDS = {"kind", "name"}
# Kinds the Kubernetes API serves without a namespace; kustomize leaves their
# metadata.namespace alone (any other kind, a custom one too, it treats as namespaced).
CLUSTER_SCOPED = frozenset({
    "APIService", "CSIDriver", "CSINode", "CertificateSigningRequest", "ClusterRole",
    "ClusterRoleBinding", "ClusterTrustBundle", "ComponentStatus",
    "CustomResourceDefinition", "DeviceClass", "FlowSchema", "IPAddress", "IngressClass",
    "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration", "Namespace", "Node", "PersistentVolume",
    "PodSecurityPolicy", "PriorityClass", "PriorityLevelConfiguration", "ResourceSlice",
    "RuntimeClass", "SelfSubjectAccessReview", "SelfSubjectReview",
    "SelfSubjectRulesReview", "ServiceCIDR", "StorageClass", "SubjectAccessReview",
    "TokenReview", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration", "VolumeAttachment", "VolumeAttributesClass",
})


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not do (the message says
    what and where)."""


def render(path: str | Path) -> list[Object]:
    """The objects of the kustomization in directory ``path``, transformed."""
    directory = Path(path)
    file = kustomization_file(directory)
    if file is None:
        raise FileNotFoundError(f"{directory}: no kustomization.yaml")
    spec = yaml.safe_load(file.read_text()) or {}
    check_fields(spec, FIELDS, str(file))
    if spec.get("apiVersion", API_VERSION) != API_VERSION \
            or spec.get("kind", "Kustomization") != "Kustomization":
        raise Unsupported(f"{file}: not a {API_VERSION} Kustomization")
    objects: list[Object] = []
    for resource in spec.get("resources", []):
        objects.extend(load(directory, resource, str(file)))
    check_unique(objects, str(file))
    for i, patch in enumerate(spec.get("patches", [])):
        objects = apply_patch(objects, patch, f"{file}: patches[{i}]")
    if "namespace" in spec:
        objects = [set_namespace(o, spec["namespace"]) for o in objects]
    for i, labels in enumerate(spec.get("labels", [])):
        objects = [add_labels(o, labels, f"{file}: labels[{i}]") for o in objects]
    for i, image in enumerate(spec.get("images", [])):
        check_fields(image, IMAGE_FIELDS, f"{file}: images[{i}]")
        objects = [set_images(o, image) for o in objects]
    return objects


def kustomization_file(directory: Path) -> Path | None:
    found = [directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()]
    if len(found) > 1:
        raise Unsupported(f"{directory}: more than one kustomization file: {found}")
    return found[0] if found else None


def check_fields(spec: Any, allowed: set[str], where: str) -> None:
    if not isinstance(spec, dict):
        raise Unsupported(f"{where}: expected a mapping, got {spec!r}")
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise Unsupported(f"{where}: unsupported field(s) {', '.join(unknown)} "
                          f"(stager/testing/kustomize.py does only {sorted(allowed)})")


def load(directory: Path, resource: str, where: str) -> list[Object]:
    """One entry of ``resources``: a YAML file, or a directory holding a kustomization."""
    if "://" in resource or resource.startswith("git@"):
        raise Unsupported(f"{where}: remote resource {resource!r}")
    path = directory / resource
    if path.is_dir():
        return render(path)
    if not path.is_file():
        raise FileNotFoundError(f"{where}: resource {resource!r} does not exist")
    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    for obj in objects:
        if not (isinstance(obj, dict) and obj.get("kind") and obj.get("apiVersion")
                and obj.get("metadata", {}).get("name")):
            raise ValueError(f"{path}: not a Kubernetes object with a name: {obj!r}")
        if obj["kind"] == "List" or obj["kind"].endswith("List"):
            raise Unsupported(f"{path}: a {obj['kind']}")
    return objects


def identity(obj: Object) -> tuple[str, str, str, str]:
    group = obj["apiVersion"].rpartition("/")[0]
    meta = obj["metadata"]
    return group, obj["kind"], meta.get("namespace", ""), meta["name"]


def check_unique(objects: list[Object], where: str) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if identity(obj) in seen:
            raise ValueError(f"{where}: {obj['kind']} {obj['metadata']['name']} "
                             f"appears twice")
        seen.add(identity(obj))


def apply_patch(objects: list[Object], spec: Any, where: str) -> list[Object]:
    """``patches`` entry: a JSON6902 patch on the objects its target names.  A target
    that matches nothing is no error (as in kustomize)."""
    check_fields(spec, PATCH_FIELDS, where)
    if "target" not in spec or "patch" not in spec:
        raise Unsupported(f"{where}: a patch needs a target and an inline patch")
    target = spec["target"]
    check_fields(target, TARGET_FIELDS, f"{where}: target")
    for key, value in target.items():
        # kustomize matches these as anchored regular expressions: keep to literals.
        if not re.fullmatch(r"[A-Za-z0-9.-]+", value):
            raise Unsupported(f"{where}: target {key} {value!r} is a regular expression")
    ops = yaml.safe_load(spec["patch"])
    if not isinstance(ops, list):
        raise Unsupported(f"{where}: only a JSON6902 patch (a list of operations); "
                          f"a strategic-merge patch is not supported")
    patch = jsonpatch.JsonPatch(ops)
    return [patch.apply(obj) if matches(obj, target) else obj for obj in objects]


def matches(obj: Object, target: dict[str, str]) -> bool:
    return (target.get("kind", obj["kind"]) == obj["kind"]
            and target.get("name", obj["metadata"]["name"]) == obj["metadata"]["name"])


def set_namespace(obj: Object, namespace: str) -> Object:
    obj = copy.deepcopy(obj)
    if obj["kind"] == "Namespace" and obj["apiVersion"] == "v1":
        obj["metadata"]["name"] = namespace
    elif obj["kind"] not in CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace
    return obj


def add_labels(obj: Object, spec: Any, where: str) -> Object:
    check_fields(spec, LABEL_FIELDS, where)
    for flag in ("includeSelectors", "includeTemplates"):
        if spec.get(flag, False):
            raise Unsupported(f"{where}: {flag}: true")
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("labels", {}).update(
        {k: str(v) for k, v in (spec.get("pairs") or {}).items()})
    return obj


def set_images(obj: Object, spec: dict[str, str]) -> Object:
    obj = copy.deepcopy(obj)
    for container in containers(obj):
        name, tag, digest = split_image(container["image"])
        if name != spec["name"]:
            continue
        name = spec.get("newName", name)
        if "newTag" in spec:
            tag, digest = str(spec["newTag"]), ""
        container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest
                                                                   else "")
    return obj


def containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every entry with an image of a ``containers`` or ``initContainers`` list, at any
    depth (kustomize's image transformer looks everywhere, custom kinds too)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict) and "image" in c)
            else:
                yield from containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from containers(value)


def split_image(image: str) -> tuple[str, str, str]:
    """``name[:tag][@digest]`` -> (name, tag, digest); a registry's port is no tag."""
    rest, _, digest = image.partition("@")
    name, colon, tag = rest.rpartition(":")
    if not colon or "/" in tag:
        name, tag = rest, ""
    return name, tag, digest
