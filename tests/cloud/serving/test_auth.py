"""API keys and quotas: digests only, reload without restart, the right status for each refusal."""

from __future__ import annotations

import json
import time

import grpc
import pytest
import yaml

from edgespec.cloud.serving import auth
from edgespec.cloud.serving.auth import ApiKey, KeyRing, Quotas, digest, key_from_metadata, new_key, parse_keys
from edgespec.edge.errors import ServerError


def entries(**quotas) -> dict:
    return {"keys": [{"id": "a", "sha256": digest("es-a"), **quotas}, {"id": "b", "sha256": digest("es-b")}]}


def test_keys_are_kept_as_digests_and_found_by_the_key(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump(entries()))
    ring = KeyRing(str(path))
    assert ring.enabled and ring.count == 2
    assert ring.lookup("es-a").key_id == "a" and ring.lookup("es-c") is None
    assert "es-a" not in path.read_text()


def test_metadata_forms():
    assert key_from_metadata([("authorization", "Bearer es-a")]) == "es-a"
    assert key_from_metadata([("Authorization", "bearer  es-a ")]) == "es-a"
    assert key_from_metadata([("x-api-key", "es-b")]) == "es-b"
    assert key_from_metadata([("authorization", "Basic Zm9v")]) is None
    assert key_from_metadata([]) is None and key_from_metadata(None) is None


def test_authenticate_refuses_with_unauthenticated(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(entries()))
    ring = KeyRing(str(path))
    assert ring.authenticate([("authorization", "Bearer es-b")]).key_id == "b"
    for metadata, fragment in (([], "no API key"), ([("x-api-key", "es-z")], "unknown or revoked")):
        with pytest.raises(ServerError, match=fragment) as caught:
            ring.authenticate(metadata)
        assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert KeyRing().authenticate([]) is None  # no keys configured: no authentication


def test_the_file_is_re_read_when_it_changes_and_a_broken_one_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "RELOAD_CHECK_S", 0.0)
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump(entries()))
    ring = KeyRing(str(path))
    assert ring.lookup("es-c") is None
    time.sleep(0.01)
    path.write_text(yaml.safe_dump({"keys": [{"id": "c", "sha256": digest("es-c")}]}))
    import os

    os.utime(path, (time.time() + 1, time.time() + 1))
    assert ring.lookup("es-c").key_id == "c" and ring.lookup("es-a") is None  # added and revoked
    path.write_text("keys: [ {id: broken")
    os.utime(path, (time.time() + 2, time.time() + 2))
    assert ring.lookup("es-c").key_id == "c"  # the last good keys stay


def test_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("EDGESPEC_KEYS", json.dumps(entries()))
    assert KeyRing(env="EDGESPEC_KEYS").lookup("es-b").key_id == "b"
    monkeypatch.setenv("EMPTY_KEYS", "")
    with pytest.raises(ValueError, match="empty or unset"):
        KeyRing(env="EMPTY_KEYS")


@pytest.mark.parametrize("data, message", [
    ({}, "'keys' list"),
    ({"keys": [{"id": "a", "sha256": "nope"}]}, "64 lowercase hex"),
    ({"keys": [{"id": "", "sha256": digest("x")}]}, "non-empty string id"),
    ({"keys": [{"id": "a", "sha256": digest("x")}, {"id": "a", "sha256": digest("y")}]}, "twice"),
    ({"keys": [{"id": "a", "sha256": digest("x"), "max_sessions": -1}]}, "max_sessions"),
    ({"keys": [{"id": "a", "sha256": digest("x"), "colour": 1}]}, "unknown fields"),
])
def test_bad_key_files_name_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        parse_keys(data, "keys.yaml")


def test_new_keys_are_long_and_distinct():
    keys = {new_key() for _ in range(20)}
    assert len(keys) == 20 and all(k.startswith("es-") and len(k) > 40 for k in keys)


def test_session_quota_is_per_key_and_given_back():
    quotas, key = Quotas(), ApiKey("a", digest("es-a"), max_sessions=2)
    quotas.acquire(key)
    quotas.acquire(key)
    with pytest.raises(ServerError, match="retry after") as caught:
        quotas.acquire(key)
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "es-a" not in caught.value.details
    quotas.acquire(ApiKey("b", digest("es-b"), max_sessions=1))  # another key is not affected
    quotas.release(key)
    quotas.acquire(key)


def test_tokens_per_minute_slide(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    quotas, key = Quotas(), ApiKey("a", digest("es-a"), tokens_per_minute=100)
    quotas.charge(key, 60)
    now[0] += 30
    quotas.charge(key, 40)
    with pytest.raises(ServerError, match=r"retry after 31s"):
        quotas.check_tokens(key)
    now[0] += 31  # the first 60 tokens left the window
    quotas.check_tokens(key)
    quotas.check_tokens(None)  # no keys: nothing to count


@pytest.mark.parametrize(
    "peer, local",
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", True),
        ("unix:/tmp/edgespec.sock", True),
        ("ipv4:10.1.2.3:5000", True),  # this host's own interface (patched below)
        ("ipv4:203.0.113.9:5000", False),
        ("ipv6:[2001:db8::1]:5000", False),
        ("ipv4:not-an-address:1", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_peer_means_this_machine(monkeypatch, peer, local):
    monkeypatch.setattr(auth, "local_addresses", lambda: frozenset({"127.0.0.1", "10.1.2.3"}))
    assert auth.is_loopback_peer(peer) is local


def test_local_addresses_include_loopback():
    assert "127.0.0.1" in auth.local_addresses()


@pytest.mark.parametrize("name, parse", [("keys.json", json.loads), ("keys.yaml", yaml.safe_load),
                                         ("keys.yml", yaml.safe_load)])
def test_the_keys_file_is_written_in_its_extensions_format_and_every_reader_reads_it(tmp_path, capsys, name, parse):
    import argparse

    from edgespec.cli import keys as keys_cli

    path = tmp_path / name
    parser = argparse.ArgumentParser()
    keys_cli.add_arguments(parser)

    def keys(*argv):
        assert keys_cli.run(parser.parse_args([*argv, "--file", str(path)])) == 0
        return capsys.readouterr()

    first = keys("new", "--id", "a", "--max-sessions", "3").out.strip()
    keys("new", "--id", "b", "--tokens-per-minute", "100")
    assert [entry["id"] for entry in parse(path.read_text())["keys"]] == ["a", "b"]  # the format its name says
    assert keys("list").out.splitlines() == ["a\tmax_sessions=3\ttokens_per_minute=0",
                                             "b\tmax_sessions=0\ttokens_per_minute=100"]
    ring = KeyRing(str(path))  # what the verifier reads
    assert ring.lookup(first).key_id == "a" and ring.lookup(first).max_sessions == 3
    keys("revoke", "--id", "b")
    assert KeyRing(str(path)).count == 1 and keys("list").out.startswith("a\t")


def test_a_keys_tokens_per_minute_hold_across_the_fleet_with_the_replica_count_as_guard():
    """Two replicas' Quotas share one store: together they stop at the key's limit, not twice it."""
    from edgespec.cloud.serving.fleet_quota import FleetQuota, FleetQuotaStore, MinuteCounts

    class InlineStore:  # the actor's class, called in place (the Ray round trip is what test_fleet_quota.py covers)
        def __init__(self):
            self.store = FleetQuotaStore()
            self.report = self

        def remote(self, charges, keys):
            from concurrent.futures import Future

            answer = Future()
            answer.set_result(self.store.report(charges, keys))
            return type("Ref", (), {"future": lambda _self: answer})()

    store = InlineStore()
    key = ApiKey("a", digest("es-a"), tokens_per_minute=100)
    replicas = [Quotas(fleet=FleetQuota(store, flush_s=0.0)) for _ in range(2)]
    replicas[0].charge(key, 60)
    replicas[0].check_tokens(key)  # 60 of 100, reported
    replicas[1].charge(key, 30)
    replicas[1].check_tokens(key)  # 90 across both
    replicas[1].charge(key, 20)
    with pytest.raises(ServerError, match="across all replicas") as refused:
        replicas[1].check_tokens(key)  # 110: each replica alone is under 100, the fleet is not
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    replicas[0].check_tokens(key)  # the other replica asks the store here, without waiting for it ...
    with pytest.raises(ServerError, match="across all replicas"):
        replicas[0].check_tokens(key)  # ... and refuses once the answer is in
    counts = MinuteCounts(window_s=60)
    counts.add({"a": 5}, now=0.0)
    assert counts.used("a", now=59.0) == 5 and counts.used("a", now=61.0) == 0  # a sliding minute
