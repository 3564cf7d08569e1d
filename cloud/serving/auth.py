"""API keys and per-key quotas: who may use the verifier, and how much.

A device sends its key in gRPC metadata, ``authorization: Bearer <key>`` or ``x-api-key: <key>``.
The replica keeps only each key's SHA-256 digest, with an id (logged and used as a metric label;
the key itself never is) and optional quotas:

    keys:
      - id: fleet-a
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        max_sessions: 32          # concurrent sessions (and Generate calls) on one replica; 0 = no limit
        tokens_per_minute: 200000 # tokens generated on one replica in any minute; 0 = no limit

The mapping comes from a file (``api_keys_file``, YAML or JSON, re-read when it changes: keys
are added and revoked without a restart) and/or from an environment variable holding the same
mapping as JSON (``api_keys_env``, e.g. filled from a secret store). ``edgespec keys new``
writes an entry and prints the key once.

Short-lived tokens stand in for a key where the key would be public (a web page, an app): the
app's backend, which holds the key, mints ``est1.<payload>.<mac>`` (``mint_token``, or
``edgespec keys mint``): the payload is base64url JSON ``{"kid": key id, "exp": unix seconds
[, "origin": a web origin]}``, the mac base64url HMAC-SHA256 of the payload segment (its ASCII
text as it stands in the token) keyed with the key's SHA-256 digest (32 bytes), which the key
store holds. A token is accepted wherever a key is, as that key (its quotas too), until it
expires; one bound to an origin is refused where the request's Origin is another. (So the keys
file can mint tokens for every key in it: keep it as private as the keys.)

A request without a key, or with one that is not listed, is refused UNAUTHENTICATED before any
model work; a key over its quota gets RESOURCE_EXHAUSTED with the seconds to wait in the
message. Both quotas are counted on each replica; with a ``FleetQuota`` (fleet_quota.py, which
the deployment sets up) tokens per minute are also counted across the fleet, so a key's limit
holds whatever the replica count.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import grpc

from edgespec.edge.errors import status_error
from edgespec.edge.settings import load_settings

log = logging.getLogger("ray.serve")

KEY_PREFIX = "es-"
RELOAD_CHECK_S = 1.0  # how often the keys file's modification time is looked at


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh random API key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    sha256: str
    max_sessions: int = 0  # 0: no limit
    tokens_per_minute: int = 0  # 0: no limit

    def __post_init__(self) -> None:
        if not self.key_id or not isinstance(self.key_id, str):
            raise ValueError("a key needs a non-empty string id")
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64 and all(c in "0123456789abcdef" for c in self.sha256)):
            raise ValueError(f"key {self.key_id!r}: sha256 must be 64 lowercase hex digits (the key's SHA-256 digest)")
        for name in ("max_sessions", "tokens_per_minute"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"key {self.key_id!r}: {name} must be an integer >= 0 (0 = no limit), got {value!r}")


def parse_keys(data: dict, source: str) -> dict[str, ApiKey]:
    """The keys of a mapping {"keys": [{id, sha256, ...}, ...]}, by digest."""
    entries = data.get("keys")
    if not isinstance(entries, list):
        raise ValueError(f"{source}: expected a 'keys' list")
    keys: dict[str, ApiKey] = {}
    ids: set[str] = set()
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{source}: keys[{n}] must be a mapping with id and sha256")
        unknown = sorted(set(entry) - {"id", "sha256", "max_sessions", "tokens_per_minute"})
        if unknown:
            raise ValueError(f"{source}: keys[{n}] has unknown fields {unknown}")
        try:
            key = ApiKey(entry.get("id", ""), str(entry.get("sha256", "")).lower(), entry.get("max_sessions", 0),
                         entry.get("tokens_per_minute", 0))
        except ValueError as exc:
            raise ValueError(f"{source}: keys[{n}]: {exc}") from None
        if key.key_id in ids:
            raise ValueError(f"{source}: key id {key.key_id!r} appears twice")
        ids.add(key.key_id)
        keys[key.sha256] = key
    return keys


TOKEN_PREFIX = "est1."
MAX_TOKEN_TTL_S = 24 * 3600  # short-lived: a token that leaks is good for at most this long


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key_digest: str, payload_segment: str) -> bytes:
    return hmac.new(bytes.fromhex(key_digest), payload_segment.encode("ascii"), hashlib.sha256).digest()


def mint_token(key_id: str, key_digest: str, ttl_s: float, *, origin: str = "", now: float | None = None) -> str:
    """A token for the key ``key_id`` (whose SHA-256 digest is ``key_digest``: ``digest(key)``, or
    the key store's entry), valid for ``ttl_s`` seconds from ``now``; bound to ``origin`` if given."""
    if not 0 < ttl_s <= MAX_TOKEN_TTL_S:
        raise ValueError(f"ttl must be between 1 and {MAX_TOKEN_TTL_S} seconds (tokens are short-lived), got {ttl_s:g}")
    payload: dict = {"kid": key_id, "exp": int((time.time() if now is None else now) + ttl_s)}
    if origin:
        payload["origin"] = origin.lower().rstrip("/")
    segment = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    return f"{TOKEN_PREFIX}{segment}.{_b64(_mac(key_digest, segment))}"


def token_claims(token: str) -> tuple[dict, str, bytes]:
    """(payload, payload segment, mac) of a token, unverified; UNAUTHENTICATED when malformed."""
    try:
        segment, mac_text = token[len(TOKEN_PREFIX):].split(".")
        payload, mac = json.loads(_unb64(segment)), _unb64(mac_text)
        if not (isinstance(payload, dict) and isinstance(payload.get("kid"), str) and isinstance(payload.get("exp"), int)):
            raise ValueError("the payload needs kid (string) and exp (integer)")
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise status_error(grpc.StatusCode.UNAUTHENTICATED, (
            f"malformed token ({exc}): send the whole est1.<payload>.<mac> string your backend minted")) from None
    return payload, segment, mac


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def key_from_metadata(metadata: Iterable[tuple[str, str]] | None) -> str | None:
    """The key (or token) a request presents, or None."""
    for name, value in metadata or ():
        name = name.lower()
        if name == "x-api-key" and value:
            return value.strip()
        if name == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip()
    return None


class KeyRing:
    """The valid keys, from a file (re-read when it changes) and/or an environment variable."""

    def __init__(self, path: str = "", env: str = ""):
        self.path = Path(path) if path else None
        self.env = env
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._checked = 0.0
        self._file_keys: dict[str, ApiKey] = {}
        self._env_keys: dict[str, ApiKey] = {}
        if self.env:
            text = os.environ.get(self.env, "")
            if not text:
                raise ValueError(f"api_keys_env: the environment variable {self.env} is empty or unset")
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"api_keys_env: {self.env} does not hold JSON: {exc}") from None
            self._env_keys = parse_keys(data, f"${self.env}")
        if self.path is not None:
            self._reload(force=True)

    @property
    def enabled(self) -> bool:
        return self.path is not None or bool(self.env)

    @property
    def count(self) -> int:
        return len(self._file_keys) + len(self._env_keys)

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        path = self.path
        if path is None or (not force and now - self._checked < RELOAD_CHECK_S):
            return
        self._checked = now
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            if force:
                raise ValueError(f"api_keys_file: cannot read {self.path}: {exc.strerror}") from None
            log.error("api keys file %s unreadable (%s): keeping the %d keys loaded before", self.path, exc.strerror, len(self._file_keys))
            return
        if mtime == self._mtime and not force:
            return
        try:
            keys = parse_keys(load_settings(path), str(path))
        except ValueError as exc:
            if force:
                raise
            log.error("api keys file %s is invalid (%s): keeping the %d keys loaded before", self.path, exc, len(self._file_keys))
            return
        self._file_keys, self._mtime = keys, mtime
        if not force:
            log.info("api keys reloaded from %s: %d key(s)", self.path, len(keys))

    def lookup(self, key: str) -> ApiKey | None:
        if self.path is not None:
            with self._lock:
                self._reload()
        found = digest(key)
        return self._file_keys.get(found) or self._env_keys.get(found)

    def by_id(self, key_id: str) -> ApiKey | None:
        if self.path is not None:
            with self._lock:
                self._reload()
        return next((key for key in (*self._file_keys.values(), *self._env_keys.values()) if key.key_id == key_id), None)

    def verify_token(self, token: str, *, origin: str | None = None, now: float | None = None) -> ApiKey:
        """The key a token stands for; UNAUTHENTICATED (unknown key, bad signature, expired, too
        long-lived) or PERMISSION_DENIED (bound to an origin other than the request's ``origin``)."""
        payload, segment, mac = token_claims(token)
        key = self.by_id(payload["kid"])
        if key is None:
            raise status_error(grpc.StatusCode.UNAUTHENTICATED, (
                f"the token's key {payload['kid']!r} is unknown or revoked: mint tokens from a key this verifier lists"))
        if not hmac.compare_digest(mac, _mac(key.sha256, segment)):
            raise status_error(grpc.StatusCode.UNAUTHENTICATED, (
                f"the token's signature does not match key {key.key_id!r}: mint it again from that key "
                "(edgespec keys mint, or your backend), and send it unchanged"))
        now = time.time() if now is None else now
        if payload["exp"] <= now:
            raise status_error(grpc.StatusCode.UNAUTHENTICATED, (
                f"the token expired at {_utc(payload['exp'])} ({now - payload['exp']:.0f}s ago): fetch a fresh one from "
                "the app's backend"))
        if payload["exp"] > now + MAX_TOKEN_TTL_S + 60:
            raise status_error(grpc.StatusCode.UNAUTHENTICATED, (
                f"the token lives until {_utc(payload['exp'])}, past this verifier's limit of {MAX_TOKEN_TTL_S}s: mint it "
                "with a shorter ttl"))
        bound = payload.get("origin")
        if bound and origin is not None and origin.lower().rstrip("/") != bound:
            raise status_error(grpc.StatusCode.PERMISSION_DENIED, f"the token is for pages of {bound}, not {origin}")
        return key

    def authenticate(self, metadata) -> ApiKey | None:
        """The caller's key (a token's), or None when no keys are configured; raises UNAUTHENTICATED."""
        if not self.enabled:
            return None
        presented = key_from_metadata(metadata)
        if presented is None:
            raise status_error(
                grpc.StatusCode.UNAUTHENTICATED,
                ("no API key: send a key or token in the metadata as 'authorization: Bearer <key>' (or 'x-api-key: <key>'); "
                 "over WebSocket, as the subprotocol edgespec.auth.<key>"),
            )
        if presented.startswith(TOKEN_PREFIX):
            origin = next((value for name, value in metadata or () if name.lower() == "origin"), None)
            return self.verify_token(presented, origin=origin)
        key = self.lookup(presented)
        if key is None:
            raise status_error(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked API key: check the key the device sends")
        return key


class Quotas:
    """Per-key concurrent sessions and tokens per minute, on this replica; tokens per minute
    across the fleet too when ``fleet`` is set (the per-replica count stays as the local guard)."""

    WINDOW_S = 60.0

    def __init__(self, fleet=None) -> None:
        self._sessions: dict[str, int] = {}
        self._tokens: dict[str, deque] = {}
        self.fleet = fleet  # a fleet_quota.FleetQuota, or None

    def acquire(self, key: ApiKey | None) -> None:
        """Counts one more open session; raises RESOURCE_EXHAUSTED over either quota."""
        if key is None:
            return
        open_now = self._sessions.get(key.key_id, 0)
        if key.max_sessions and open_now >= key.max_sessions:
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"key {key.key_id!r} has {open_now} open sessions, its limit on this replica: close one, or retry in a few "
                "seconds (retry after 5s)",
            )
        self.check_tokens(key)
        self._sessions[key.key_id] = open_now + 1

    def release(self, key: ApiKey | None) -> None:
        if key is not None:
            self._sessions[key.key_id] = max(self._sessions.get(key.key_id, 1) - 1, 0)

    def charge(self, key: ApiKey | None, tokens: int) -> None:
        if key is not None and key.tokens_per_minute and tokens:
            self._tokens.setdefault(key.key_id, deque()).append((time.monotonic(), tokens))
            if self.fleet is not None:
                self.fleet.charge(key.key_id, tokens)

    def check_tokens(self, key: ApiKey | None) -> None:
        """Raises RESOURCE_EXHAUSTED when the key generated its tokens-per-minute already."""
        if key is None or not key.tokens_per_minute:
            return
        now = time.monotonic()
        window = self._tokens.setdefault(key.key_id, deque())
        while window and window[0][0] < now - self.WINDOW_S:
            window.popleft()
        used = sum(n for _, n in window)
        if used >= key.tokens_per_minute:
            retry = max(1, int(window[0][0] + self.WINDOW_S - now + 1))
            raise status_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"key {key.key_id!r} generated {used} tokens in the last minute, its limit of {key.tokens_per_minute} "
                f"on this replica: retry after {retry}s",
            )
        if self.fleet is not None:
            fleet_used = self.fleet.used(key.key_id)
            if fleet_used >= key.tokens_per_minute:
                raise status_error(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"key {key.key_id!r} generated {fleet_used} tokens in the last minute across all replicas, its limit "
                    f"of {key.tokens_per_minute}: retry after 10s",
                )


def is_loopback_peer(peer: str | None) -> bool:
    """Whether a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:...") is
    this machine: a loopback address, or one of this host's own interface addresses (a local
    client that dialled the node IP, as a replica's own port is reached). An empty or unknown
    peer counts as remote."""
    import ipaddress

    if not peer:
        return False
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    if kind == "ipv4":
        host = rest.rsplit(":", 1)[0]
    elif kind == "ipv6":
        host = rest.rsplit(":", 1)[0].strip("[]")
    else:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address
    return address.is_loopback or str(address) in local_addresses()


@functools.lru_cache(maxsize=1)
def local_addresses() -> frozenset[str]:
    """This host's interface addresses (read once per process)."""
    import psutil

    return frozenset(
        item.address.split("%", 1)[0]
        for items in psutil.net_if_addrs().values()
        for item in items
        if item.family in (socket.AF_INET, socket.AF_INET6)
    )
