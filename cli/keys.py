"""``edgespec keys``: manage the verifier's API keys file (the key itself is printed once, never stored).

    edgespec keys new --file keys.yaml --id fleet-a [--max-sessions 32] [--tokens-per-minute 200000]
    edgespec keys list --file keys.yaml
    edgespec keys revoke --file keys.yaml --id fleet-a
    edgespec keys mint --file keys.yaml --key-id fleet-a --ttl 600 [--origin https://app.example.com]
    edgespec keys verify --file keys.yaml --token est1....

A running verifier re-reads the file when it changes (cloud/serving/auth.py). ``mint`` prints a
short-lived token standing for the key (for a web page or an app, where a key would be public);
``verify`` checks one as the verifier would and says whose it is and until when.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edgespec.cloud.serving.auth import MAX_TOKEN_TTL_S, ApiKey, KeyRing, digest, mint_token, new_key, parse_keys, token_claims
from edgespec.edge.errors import ServerError
from edgespec.edge.settings import load_settings, settings_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("new", "list", "revoke", "mint", "verify"))
    parser.add_argument("--file", type=Path, required=True, help="the keys file: .yaml/.yml is YAML, any other name JSON; created by `new`")
    parser.add_argument("--id", "--key-id", dest="key_id", help="the key's id (logs and metrics show it, never the key)")
    parser.add_argument("--max-sessions", type=int, default=0, help="new: concurrent sessions per replica (0 = no limit)")
    parser.add_argument("--tokens-per-minute", type=int, default=0, help="new: tokens per minute, across all replicas (0 = no limit)")
    parser.add_argument("--ttl", type=float, default=600.0, help=f"mint: seconds the token is valid (at most {MAX_TOKEN_TTL_S})")
    parser.add_argument("--origin", default="", help="mint: bind the token to one web origin (https://app.example.com)")
    parser.add_argument("--token", help="verify: the token to check")


def _read(path: Path) -> list[ApiKey]:
    if not path.exists():
        return []
    return list(parse_keys(load_settings(path), str(path)).values())


def _write(path: Path, keys: list[ApiKey]) -> None:
    """The file in the format its name says (.yaml/.yml YAML, else JSON), as every reader expects."""
    entries = [{"id": k.key_id, "sha256": k.sha256, "max_sessions": k.max_sessions, "tokens_per_minute": k.tokens_per_minute}
               for k in keys]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(settings_text(path, {"keys": entries}))
    tmp.chmod(0o600)
    tmp.replace(path)  # atomic: a verifier re-reading it never sees half a file


def _verify(path: Path, token: str) -> int:
    """Checks ``token`` against the keys file as the verifier would (0: valid, 1: refused)."""
    try:
        key = KeyRing(str(path)).verify_token(token)
    except ServerError as exc:
        print(f"refused ({exc.code.name}): {exc.details}")
        return 1
    claims = token_claims(token)[0]
    left = claims["exp"] - time.time()
    bound = f", for pages of {claims['origin']}" if claims.get("origin") else ""
    print(f"valid: key {key.key_id!r}, expires in {left:.0f}s{bound}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "verify":
            if not args.token:
                raise ValueError("verify needs --token")
            return _verify(args.file, args.token)
        keys = _read(args.file)
        if args.action == "list":
            for key in keys:
                print(f"{key.key_id}\tmax_sessions={key.max_sessions}\ttokens_per_minute={key.tokens_per_minute}")
            return 0
        if not args.key_id:
            raise ValueError(f"{args.action} needs --id")
        if args.action == "revoke":
            kept = [k for k in keys if k.key_id != args.key_id]
            if len(kept) == len(keys):
                raise ValueError(f"no key with id {args.key_id!r} in {args.file}")
            _write(args.file, kept)
            print(f"revoked {args.key_id}")
            return 0
        if args.action == "mint":
            key = next((k for k in keys if k.key_id == args.key_id), None)
            if key is None:
                raise ValueError(f"no key with id {args.key_id!r} in {args.file}")
            print(mint_token(key.key_id, key.sha256, args.ttl, origin=args.origin))
            return 0
        if any(k.key_id == args.key_id for k in keys):
            raise ValueError(f"{args.file} already has a key {args.key_id!r}: revoke it first, or pick another id")
        key = new_key()
        _write(args.file, keys + [ApiKey(args.key_id, digest(key), args.max_sessions, args.tokens_per_minute)])
    except ValueError as exc:
        print(f"edgespec keys: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"(key {args.key_id!r} added to {args.file}; this is the only time it is shown: give it to the devices, "
          "e.g. EDGESPEC_API_KEY)", file=sys.stderr)
    return 0
