"""The session store on Kubernetes, for a repository with the session layout: a Valkey StatefulSet with
persistence (the append-only file, fsynced at every write, on a PersistentVolumeClaim) and its Service, or
an existing store's address; and what the Triton pods mount to reach it. The password lives in a Secret the
team creates (``kubectl create secret generic NAME --from-file=password=FILE``): no manifest holds it, and the
store's ACL file holds only its SHA-256."""

from __future__ import annotations

import json
import posixpath
import re
import urllib.parse
from typing import Any

from recserve.deploy.k8s.k8s_settings import K8sSettings, labels
from recserve.errors import ServingError
from recserve.sessions import store_contract
from recserve.sessions.store_contract import SENTINEL_SERVICE

STORE_PORT = 6379
SENTINEL_PORT = 26379
SECRET_KEY = "password"  # the Secret's key that holds the password
SECRET_DIR, ACL_DIR, DATA_DIR = "/secret", "/acl", "/data"
VALKEY_UID = 999  # the valkey image's user
WRITER_LABEL = "recserve.io/session-writer"  # a pod with this label "true" may reach the store (event writers)
MAXMEMORY_SHARE = 0.75  # of the container's memory limit: the rest for the append-only file's rewrite and buffers
# the init container: the ACL file (store_contract.ACL_RULES: recserve's commands and prefix only) from the
# Secret, the password's SHA-256 only; the password is the file's first line, as StoreSettings.secret reads it
# printf's format: the rules' own '%' (read-only keys, "%R~") doubled; the user, the hash, then the prefix each
# time the keys name it
_ACL_FORMAT = store_contract.acl_rules("\0", "\0", "\0").replace("%", "%%").replace("\0", "%s").replace("\n", "\\n")
ACL_SCRIPT = (
    "set -eu\n"
    f"hash=$(head -n 1 {SECRET_DIR}/{SECRET_KEY} | tr -d '\\r\\n' | sha256sum | cut -d ' ' -f 1)\n"
    f"printf '{_ACL_FORMAT}' "
    '"$STORE_USER" "$hash"' + ' "$STORE_PREFIX"' * (_ACL_FORMAT.count("%s") - 2) + f" > {ACL_DIR}/users.acl\n"
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def store_name(s: K8sSettings) -> str:
    return f"{s.name}-store"


def sentinel_name(s: K8sSettings) -> str:
    """The Sentinels' StatefulSet and headless Service (``store: sentinel``)."""
    return f"{store_name(s)}-sentinel"


def sentinel_addresses(s: K8sSettings) -> list[str]:
    """What a store record names as its Sentinels: their headless Service."""
    return [f"{sentinel_name(s)}:{SENTINEL_PORT}"]


def store_url(s: K8sSettings) -> str:
    """The address the Triton pods reach the StatefulSet's store at (its Service, in the same namespace)."""
    return f"redis://{store_name(s)}:{STORE_PORT}/0"


def check_store_record(s: K8sSettings, record: dict) -> None:
    """The session layout's store record (in the repository) must be one the cluster can use.

    Raises:
        ServingError: it names a loopback address, no user or no absolute password file, or (with the
            StatefulSet) another address than the StatefulSet's Service; the message gives the record to write.
    """
    host = urllib.parse.urlsplit(record.get("url", "")).hostname or ""
    wanted = store_url(s) if s.store != "external" else "redis://STORE-HOST:6379/0"
    example = (
        f'{{"url": "{wanted}", "username": "recserve", "password_file": "/var/run/recserve-store/password", '
        '"prefix": "recserve:"}'
    )
    problems = []
    if s.store == "sentinel":  # the replicated store: the record names its Sentinels
        if list(record.get("sentinels") or []) != sentinel_addresses(s):
            problems.append(f"its sentinels are {record.get('sentinels')!r}, not {sentinel_addresses(s)!r}")
        if record.get("service", SENTINEL_SERVICE) != SENTINEL_SERVICE:
            problems.append(f"its service is {record.get('service')!r}, not {SENTINEL_SERVICE!r}")
        example = example[:-1] + f', "sentinels": {json.dumps(sentinel_addresses(s))}, "acknowledge": "replica"}}'
    if s.store in ("statefulset", "sentinel") and record.get("url") != store_url(s):
        problems.append(f"its url is {record.get('url')!r}, not the StatefulSet's {store_url(s)!r}")
    elif host in LOOPBACK:
        problems.append(f"its url {record.get('url')!r} is a loopback address, which in a pod is the pod itself")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", record.get("username") or ""):
        problems.append(f"it names no ACL user of letters, digits, '_' or '-' (username: {record.get('username')!r})")
    if not posixpath.isabs(record.get("password_file") or ""):
        problems.append("it names no absolute password_file (where the pods mount the Secret)")
    if problems:
        raise ServingError(
            "the session layout's store record cannot serve on Kubernetes: " + "; ".join(problems) + ". Write the "
            f"repository with `recserve repo --layout session --session-store cluster-store.json`, the file holding "
            f"{example}"
        )


def store_mount(s: K8sSettings, record: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Triton container's volume mount and the pod's volume: the Secret's password at the record's
    ``password_file``."""
    folder, name = posixpath.split(record["password_file"])
    volume = {
        "name": "store-secret",
        "secret": {"secretName": s.store_secret, "items": [{"key": SECRET_KEY, "path": name}], "defaultMode": 0o440},
    }
    return {"name": "store-secret", "mountPath": folder, "readOnly": True}, volume


def _labels(s: K8sSettings) -> dict[str, str]:
    return {"app": store_name(s), "app.kubernetes.io/name": s.name, "app.kubernetes.io/component": "session-store"}


def headless_service(s: K8sSettings, name: str, labels: dict[str, str], port_name: str, port: int) -> dict[str, Any]:
    """A headless Service ``name`` over the pods labelled ``app: name``: each pod by a stable name (its
    not-ready pods too, so that peers starting together find each other)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": s.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app": name},
            "ports": [{"name": port_name, "port": port, "targetPort": port_name}],
        },
    }


def store_service(s: K8sSettings) -> dict[str, Any]:
    """The StatefulSet's pods by stable names, ``<name>-store-<n>.<name>-store``."""
    return headless_service(s, store_name(s), _labels(s), "redis", STORE_PORT)


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("2Gi", "512Mi", "1G", "1000000") in bytes.

    Raises:
        ServingError: not a quantity of those forms.
    """
    units = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kMGT]i?|Ki)?", quantity.strip())
    if not match or (match.group(2) or "") not in units:
        raise ServingError(f"store_memory={quantity!r}: a memory quantity such as 2Gi or 512Mi")
    return int(float(match.group(1)) * units[match.group(2) or ""])


def store_args(s: K8sSettings) -> list[str]:
    """valkey-server's flags: every interface of the pod (the NetworkPolicy admits only recserve's pods), the
    ACL file, an acknowledged write on disk, and a memory bound under the container's limit past which the
    least recently used sessions are evicted (each has a time-to-live), never an OOM kill."""
    return [
        "--bind", "0.0.0.0",
        "--port", str(STORE_PORT),
        "--dir", DATA_DIR,
        "--aclfile", f"{ACL_DIR}/users.acl",
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--maxmemory", str(int(memory_bytes(s.store_memory) * MAXMEMORY_SHARE)),
        "--maxmemory-policy", "volatile-lru",
        "--enable-debug-command", "no",
        "--enable-module-command", "no",
        "--proto-max-bulk-len", "1mb",
    ]  # fmt: skip


def store_network_policy(s: K8sSettings) -> dict[str, Any]:
    """Ingress to the store's pod from the Triton pods and from pods labelled ``WRITER_LABEL: "true"`` only,
    on the store's port; nothing else in the cluster reaches it."""
    peers = [
        {"podSelector": {"matchLabels": {"app": labels(s)["app"]}}},
        {"podSelector": {"matchLabels": {WRITER_LABEL: "true"}}},
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": store_name(s), "namespace": s.namespace, "labels": _labels(s)},
        "spec": {
            "podSelector": {"matchLabels": {"app": store_name(s)}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": STORE_PORT}]}],
        },
    }


def _restricted() -> dict[str, Any]:
    """A container's security context as the restricted Pod Security Standard asks, and a read-only root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": VALKEY_UID,
        "runAsGroup": VALKEY_UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def store_statefulset(s: K8sSettings, record: dict) -> dict[str, Any]:
    secret = {"name": "secret", "mountPath": SECRET_DIR, "readOnly": True}
    acl = {"name": "acl", "mountPath": ACL_DIR}
    security = _restricted()
    init = {
        "name": "acl",
        "image": s.store_image,
        "command": ["sh", "-c", ACL_SCRIPT],
        "env": [
            {"name": "STORE_USER", "value": record["username"]},
            {"name": "STORE_PREFIX", "value": record["prefix"]},
        ],
        "volumeMounts": [secret, acl],
        "securityContext": security,
    }
    probe = {"tcpSocket": {"port": "redis"}, "periodSeconds": 5, "failureThreshold": 3}
    container = {
        "name": "valkey",
        "image": s.store_image,
        "command": ["valkey-server"],
        "args": store_args(s),
        "ports": [{"name": "redis", "containerPort": STORE_PORT}],
        "readinessProbe": probe,
        "livenessProbe": probe | {"periodSeconds": 10},
        "resources": {
            "requests": {"cpu": "250m", "memory": s.store_memory},
            "limits": {"memory": s.store_memory},
        },
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, acl],
        "securityContext": security,
    }
    volumes = [
        {"name": "secret", "secret": {"secretName": s.store_secret, "defaultMode": 0o400}},
        {"name": "acl", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    claim = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": s.store_storage}}},
    }
    pod = {"initContainers": [init], "containers": [container], "volumes": volumes}
    return statefulset(s, store_name(s), _labels(s), 1, pod, {"volumeClaimTemplates": [claim]})


def statefulset(
    s: K8sSettings, name: str, labels: dict[str, str], replicas: int, pod: dict[str, Any], more: dict[str, Any]
) -> dict[str, Any]:
    """A StatefulSet ``name`` of ``replicas`` pods labelled ``labels`` (``app: name``), its pod ``pod``
    with the restricted pod security context and no service-account token, and ``more`` in its spec."""
    security = {"runAsNonRoot": True, "fsGroup": VALKEY_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": s.namespace, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": pod | {"securityContext": security, "automountServiceAccountToken": False},
            },
        }
        | more,
    }
