"""The session tests' shared fixtures: a store of recserve's own (the embedded Valkey server) in a folder."""

import pytest

from recserve.sessions import embedded_store


def store_client(settings):
    """A plain redis-py client of ``settings``' user, replies decoded: what a test uses to act as that user
    (the application's, or the operator's from ``embedded_store.admin_settings``) behind recserve's back."""
    import redis

    return redis.Redis.from_url(
        settings.url, username=settings.username, password=settings.secret(), decode_responses=True
    )


@pytest.fixture
def store_dir(tmp_path):
    folder = tmp_path / "store"
    embedded_store.start(folder)
    yield folder
    embedded_store.stop(folder)


@pytest.fixture(scope="session")
def tiny_torchscript(tiny_run, tmp_path_factory):
    """The tiny run's TorchScript export: the native layouts' (one export for every session test)."""
    from recserve.export.exporter import export_run

    out = tmp_path_factory.mktemp("tiny-torchscript") / "export"
    export_run(tiny_run, "torchscript", "fp32", out)
    return out


def write_session_repository(layout: str, eager_export, torchscript_export, repo, store) -> None:
    """A repository serving ``layout`` by session (python ``session`` beside fused, or recserve's
    ``native_session`` beside native) from the store whose record is ``store``."""
    from recserve.serving.triton_repository.layouts import write_repository
    from recserve.serving.triton_repository.repository_settings import RepositorySettings
    from tests.conftest import require_native

    export, layouts = eager_export, ("fused", "session")
    if layout == "native_session":
        require_native("recserve")
        export, layouts = torchscript_export, ("native", "native_session")
    settings = RepositorySettings(
        max_queue_delay_microseconds=2000,
        session_store=str(store),
        native_runtime="recserve",
        step_summary_s=600 if layout == "native_session" else 0,  # the first batch's steps, logged
    )
    write_repository(export, repo, layouts, settings)
