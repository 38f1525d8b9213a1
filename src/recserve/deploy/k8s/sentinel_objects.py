"""The session store with failover on Kubernetes (``store: sentinel``): Valkey's own Sentinel, hand-written.

A StatefulSet of ``store_replicas`` Valkey pods (the first starts as the primary, the others as its
replicas; after a failover each pod that starts asks a Sentinel which one is primary and follows it), and a
StatefulSet of three Sentinels with a headless Service, ``<name>-store-sentinel``. Every pod reads the
Secret's two keys: ``password`` (the application's user, whose ACL is recserve's allow-list) and
``operator`` (the user the nodes replicate and the Sentinels watch and promote with, and the password the
Sentinels give each other). A Sentinel's default user may only ask who the primary is; nothing can make it
fail over but a peer or an operator with the Secret. The stores' records name the Sentinels
(``sentinels``) and ask for the replica's acknowledgement (``acknowledge: replica``), so a failover loses
no acknowledged event.
"""

from __future__ import annotations

from typing import Any

from recserve.deploy.k8s.k8s_settings import K8sSettings
from recserve.deploy.k8s.store_objects import (
    ACL_DIR,
    ACL_SCRIPT,
    SECRET_DIR,
    SENTINEL_PORT,
    STORE_PORT,
    _labels,
    _restricted,
    headless_service,
    sentinel_name,
    statefulset,
    store_name,
    store_network_policy,
    store_service,
    store_statefulset,
)
from recserve.sessions.store_contract import SENTINEL_SERVICE

SENTINELS = 3
QUORUM = 2
OPERATOR_KEY = "operator"  # the Secret's key of the operator's password
# what the Sentinels need of the operator's user on the nodes (Valkey's Sentinel documentation), and replication
OPERATOR_ACL = (
    "~* &* -@all +psync +replconf +ping +info +role +multi +exec +subscribe +publish +slaveof +replicaof "
    "+config|rewrite +client|setname +client|kill +script|kill"
)
# a Sentinel's default user: who the primary is, and no more (redis-py asks SENTINEL MASTERS)
SENTINEL_DEFAULT_ACL = (
    "resetchannels -@all +ping +sentinel|get-master-addr-by-name +sentinel|masters +sentinel|sentinels "
    "+sentinel|replicas"
)

_READ_SECRETS = (
    "umask 077\n"
    f"op=$(head -n 1 {SECRET_DIR}/{OPERATOR_KEY} | tr -d '\\r\\n')\n"
    "ophash=$(printf %s \"$op\" | sha256sum | cut -d ' ' -f 1)\n"
)
# Who is primary, by a Sentinel's word; none answering (the first start): the first pod.
_FIND_PRIMARY = (
    'answer=$("$CLI" -h "$SENTINEL_HOST" -p "$SENTINEL_HOST_PORT" --raw SENTINEL get-master-addr-by-name '
    f"{SENTINEL_SERVICE} 2>/dev/null || true)\n"
    "host=$(printf '%s\\n' \"$answer\" | sed -n 1p); port=$(printf '%s\\n' \"$answer\" | sed -n 2p)\n"
    'if [ -z "$host" ] || [ -z "$port" ]; then host=$FIRST_HOST; port=$FIRST_PORT; fi\n'
)
NODE_SCRIPT = (
    "umask 077\n"
    + ACL_SCRIPT
    + _READ_SECRETS
    + f"printf 'user operator on #%s {OPERATOR_ACL}\\n' \"$ophash\" >> {ACL_DIR}/users.acl\n"
    + _FIND_PRIMARY
    + "{\n"
    '  echo "masteruser operator"; echo "masterauth $op"\n'
    '  echo "replica-announce-ip $ME_HOST"; echo "replica-announce-port $STORE_PORT"\n'
    '  if [ "$host" != "$ME_HOST" ] || [ "$port" != "$STORE_PORT" ]; then echo "replicaof $host $port"; fi\n'
    f"}} > {ACL_DIR}/role.conf\n"
)
SENTINEL_SCRIPT = (
    "set -eu\n" + _READ_SECRETS + _FIND_PRIMARY + "cat > /conf/sentinel.conf <<EOF\n"
    "port $SENTINEL_PORT\n"
    "sentinel resolve-hostnames yes\n"
    "sentinel announce-hostnames yes\n"
    "sentinel announce-ip $ME_HOST\n"
    f"sentinel monitor {SENTINEL_SERVICE} $host $port {QUORUM}\n"
    f"sentinel auth-user {SENTINEL_SERVICE} operator\n"
    f"sentinel auth-pass {SENTINEL_SERVICE} $op\n"
    f"sentinel down-after-milliseconds {SENTINEL_SERVICE} $DOWN_AFTER_MS\n"
    f"sentinel failover-timeout {SENTINEL_SERVICE} $FAILOVER_TIMEOUT_MS\n"
    f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
    "sentinel sentinel-user peer\n"
    "sentinel sentinel-pass $op\n"
    f"user default on nopass {SENTINEL_DEFAULT_ACL}\n"
    "user peer on #$ophash ~* &* +@all\n"
    "EOF\n"
)


def _fqdn(s: K8sSettings, service: str, pod: str) -> str:
    return f"{pod}.{service}.{s.namespace}.svc.cluster.local"


def placement_env(s: K8sSettings, service: str) -> list[dict[str, Any]]:
    """The scripts' words for where things are (literal on Kubernetes; a test points them at loopback)."""
    me = {"name": "ME_HOST", "value": f"$(POD_NAME).{service}.{s.namespace}.svc.cluster.local"}
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        me,
        {"name": "STORE_PORT", "value": str(STORE_PORT)},
        {"name": "FIRST_HOST", "value": _fqdn(s, store_name(s), f"{store_name(s)}-0")},
        {"name": "FIRST_PORT", "value": str(STORE_PORT)},
        {"name": "SENTINEL_HOST", "value": f"{sentinel_name(s)}.{s.namespace}.svc.cluster.local"},
        {"name": "SENTINEL_HOST_PORT", "value": str(SENTINEL_PORT)},  # where the Sentinels are asked
        {"name": "SENTINEL_PORT", "value": str(SENTINEL_PORT)},  # where a Sentinel listens
        {"name": "DOWN_AFTER_MS", "value": "5000"},
        {"name": "FAILOVER_TIMEOUT_MS", "value": "60000"},
        {"name": "CLI", "value": "valkey-cli"},
    ]


def sentinel_service(s: K8sSettings) -> dict[str, Any]:
    """Each Sentinel by a stable name, and all of them by ``<name>-store-sentinel``."""
    return headless_service(s, sentinel_name(s), _sentinel_labels(s), "sentinel", SENTINEL_PORT)


def _sentinel_labels(s: K8sSettings) -> dict[str, str]:
    return _labels(s) | {"app": sentinel_name(s), "app.kubernetes.io/component": "session-store-sentinel"}


def sentinel_statefulset(s: K8sSettings) -> dict[str, Any]:
    """Three Sentinels, each writing its configuration from the Secret at start (into a memory volume: a
    Sentinel rewrites its file, and the operator's password is in it)."""
    secret = {"name": "secret", "mountPath": SECRET_DIR, "readOnly": True}
    conf = {"name": "conf", "mountPath": "/conf"}
    env = placement_env(s, sentinel_name(s))
    probe = {"tcpSocket": {"port": "sentinel"}, "periodSeconds": 5, "failureThreshold": 3}
    init = {
        "name": "config",
        "image": s.store_image,
        "command": ["sh", "-c", SENTINEL_SCRIPT],
        "env": env,
        "volumeMounts": [secret, conf],
        "securityContext": _restricted(),
    }
    container = {
        "name": "sentinel",
        "image": s.store_image,
        "command": ["valkey-server", "/conf/sentinel.conf", "--sentinel"],
        "ports": [{"name": "sentinel", "containerPort": SENTINEL_PORT}],
        "readinessProbe": probe,
        "livenessProbe": probe | {"periodSeconds": 10},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "volumeMounts": [conf],
        "securityContext": _restricted(),
    }
    volumes = [
        {"name": "secret", "secret": {"secretName": s.store_secret, "defaultMode": 0o400}},
        {"name": "conf", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]
    pod = {"initContainers": [init], "containers": [container], "volumes": volumes}
    return statefulset(s, sentinel_name(s), _sentinel_labels(s), SENTINELS, pod, {"podManagementPolicy": "Parallel"})


def replicated_nodes(statefulset: dict[str, Any], s: K8sSettings) -> dict[str, Any]:
    """The store's StatefulSet made a replicated one: ``store_replicas`` pods, each deciding its role at start
    (``NODE_SCRIPT``) and starting with the role file before the flags."""
    spec = statefulset["spec"]
    spec["replicas"] = s.store_replicas
    pod = spec["template"]["spec"]
    env = placement_env(s, store_name(s))
    init, container = pod["initContainers"][0], pod["containers"][0]
    init["command"] = ["sh", "-c", NODE_SCRIPT]
    init["env"] = init["env"] + env
    container["command"] = ["sh", "-c", f'exec valkey-server {ACL_DIR}/role.conf "$@"', "valkey-server"]
    return statefulset


def sentinel_network_policy(s: K8sSettings) -> dict[str, Any]:
    """The store's NetworkPolicy with Sentinels: the nodes and the Sentinels admit the Triton pods, the event
    writers and each other, on the store's and the Sentinels' ports."""
    policy = store_network_policy(s)
    pods = {"matchExpressions": [{"key": "app", "operator": "In", "values": [store_name(s), sentinel_name(s)]}]}
    policy["spec"]["podSelector"] = pods
    ingress = policy["spec"]["ingress"][0]
    ingress["from"].append({"podSelector": pods})
    ingress["ports"].append({"protocol": "TCP", "port": SENTINEL_PORT})
    return policy


def store_objects(s: K8sSettings, record: dict) -> dict[str, dict[str, Any]]:
    """The store's objects by file name: the StatefulSet, its Service and NetworkPolicy; with Sentinels the
    StatefulSet replicated, and the Sentinels' StatefulSet and Service."""
    objects = {
        "store.yaml": store_statefulset(s, record),
        "store-service.yaml": store_service(s),
        "store-networkpolicy.yaml": store_network_policy(s),
    }
    if s.store == "sentinel":
        objects["store.yaml"] = replicated_nodes(objects["store.yaml"], s)
        objects["store-networkpolicy.yaml"] = sentinel_network_policy(s)
        objects["store-sentinel.yaml"] = sentinel_statefulset(s)
        objects["store-sentinel-service.yaml"] = sentinel_service(s)
    return objects
