"""Request equivalence (E2B's definition): method + path + query + the parsed body with
schema defaults filled in. Key order, whitespace, unknown fields, null vs absent and an
omitted field vs its explicit default are the same request; a changed value, a different
array order and ``{}`` vs an absent object are different requests.

Property tests drive ``NewSandboxSerializer(...).canonical()`` into
``idempotency.fingerprint`` exactly as the create view does; a few examples then go through
the whole API, where an unknown template makes every request a cheap stored 404 (no
sandbox is started) so that replay vs mismatch is observable end to end.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from idempotency.fingerprint import CURRENT_VERSION, VERSIONS, fingerprint
from sandboxes.serializers import NewSandboxSerializer, NewSandboxV1Serializer
from tests.idempotency.conftest import PostFn

pytestmark = pytest.mark.both_databases

V2 = "/v2/sandboxes"
V1 = "/sandboxes"
NULLABLE = [
    "autoResume",
    "secure",
    "allow_internet_access",
    "network",
    "metadata",
    "envVars",
    "mcp",
    "iam",
    "volumeMounts",
]
KNOWN = {"templateID", "timeout", "autoPause", "autoPauseMemory", *NULLABLE}


def canonical(body: dict[str, Any], path: str = V2) -> dict[str, Any]:
    serializer_class = NewSandboxV1Serializer if path == V1 else NewSandboxSerializer
    serializer = serializer_class(data=body)
    assert serializer.is_valid(), serializer.errors
    return serializer.canonical()


def fp(
    body: dict[str, Any],
    *,
    path: str = V2,
    method: str = "POST",
    query: list[tuple[str, list[str]]] | None = None,
) -> str:
    return fingerprint(
        CURRENT_VERSION, method=method, path=path, query=query or [], body=canonical(body, path)
    )


# ---------------------------------------------------------------------------- strategies
ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=24)
map_keys = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), min_size=1, max_size=12)
map_values = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=16)
metadata = st.dictionaries(map_keys, map_values, max_size=5)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True)
env_vars = st.dictionaries(env_names, map_values, max_size=5)
timeouts = st.integers(min_value=1, max_value=86_400)


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid create body: templateID plus any subset of the fields the server honours."""
    body: dict[str, Any] = {"templateID": draw(ids)}
    optional = {
        "timeout": timeouts,
        "autoPause": st.booleans(),
        "metadata": metadata,
        "envVars": env_vars,
        "autoResume": st.just({"enabled": False}),
        "secure": st.booleans(),
        "allow_internet_access": st.just(False),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    return body


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    return value


unknown_fields = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in KNOWN),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=5,
    ),
    min_size=1,
    max_size=4,
)


# -------------------------------------------------------------------------- equivalences
@given(body=bodies(), seed=st.integers())
def test_key_order_does_not_matter(body: dict[str, Any], seed: int) -> None:
    assert fp(shuffled(body, random.Random(seed))) == fp(body)


@given(
    body=bodies(),
    indent=st.none() | st.integers(0, 4),
    sep=st.sampled_from([",", " ,", ", "]),
    colon=st.sampled_from([":", ": ", " : "]),
)
def test_whitespace_does_not_matter(
    body: dict[str, Any], indent: int | None, sep: str, colon: str
) -> None:
    reformatted = json.loads(json.dumps(body, indent=indent, separators=(sep, colon)))
    assert fp(reformatted) == fp(body)


@given(body=bodies(), extra=unknown_fields)
def test_unknown_fields_do_not_matter(body: dict[str, Any], extra: dict[str, Any]) -> None:
    assert fp({**extra, **body}) == fp(body)


@given(body=bodies(), nulls=st.sets(st.sampled_from(NULLABLE), min_size=1))
def test_null_is_the_same_as_absent(body: dict[str, Any], nulls: set[str]) -> None:
    absent = {k: v for k, v in body.items() if k not in nulls}
    assert fp({**absent, **dict.fromkeys(nulls)}) == fp(absent)


@pytest.mark.parametrize(
    "nulled",
    [
        pytest.param({"timeout": None}, id="timeout"),
        pytest.param({"autoPause": None}, id="autoPause"),
        pytest.param({"autoPauseMemory": None}, id="autoPauseMemory"),
        pytest.param({"autoResume": {"enabled": None}}, id="autoResume.enabled"),
    ],
)
def test_null_on_a_field_with_a_default_is_the_same_as_absent(nulled: dict[str, Any]) -> None:
    """E2B's server reads an optional field sent as null as absent (then fills in its
    default); a client that serialises unset options as null must get the same request,
    not a 400."""
    absent = (
        {"templateID": "base", "autoResume": {}}
        if "autoResume" in nulled
        else {"templateID": "base"}
    )
    assert fp({"templateID": "base", **nulled}) == fp(absent)


@given(body=bodies(), path=st.sampled_from([V2, V1]))
def test_an_omitted_field_is_the_same_as_its_explicit_default(
    body: dict[str, Any], path: str
) -> None:
    defaults = {"timeout": 15 if path == V1 else 300, "autoPause": False, "autoPauseMemory": True}
    omitted = {k: v for k, v in body.items() if k not in defaults}
    assert fp({**omitted, **defaults}, path=path) == fp(omitted, path=path)
    for name, value in defaults.items():
        assert fp({**omitted, name: value}, path=path) == fp(omitted, path=path)


def test_the_v1_and_v2_defaults_are_their_own() -> None:
    assert fp({"templateID": "base"}, path=V2) == fp({"templateID": "base", "timeout": 300})
    assert fp({"templateID": "base"}, path=V1) == fp({"templateID": "base", "timeout": 15}, path=V1)
    assert fp({"templateID": "base"}, path=V2) != fp({"templateID": "base", "timeout": 15}, path=V2)


def test_an_empty_auto_resume_object_is_the_same_as_its_filled_in_default() -> None:
    assert fp({"templateID": "base", "autoResume": {}}) == fp(
        {"templateID": "base", "autoResume": {"enabled": False}}
    )


# ---------------------------------------------------------------------------- differences
@given(body=bodies(), other=ids)
def test_another_template_is_another_request(body: dict[str, Any], other: str) -> None:
    assume(other != body["templateID"])
    assert fp({**body, "templateID": other}) != fp(body)


@given(body=bodies(), other=timeouts)
def test_another_timeout_is_another_request(body: dict[str, Any], other: int) -> None:
    assume(other != body.get("timeout", 300))
    assert fp({**body, "timeout": other}) != fp(body)


@given(body=bodies())
def test_another_auto_pause_is_another_request(body: dict[str, Any]) -> None:
    flipped = not body.get("autoPause", False)
    assert fp({**body, "autoPause": flipped}) != fp(body)


@given(body=bodies(), name=st.sampled_from(["metadata", "envVars"]), data=st.data())
def test_another_map_value_or_key_is_another_request(
    body: dict[str, Any], name: str, data: st.DataObject
) -> None:
    current = body.get(name) or {}
    keys = env_names if name == "envVars" else map_keys
    new_key = data.draw(keys.filter(lambda k: k not in current), label="new key")
    value = data.draw(map_values, label="value")
    assert fp({**body, name: {**current, new_key: value}}) != fp({**body, name: current})
    if current:
        some_key = sorted(current)[0]
        changed = {**current, some_key: current[some_key] + "x"}
        assert fp({**body, name: changed}) != fp({**body, name: current})
        renamed = {(new_key if k == some_key else k): v for k, v in current.items()}
        assert fp({**body, name: renamed}) != fp({**body, name: current})


@given(body=bodies(), name=st.sampled_from(["metadata", "envVars"]))
def test_an_empty_object_is_not_the_same_as_an_absent_one(body: dict[str, Any], name: str) -> None:
    absent = {k: v for k, v in body.items() if k != name}
    assert fp({**absent, name: {}}) != fp(absent)


@given(body=bodies())
def test_another_path_or_method_is_another_request(body: dict[str, Any]) -> None:
    assert fp(body, path=V2) != fp(body, path=V1 if "timeout" in body else "/v3/sandboxes")
    assert fp(body, method="POST") != fp(body, method="PUT")


@given(body=bodies(), name=st.text("abcxyz", min_size=1, max_size=4), a=ids, b=ids)
def test_another_query_is_another_request(body: dict[str, Any], name: str, a: str, b: str) -> None:
    assume(a != b)
    assert fp(body, query=[(name, [a])]) != fp(body)
    assert fp(body, query=[(name, [a])]) != fp(body, query=[(name, [b])])


def test_the_order_of_distinct_query_parameters_does_not_matter() -> None:
    body = {"templateID": "base"}
    assert fp(body, query=[("a", ["1"]), ("b", ["2"])]) == fp(
        body, query=[("b", ["2"]), ("a", ["1"])]
    )


def test_method_case_does_not_matter() -> None:
    assert fp({"templateID": "base"}, method="post") == fp({"templateID": "base"}, method="POST")


@given(items=st.lists(st.integers(), min_size=2, max_size=6, unique=True), seed=st.integers())
def test_array_order_is_part_of_the_request(items: list[int], seed: int) -> None:
    """At the fingerprint itself: a create's volumeMounts in another order are another
    request (they are mounted in the order given)."""
    reordered = items[:]
    random.Random(seed).shuffle(reordered)
    assume(reordered != items)

    def digest(body: dict[str, Any]) -> str:
        return fingerprint(CURRENT_VERSION, method="POST", path=V2, query=[], body=body)

    assert digest({"list": reordered}) != digest({"list": items})
    assert digest({"nested": {"list": reordered}}) != digest({"nested": {"list": items}})


def test_the_fingerprint_is_versioned_and_an_unknown_version_is_refused() -> None:
    digest = fp({"templateID": "base"})
    version, _, hexdigest = digest.partition(":")
    assert version == CURRENT_VERSION and version in VERSIONS
    assert len(hexdigest) == 64 and int(hexdigest, 16) >= 0
    with pytest.raises(ValueError, match="unknown fingerprint version"):
        fingerprint("v9", method="POST", path=V2, query=[], body={})


# ----------------------------------------------------------------------------- end to end
def missing_template() -> str:
    return f"no-such-template-{uuid.uuid4().hex[:8]}"


e2e = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@e2e
@given(
    body=bodies(), seed=st.integers(), extra=unknown_fields, indent=st.none() | st.integers(0, 3)
)
def test_an_equivalent_request_replays_through_the_api(
    post: PostFn, body: dict[str, Any], seed: int, extra: dict[str, Any], indent: int | None
) -> None:
    key = str(uuid.uuid4())
    body = {**body, "templateID": missing_template()}
    first = post(body, key)
    assert first.status_code == 404, first.content

    equivalent = {**extra, **shuffled(body, random.Random(seed)), "secure": body.get("secure")}
    equivalent.setdefault("timeout", 300)
    equivalent.setdefault("autoPause", False)
    second = post(json.dumps(equivalent, indent=indent), key)

    assert second.status_code == 404
    assert second["Idempotent-Replayed"] == "true"
    assert second.content == first.content


@e2e
@given(body=bodies(), data=st.data())
def test_a_changed_request_is_a_mismatch_through_the_api(
    post: PostFn, body: dict[str, Any], data: st.DataObject
) -> None:
    key = str(uuid.uuid4())
    body = {**body, "templateID": missing_template()}
    assert post(body, key).status_code == 404
    change = data.draw(
        st.sampled_from(["templateID", "timeout", "autoPause", "metadata", "envVars", "path"])
    )
    changed, path = dict(body), V2
    if change == "templateID":
        changed["templateID"] += "x"
    elif change == "timeout":
        changed["timeout"] = body.get("timeout", 300) % 86_400 + 1
    elif change == "autoPause":
        changed["autoPause"] = not body.get("autoPause", False)
    elif change == "path":
        path = V1
        changed.setdefault("timeout", 300)  # equal body after defaults: only the path differs
    else:
        changed[change] = {**(body.get(change) or {}), "EXTRA_KEY": "v"}

    response = post(changed, key, path=path)

    assert response.status_code == 409, (change, response.content)
    assert response.json()["error_code"] == "idempotency_request_mismatch"
