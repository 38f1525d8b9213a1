"""`recserve deploy k8s` for the session layout: the store's StatefulSet and Service validate against the
Kubernetes schemas, the Triton pods mount the Secret where the repository's record says, a record a cluster
cannot use is refused, and what the StatefulSet runs (its init container's ACL script, then the server with
its flags) is run here against a real Redis server: the password works, the default user and other
prefixes are shut out, and no file holds the password."""

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest
import redis
import yaml

from recserve.deploy.k8s.k8s_settings import K8sSettings
from recserve.deploy.k8s.manifest_files import write_manifests
from recserve.deploy.k8s.store_objects import (
    ACL_DIR,
    DATA_DIR,
    SECRET_DIR,
    SECRET_KEY,
    WRITER_LABEL,
    memory_bytes,
    store_args,
    store_url,
)
from recserve.errors import ServingError, StoreError
from recserve.processes import free_ports
from recserve.serving.triton_repository.layouts import write_repository
from recserve.serving.triton_repository.repository_settings import RepositorySettings
from recserve.sessions.embedded_store import server_binary, start, stop
from recserve.sessions.session_store import Event, SessionStore
from recserve.sessions.store_settings import StoreSettings

K8S_VERSION = "1.32.0"
MOUNTED = "/var/run/recserve-store/password"


def _cluster_record(tmp_path: Path, url: str, **changes) -> Path:
    record = {"url": url, "username": "recserve", "password_file": MOUNTED, "prefix": "shop-a:"} | changes
    path = tmp_path / f"store-{len(list(tmp_path.glob('store-*')))}.json"
    path.write_text(json.dumps(record))
    return path


def _session_repo(tiny_export, tmp_path: Path, record: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    write_repository(tiny_export, repo, ("fused", "session"), RepositorySettings(session_store=str(record)))
    return repo


def _objects(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def store_manifests(tiny_export, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k8s-store")
    repo = _session_repo(tiny_export, tmp, _cluster_record(tmp, store_url(K8sSettings(_env_file=None))))
    out = tmp / "k8s"
    write_manifests(repo, out, K8sSettings(_env_file=None))
    return out


def test_the_store_statefulset_and_service_validate_and_the_pods_mount_the_secret(store_manifests):
    base = yaml.safe_load((store_manifests / "base" / "kustomization.yaml").read_text())["resources"]
    assert {"store.yaml", "store-service.yaml"} <= set(base)
    for path in [*sorted((store_manifests / "base").glob("*.yaml")), *(store_manifests / "rendered").glob("*.yaml")]:
        for obj in _objects(path):
            if obj["kind"] != "Kustomization":
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    [statefulset] = _objects(store_manifests / "base" / "store.yaml")
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["volumeClaimTemplates"][0]["spec"]
    valkey = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert valkey["args"][valkey["args"].index("--appendfsync") + 1] == "always"
    [deployment] = _objects(store_manifests / "base" / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    [secret] = [v for v in pod["volumes"] if "secret" in v]
    assert secret["secret"] == {
        "secretName": "recserve-store",
        "items": [{"key": SECRET_KEY, "path": "password"}],
        "defaultMode": 0o440,
    }
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == secret["name"]]
    assert mount == {"name": secret["name"], "mountPath": str(Path(MOUNTED).parent), "readOnly": True}
    for overlay in ("cpu", "gpu"):
        kinds = [obj["kind"] for obj in _objects(store_manifests / "rendered" / f"{overlay}.yaml")]
        assert kinds.count("StatefulSet") == 1 and kinds.count("Service") == 3
    readme = (store_manifests / "README.md").read_text()
    assert "kubectl create secret generic recserve-store -n default --from-file=password=PASSWORD_FILE" in readme


def test_a_record_the_cluster_cannot_use_is_refused_with_the_record_to_write(tiny_export, tmp_path):
    """The embedded store's record (loopback), one without a user or an absolute password file, and one that
    names another address than the StatefulSet's: each refused, saying what to write. With --store external
    the store's address is the record's, and no StatefulSet is written."""
    settings = K8sSettings(_env_file=None)
    store = start(tmp_path / "store")
    try:
        repo = _session_repo(tiny_export, tmp_path, tmp_path / "store")
        with pytest.raises(ServingError, match="not the StatefulSet's 'redis://recserve-store:6379/0'.*cluster-store"):
            write_manifests(repo, tmp_path / "k8s", settings)
        external = K8sSettings(_env_file=None, store="external")
        with pytest.raises(ServingError, match="loopback address, which in a pod is the pod itself"):
            write_manifests(repo, tmp_path / "k8s", external)
    finally:
        stop(tmp_path / "store")
    assert store.url.startswith("redis://127.0.0.1:")
    url = store_url(settings)
    for changes, problem in [
        ({"username": None}, "names no ACL user"),
        ({"username": "a b"}, "names no ACL user"),
        ({"password_file": "password"}, "no absolute password_file"),
    ]:
        repo = _session_repo(tiny_export, tmp_path, _cluster_record(tmp_path, url, **changes))
        with pytest.raises(ServingError, match=problem):
            write_manifests(repo, tmp_path / "k8s", settings)
    assert not (tmp_path / "k8s").exists()
    repo = _session_repo(tiny_export, tmp_path, _cluster_record(tmp_path, "redis://valkey.shop.svc:6379/0"))
    write_manifests(repo, tmp_path / "k8s", K8sSettings(_env_file=None, store="external"))
    assert not (tmp_path / "k8s" / "base" / "store.yaml").exists()
    assert "redis://valkey.shop.svc:6379/0" in (tmp_path / "k8s" / "README.md").read_text()


@contextlib.contextmanager
def _statefulset_here(manifests: Path, tmp_path: Path, password: str, operator: str = ""):
    """What the StatefulSet of ``manifests`` runs, run on this machine: its init container's script, then the
    server with its flags (paths moved into ``tmp_path``, loopback instead of every interface). ``operator``:
    a password for a test's own ACL user ``operator`` (every command), added to what the script wrote. Yields
    the port, the moved folders and the server's flags."""
    [statefulset] = _objects(manifests / "base" / "store.yaml")
    pod = statefulset["spec"]["template"]["spec"]
    [init], [valkey] = pod["initContainers"], pod["containers"]
    moved = {SECRET_DIR: tmp_path / "secret", ACL_DIR: tmp_path / "acl", DATA_DIR: tmp_path / "data"}
    for folder in moved.values():
        folder.mkdir()
    (moved[SECRET_DIR] / SECRET_KEY).write_text(password + "\n")  # as `--from-file` of a file with a newline

    def local(text: str) -> str:
        for path, here in moved.items():
            text = text.replace(path, str(here))
        return text

    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {"STORE_USER": "recserve", "STORE_PREFIX": "shop-a:"}
    subprocess.run(["sh", "-c", local(init["command"][2])], env=env, check=True)
    if operator:
        with (moved[ACL_DIR] / "users.acl").open("a") as acl:
            acl.write(f"user operator on >{operator} ~* &* +@all\n")
    port = free_ports(1)[0]
    args = [local(a) for a in valkey["args"]]
    args[args.index("--bind") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    server = subprocess.Popen([server_binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield port, moved, valkey["args"]
    finally:
        server.terminate()
        server.wait(10)


def test_what_the_statefulset_runs_serves_the_password_and_shuts_out_the_rest(store_manifests, tmp_path):
    """The init container's script and the server's flags, as the manifest holds them, run on this machine:
    the ACL it writes holds only the password's hash and recserve's commands; the record's user reaches its
    prefix with the Secret's password, and nobody else."""
    password = "correct-horse-battery-staple"
    with _statefulset_here(store_manifests, tmp_path, password) as (port, moved, args):
        acl = (moved[ACL_DIR] / "users.acl").read_text()
        assert password not in acl and acl.startswith("user default off\nuser recserve on #")
        assert "-@all +ping" in acl and "resetchannels" in acl
        assert args == store_args(K8sSettings(_env_file=None))
        settings = StoreSettings(
            url=f"redis://127.0.0.1:{port}/0", username="recserve", password=password, prefix="shop-a:", timeout_s=2
        )
        with SessionStore(settings) as store:
            _wait(store)
            store.append([Event("s1", "7"), Event("s1", "9")])
            assert store.recent(["s1"]) == [["7", "9"]]
        anonymous = redis.Redis(port=port, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username="recserve", password="wrong", socket_timeout=2).ping()
        ours = redis.Redis(port=port, username="recserve", password=password, socket_timeout=2)
        for command in (("GET", "shop-b:h:s1"), ("FLUSHALL",), ("SCAN", 0), ("EVAL", "return 1", 0), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                ours.execute_command(*command)
    assert any(moved[DATA_DIR].iterdir()), "the append-only file is in the volume's folder"
    for path in [*store_manifests.rglob("*"), *tmp_path.rglob("*")]:
        if path.is_file() and path.name != SECRET_KEY:
            assert password.encode() not in path.read_bytes(), path


def test_the_store_is_fenced_restricted_and_bounded_in_memory(store_manifests):
    [policy] = _objects(store_manifests / "base" / "store-networkpolicy.yaml")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app": "recserve-store"}
    peers = [peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"]]
    assert peers == [{"app": "recserve"}, {WRITER_LABEL: "true"}]
    [deployment] = _objects(store_manifests / "base" / "deployment.yaml")
    assert deployment["spec"]["template"]["metadata"]["labels"]["app"] == "recserve", "the Triton pods are admitted"
    [statefulset] = _objects(store_manifests / "base" / "store.yaml")
    pod = statefulset["spec"]["template"]["spec"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        context = container["securityContext"]
        assert context["capabilities"] == {"drop": ["ALL"]} and context["readOnlyRootFilesystem"] is True
        assert context["runAsNonRoot"] and context["allowPrivilegeEscalation"] is False
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    args = pod["containers"][0]["args"]
    assert int(args[args.index("--maxmemory") + 1]) == int(0.75 * 2 * 2**30)
    assert args[args.index("--maxmemory-policy") + 1] == "volatile-lru"
    assert "Pin the store's image by digest" in (store_manifests / "README.md").read_text()
    assert memory_bytes("512Mi") == 512 * 2**20 and memory_bytes("1G") == 10**9
    with pytest.raises(ServingError, match="store_memory"):
        memory_bytes("lots")


def test_a_flood_of_new_sessions_stays_within_the_stores_memory_and_appends_go_on(tiny_export, tmp_path):
    """The StatefulSet's server with a 16 MiB container (12 MiB for data) flooded with 200,000 new session
    IDs: its memory stays within the bound (the least recently used sessions evicted), every append is
    acknowledged, and a session written last is there to read."""
    settings = K8sSettings(_env_file=None, store_memory="16Mi")
    repo = _session_repo(tiny_export, tmp_path, _cluster_record(tmp_path, store_url(settings)))
    write_manifests(repo, tmp_path / "k8s", settings)
    password = "flood-password-0123456789"
    (tmp_path / "here").mkdir()
    with _statefulset_here(tmp_path / "k8s", tmp_path / "here", password, operator="op-0123456789") as (port, _, args):
        limit = int(args[args.index("--maxmemory") + 1])
        store_settings = StoreSettings(
            url=f"redis://127.0.0.1:{port}/0", username="recserve", password=password, prefix="shop-a:", timeout_s=5
        )
        with SessionStore(store_settings) as store:
            _wait(store)
            acknowledged = 0
            for start in range(0, 200_000, 5_000):
                events = [Event(f"flood-{n}", n % 1000 + 1) for n in range(start, start + 5_000)]
                acknowledged += store.append(events).accepted
            assert acknowledged == 200_000
            assert store.recent(["flood-199999"]) == [["1000"]]
        memory = redis.Redis(port=port, username="operator", password="op-0123456789").info()
        assert memory["evicted_keys"] > 0, "the flood went past the bound"
        assert memory["used_memory"] <= limit * 1.05, (memory["used_memory"], limit)


def _wait(store: SessionStore) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            store.ping()
            return
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _env_here(env: list[dict], **values: str) -> dict[str, str]:
    """A pod's literal environment with ``values`` in the place of the cluster's words (loopback, ports)."""
    literal = {e["name"]: e["value"] for e in env if "value" in e}
    return {**os.environ, **literal, **values}


def _run_here(command: list[str], moved: dict[str, Path], env: dict) -> subprocess.CompletedProcess:
    def local(text: str) -> str:
        for path, here in moved.items():
            text = text.replace(path + "/", f"{here}/")
        return text

    return subprocess.run([local(word) for word in command], env=env, check=True, capture_output=True, text=True)


def test_the_store_with_sentinels_fails_over_as_its_manifests_run_it(tiny_export, tmp_path):
    """`--store sentinel`: the manifests validate; then what they run, run here (each pod's script and server,
    loopback and ports of its own, redis-cli for the image's valkey-cli): two nodes and three Sentinels. recserve
    appends through the Sentinel with the replica's acknowledgement; the Sentinel's default user may only
    ask who the primary is; the primary killed, a replica is promoted and appends go on; the old primary,
    started again by its own script, follows the new one."""
    import hashlib
    import signal

    from recserve.deploy.k8s.sentinel_objects import OPERATOR_KEY
    from recserve.deploy.k8s.store_objects import sentinel_addresses

    settings = K8sSettings(_env_file=None, store="sentinel", store_replicas=2)
    record = _cluster_record(
        tmp_path, store_url(settings), sentinels=sentinel_addresses(settings), acknowledge="replica"
    )
    write_manifests(_session_repo(tiny_export, tmp_path, record), tmp_path / "k8s", settings)
    objects = {path.name: _objects(path) for path in (tmp_path / "k8s" / "base").glob("store*.yaml")}
    for found in objects.values():
        for obj in found:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    [nodes], [sentinels] = objects["store.yaml"], objects["store-sentinel.yaml"]
    assert nodes["spec"]["replicas"] == 2 and sentinels["spec"]["replicas"] == 3
    node_pod, sentinel_pod = nodes["spec"]["template"]["spec"], sentinels["spec"]["template"]["spec"]
    [policy] = objects["store-networkpolicy.yaml"]
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {6379, 26379}

    password, operator = "app-password-0123456789", "operator-password-0123456789"
    ports, sentinel_ports = free_ports(2), free_ports(3)
    sentinel_port = sentinel_ports[0]
    here = {"ME_HOST": "127.0.0.1", "FIRST_HOST": "127.0.0.1", "FIRST_PORT": str(ports[0]), "CLI": "redis-cli"}
    here |= {"SENTINEL_HOST": "127.0.0.1", "SENTINEL_HOST_PORT": str(sentinel_port), "DOWN_AFTER_MS": "1000"}
    here |= {"FAILOVER_TIMEOUT_MS": "4000"}
    servers: dict[str, subprocess.Popen] = {}

    def start_node(n: int) -> None:
        root = tmp_path / f"node-{n}"
        moved = {SECRET_DIR: root / "secret", ACL_DIR: root / "acl", DATA_DIR: root / "data"}
        for folder in moved.values():
            folder.mkdir(parents=True, exist_ok=True)
        (moved[SECRET_DIR] / SECRET_KEY).write_text(password + "\n")
        (moved[SECRET_DIR] / OPERATOR_KEY).write_text(operator + "\n")
        [init], [valkey] = node_pod["initContainers"], node_pod["containers"]
        _run_here(init["command"], moved, _env_here(init["env"], **here, STORE_PORT=str(ports[n])))
        args = [a.replace(DATA_DIR, str(moved[DATA_DIR])).replace(ACL_DIR, str(moved[ACL_DIR])) for a in valkey["args"]]
        args[args.index("--bind") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(ports[n])
        role = str(moved[ACL_DIR] / "role.conf")
        servers[f"node-{n}"] = subprocess.Popen([server_binary(), role, *args], stdout=subprocess.DEVNULL)

    def start_sentinel(n: int) -> None:
        root = tmp_path / f"sentinel-{n}"
        moved = {SECRET_DIR: root / "secret", "/conf": root / "conf"}
        for folder in moved.values():
            folder.mkdir(parents=True, exist_ok=True)
        (moved[SECRET_DIR] / OPERATOR_KEY).write_text(operator + "\n")
        [init], [sentinel] = sentinel_pod["initContainers"], sentinel_pod["containers"]
        env = _env_here(init["env"], **here, SENTINEL_PORT=str(sentinel_ports[n]))
        _run_here(init["command"], moved, env)
        command = [server_binary(), str(moved["/conf"] / "sentinel.conf"), "--sentinel"]
        assert sentinel["command"][1:] == ["/conf/sentinel.conf", "--sentinel"]
        servers[f"sentinel-{n}"] = subprocess.Popen(command, stdout=subprocess.DEVNULL)

    operator_of = lambda n: redis.Redis(port=ports[n], username="operator", password=operator, socket_timeout=2)  # noqa: E731
    try:
        start_node(0)
        start_node(1)
        for n in range(3):  # three, as the manifest runs them: a failover needs two of them (the quorum)
            start_sentinel(n)
        store_settings = StoreSettings(
            url=f"redis://127.0.0.1:{ports[0]}/0",
            username="recserve",
            password=password,
            prefix="shop-a:",
            timeout_s=1,
            sentinels=(f"127.0.0.1:{sentinel_port}",),
            acknowledge="replica",
        )
        deadline = time.monotonic() + 20
        while operator_of(1).info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "node-1 never followed node-0"
            time.sleep(0.1)
        with SessionStore(store_settings) as store:
            _wait(store)
            assert store.append([Event("s1", "7", event_id="e7")]).accepted == 1
            anybody = redis.Redis(port=sentinel_port, socket_timeout=2)
            assert anybody.sentinel_get_master_addr_by_name("recserve")[1] == ports[0]
            for command in (("SENTINEL", "FAILOVER", "recserve"), ("SENTINEL", "SET", "recserve", "quorum", "1")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    anybody.execute_command(*command)
            servers["node-0"].send_signal(signal.SIGKILL)
            servers["node-0"].wait()
            deadline = time.monotonic() + 20
            while anybody.sentinel_get_master_addr_by_name("recserve")[1] != ports[1]:
                assert time.monotonic() < deadline, "the Sentinel promoted no replica"
                time.sleep(0.2)
            start_node(0)  # its script asks the Sentinel, and follows node-1
            # each sync waits the primary's repl-diskless-sync-delay (5 s by default) before it sends, and the
            # Sentinel may restart the link once more within its failover timeout, so on a loaded machine the
            # link can take more than two syncs: the bound allows several, and the loop ends as soon as it is up
            deadline = time.monotonic() + 60
            while operator_of(0).info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the old primary did not follow the new one"
                time.sleep(0.2)
            assert store.append([Event("s1", "9", event_id="e9")]).accepted == 1
            assert store.recent(["s1"]) == [["7", "9"]]
        assert "replicaof 127.0.0.1 " + str(ports[1]) in (tmp_path / "node-0" / "acl" / "role.conf").read_text()
        acl = (tmp_path / "node-0" / "acl" / "users.acl").read_text()
        assert hashlib.sha256(operator.encode()).hexdigest() in acl and operator not in acl
    finally:
        for server in servers.values():
            server.kill()
            server.wait(10)
