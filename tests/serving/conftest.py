"""A real Triton server on generated repositories, on free loopback ports."""

import socket

import pytest

from recserve.serving.triton.launcher import ServerSettings, TritonServer
from recserve.serving.triton.repository import ServingSettings, write_repository


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def server_settings(**overrides) -> ServerSettings:
    http, grpc, metrics = free_ports(3)
    return ServerSettings(http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_secs=5, **overrides)


@pytest.fixture(scope="session")
def int_repo(tiny_run, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo-int") / "repo"
    write_repository(tiny_run, repo, ("fused", "seed", "echo"), ServingSettings(max_queue_delay_microseconds=2000))
    return repo


@pytest.fixture(scope="session")
def int_server(int_repo):
    with TritonServer(int_repo, server_settings()) as server:
        yield server


@pytest.fixture(scope="session")
def string_server(string_run, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo-str") / "repo"
    write_repository(string_run, repo, ("fused", "seed", "echo"), backend="onnx")
    with TritonServer(repo, server_settings()) as server:
        yield server
