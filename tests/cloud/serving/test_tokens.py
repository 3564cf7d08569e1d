"""Short-lived tokens (auth.py): minted from a key, accepted as that key until they expire, refused
with a message that says what to fix when tampered with, expired, too long-lived, of an unknown
key or used from another origin; ``edgespec keys mint`` / ``verify`` on the same code."""

from __future__ import annotations

import argparse
import base64
import json
import time

import grpc
import pytest
import yaml

from edgespec.cli import keys as keys_cli
from edgespec.cloud.serving.auth import MAX_TOKEN_TTL_S, KeyRing, digest, mint_token, token_claims
from edgespec.edge.errors import ServerError

NOW = 1_800_000_000.0


@pytest.fixture
def ring(tmp_path) -> KeyRing:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"id": "app", "sha256": digest("es-app"), "max_sessions": 2},
                                             {"id": "other", "sha256": digest("es-other")}]}))
    return KeyRing(str(path))


def refusal(call) -> ServerError:
    with pytest.raises(ServerError) as refused:
        call()
    return refused.value


def test_a_token_stands_for_its_key_until_it_expires(ring):
    token = mint_token("app", digest("es-app"), 600, now=NOW)
    assert token.startswith("est1.") and set(token) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-")
    key = ring.verify_token(token, now=NOW + 599)
    assert (key.key_id, key.max_sessions) == ("app", 2)  # the key's own quotas
    error = refusal(lambda: ring.verify_token(token, now=NOW + 600))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED and "expired" in error.details and "fresh one" in error.details


def test_the_format_is_what_the_docs_say():
    token = mint_token("app", digest("es-app"), 60, origin="HTTPS://App.example.com/", now=NOW)
    _, payload, mac = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == {"kid": "app", "exp": int(NOW) + 60,
                                                                   "origin": "https://app.example.com"}
    import hashlib
    import hmac

    expected = hmac.new(bytes.fromhex(digest("es-app")), payload.encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(mac + "=") == expected
    assert token_claims(token)[0]["kid"] == "app"


@pytest.mark.parametrize("change, fragment", [
    (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), "signature does not match"),
    (lambda t: t.replace(t.split(".")[1], base64.urlsafe_b64encode(b'{"exp":9999999999,"kid":"app"}').decode().rstrip("=")),
     "signature does not match"),
    (lambda t: t + ".extra", "malformed token"),
    (lambda t: "est1.bm90IGpzb24.AAAA", "malformed token"),
])
def test_a_tampered_or_malformed_token_is_refused(ring, change, fragment):
    token = change(mint_token("app", digest("es-app"), 600, now=NOW))
    error = refusal(lambda: ring.verify_token(token, now=NOW))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED and fragment in error.details


def test_a_token_signed_with_another_keys_secret_is_refused(ring):
    forged = mint_token("app", digest("es-other"), 600, now=NOW)
    assert "signature does not match key 'app'" in refusal(lambda: ring.verify_token(forged, now=NOW)).details


def test_an_unknown_or_revoked_key_and_a_too_long_life(ring):
    assert "unknown or revoked" in refusal(lambda: ring.verify_token(mint_token("gone", digest("es-gone"), 60, now=NOW),
                                                                      now=NOW)).details
    with pytest.raises(ValueError, match="short-lived"):
        mint_token("app", digest("es-app"), MAX_TOKEN_TTL_S + 1)
    # a token minted elsewhere with a longer life is refused by the verifier too
    long = mint_token("app", digest("es-app"), MAX_TOKEN_TTL_S, now=NOW + 3600)
    assert "shorter ttl" in refusal(lambda: ring.verify_token(long, now=NOW)).details


def test_an_origin_bound_token_is_refused_from_another_origin(ring):
    token = mint_token("app", digest("es-app"), 600, origin="https://app.example.com", now=NOW)
    assert ring.verify_token(token, origin="https://app.example.com", now=NOW).key_id == "app"
    assert ring.verify_token(token, now=NOW).key_id == "app"  # no Origin: not a browser
    error = refusal(lambda: ring.verify_token(token, origin="https://evil.example.com", now=NOW))
    assert error.code == grpc.StatusCode.PERMISSION_DENIED and "https://app.example.com" in error.details


def test_authenticate_takes_a_token_wherever_it_takes_a_key(ring):
    token = mint_token("app", digest("es-app"), 600)
    assert ring.authenticate([("authorization", f"Bearer {token}")]).key_id == "app"
    assert ring.authenticate([("x-api-key", token)]).key_id == "app"
    bound = mint_token("app", digest("es-app"), 600, origin="https://app.example.com")
    assert refusal(lambda: ring.authenticate([("authorization", f"Bearer {bound}"), ("origin", "https://x.example")])).code \
        == grpc.StatusCode.PERMISSION_DENIED


def test_keys_mint_and_verify_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "keys.yaml"
    parser = argparse.ArgumentParser()
    keys_cli.add_arguments(parser)

    def keys(*argv) -> tuple[int, str, str]:
        code = keys_cli.run(parser.parse_args([*argv, "--file", str(path)]))
        out = capsys.readouterr()
        return code, out.out.strip(), out.err

    assert keys("new", "--id", "web")[0] == 0
    code, token, _ = keys("mint", "--key-id", "web", "--ttl", "120", "--origin", "https://app.example.com")
    assert code == 0 and KeyRing(str(path)).verify_token(token).key_id == "web"
    code, out, _ = keys("verify", "--token", token)
    assert code == 0 and out.startswith("valid: key 'web'") and "https://app.example.com" in out
    code, out, _ = keys("verify", "--token", token[:-3] + "abc")
    assert code == 1 and "refused (UNAUTHENTICATED)" in out and "signature" in out
    assert keys("mint", "--key-id", "nobody")[0] == 2
    code, _, err = keys("mint", "--key-id", "web", "--ttl", str(MAX_TOKEN_TTL_S * 2))
    assert code == 2 and "short-lived" in err
    keys("revoke", "--id", "web")
    code, out, _ = keys("verify", "--token", token)
    assert code == 1 and "unknown or revoked" in out
    assert time.time() < token_claims(token)[0]["exp"]
