"""E2B's secrets through the unmodified SDKs against the live server: the Python SDK's
``Secret`` (sync), and the JS SDK's through js/secrets.mjs. One live server: the
session's."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2b import Secret
from e2b.exceptions import SecretNotFoundException

from tests.support.live_server import LiveServer
from tests.support.node_support import run_sdk_script

JS_DIR = Path(__file__).resolve().parent / "js"
VALUE = "python-sdk-value-8b2f-never-shown"


def test_python_sdk_secret_class_works_unmodified(sdk_env: LiveServer) -> None:
    name = f"Py-Key-{uuid.uuid4().hex[:8]}"
    created = Secret.create(name, VALUE, metadata={"sdk": "python"})
    assert created.secret_id.startswith("sec_")
    assert created.name == name.lower()
    assert created.version == 1
    assert created.metadata == {"sdk": "python"}
    assert VALUE not in repr(created)

    assert Secret.get_info(name).secret_id == created.secret_id
    assert Secret.get_info(created.secret_id).name == name.lower()
    assert Secret.update(name, VALUE + "-2", metadata={"v": "2"}).version == 2
    assert Secret.get_info(name).metadata == {"v": "2"}

    second = Secret.create(f"py-second-{uuid.uuid4().hex[:8]}", VALUE)
    paginator = Secret.list(limit=1)
    seen = []
    while paginator.has_next:
        seen += paginator.next_items()
    assert {created.secret_id, second.secret_id} <= {s.secret_id for s in seen}

    other = sdk_env.other_api_key
    assert Secret.exists(name, api_key=other) is False
    with pytest.raises(SecretNotFoundException):
        Secret.update(created.secret_id, "x", api_key=other)
    assert Secret.destroy(created.secret_id, api_key=other) is False

    assert Secret.destroy(created.secret_id) is True
    assert Secret.exists(created.secret_id) is False
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(name)
    assert Secret.destroy(name) is False
    assert Secret.destroy(second.secret_id) is True


def test_js_sdk_secret_class_works_unmodified(live_server_e2b: LiveServer) -> None:
    run_sdk_script(
        JS_DIR,
        "secrets.mjs",
        {
            "E2B_API_URL": live_server_e2b.url,
            "E2B_API_KEY": live_server_e2b.api_key,
            "OTHER_API_KEY": live_server_e2b.other_api_key,
        },
        timeout=120,
    )
