"""Decision receipts: checking, before a call runs, that the server signed its approval of
exactly that call (docs/security.md#decision-receipts).

A receipt is a compact JWS (EdDSA over Ed25519, RFC 8037) whose header and claims are
countersign's canonical JSON. It verifies when it is signed by a key of the server's key set,
the set chains to the pinned fingerprint (its first key's RFC 7638 thumbprint; each later key
is endorsed by the one before it), and its claims approve this approval, for the digest of the
arguments about to run, before ``exp``.

The arguments' digest is SHA-256 of their canonical JSON, computed exactly as the server does
(:func:`canonical_json`, :func:`args_digest`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from countersign.errors import CountersignError

RECEIPT_TYPE = "countersign-receipt+jwt"
ENDORSEMENT_TYPE = "countersign-key+jwt"
CHECKPOINT_TYPE = "countersign-checkpoint+jwt"

_I64_MIN = -(2**63)
_U64_MAX = 2**64 - 1


class ReceiptError(CountersignError):
    """The decision receipt does not verify: the call must not run. The message names what did
    not match (signature, key, approval id, arguments digest, verdict, expiry)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the decision receipt does not verify: {message}")


class StrictJsonError(CountersignError, ValueError):
    """Arguments with more than one meaning: a key twice, a number that cannot be held exactly."""


def parse_strict(text: str) -> Any:
    """Parses JSON as the server does: a key twice in one object, an integer beyond 64 bits or a
    number beyond the double range is refused."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise StrictJsonError(
                    f"the key {key!r} appears twice; parsers disagree on which value counts"
                )
            out[key] = value
        return out

    def integer(literal: str) -> int:
        value = int(literal)
        if not _I64_MIN <= value <= _U64_MAX:
            raise StrictJsonError(f"the integer {literal} does not fit in 64 bits; send it as a string")
        return value

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise StrictJsonError(
                f"the number {literal} is beyond the range of a double; send it as a string"
            )
        return value

    def constant(name: str) -> Any:
        raise StrictJsonError(f"{name} is not JSON")

    return json.loads(
        text, object_pairs_hook=pairs, parse_int=integer, parse_float=number, parse_constant=constant
    )


def _number(value: float) -> str:
    """ECMAScript's Number.prototype.toString of a finite double (RFC 8785, 3.2.2.3)."""
    if value == 0:
        return "0"
    if value < 0:
        return "-" + _number(-value)
    # repr is the shortest text that reads back as the value.
    _sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = len(digits)
    n = k + int(exponent)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    fraction = f".{digits[1:]}" if k > 1 else ""
    return f"{digits[0]}{fraction}e{'+' if n > 0 else '-'}{abs(n - 1)}"


def canonical_json(value: Any) -> str:
    """countersign's canonical JSON (docs/security.md#one-meaning-per-call): keys sorted by code
    point, no insignificant whitespace, strings escaped as RFC 8785 does, integers exact,
    other numbers in ECMAScript's shortest form."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StrictJsonError("a number must be finite")
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(item) for item in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda item: item[0])
        return (
            "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items) + "}"
        )
    raise StrictJsonError(f"{type(value).__name__} is not JSON")


def args_digest(arguments: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``arguments`` (a parsed value, or JSON text)."""
    value = parse_strict(arguments) if isinstance(arguments, str) else arguments
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def _b64decode(part: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (ValueError, TypeError) as error:
        raise ReceiptError(f"the receipt is not a compact JWS: {what} is not base64url: {error}") from None


def key_id(x: bytes) -> str:
    """The RFC 7638 thumbprint of an Ed25519 public key (its 32 bytes)."""
    member = base64.urlsafe_b64encode(x).rstrip(b"=").decode()
    canonical = canonical_json({"crv": "Ed25519", "kty": "OKP", "x": member})
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class KeySet:
    """The server's public keys, oldest first, checked to be one chain of endorsements."""

    keys: tuple[tuple[str, Ed25519PublicKey], ...]

    @property
    def fingerprint(self) -> str:
        return self.keys[0][0]

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return next((key for k, key in self.keys if k == kid), None)

    @classmethod
    def from_jwks(cls, jwks: str | dict[str, Any], pin: str | None = None) -> KeySet:
        """Reads a JWKS document; refuses keys whose kid is not their thumbprint, a key not
        endorsed by the key before it, and (with ``pin``) a set with another fingerprint."""
        document = json.loads(jwks) if isinstance(jwks, str) else jwks
        entries = document.get("keys") if isinstance(document, dict) else None
        if not entries:
            raise ReceiptError("the key set is not valid: no keys")
        keys: list[tuple[str, Ed25519PublicKey]] = []
        for index, jwk in enumerate(entries):
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                raise ReceiptError(f"the key set is not valid: key {index} is not an Ed25519 key")
            x = _b64decode(str(jwk.get("x", "")), "a key")
            kid = key_id(x)
            if jwk.get("kid") != kid:
                raise ReceiptError(f"the key set is not valid: key {index}'s kid is not its thumbprint {kid}")
            key = Ed25519PublicKey.from_public_bytes(x)
            if keys:
                before_kid, before = keys[-1]
                endorsement = jwk.get("countersign_endorsement", "")
                try:
                    endorsed = _verify_jws(endorsement, ENDORSEMENT_TYPE, KeySet(((before_kid, before),)))
                except ReceiptError:
                    endorsed = {}
                if endorsed.get("endorses") != kid:
                    raise ReceiptError(
                        f"the key set is not valid: key {kid} is not endorsed by key {before_kid}"
                    )
            keys.append((kid, key))
        key_set = cls(tuple(keys))
        if pin and key_set.fingerprint != pin:
            raise ReceiptError(f"the key set's fingerprint is {key_set.fingerprint}, not the pinned {pin}")
        return key_set


def header_kid(token: str) -> str:
    """The key id a JWS names ("" when it names none)."""
    try:
        header = json.loads(_b64decode((token or "").split(".")[0], "the header"))
    except (ValueError, ReceiptError):
        return ""
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else ""


def _verify_jws(token: str, typ: str, keys: KeySet) -> dict[str, Any]:
    token = (token or "").strip()
    if not token:
        raise ReceiptError("the receipt is missing")
    parts = token.split(".")
    if len(parts) != 3:
        raise ReceiptError(f"the receipt is not a compact JWS: {len(parts)} parts, not 3")
    header_part, payload_part, signature_part = parts
    try:
        header = json.loads(_b64decode(header_part, "the header"))
    except ValueError:
        raise ReceiptError("the receipt is not a compact JWS: the header is not JSON") from None
    kid = header.get("kid") if isinstance(header, dict) else None
    if not (
        isinstance(header, dict)
        and header.get("alg") == "EdDSA"
        and header.get("typ") == typ
        and kid
        and len(header) == 3
    ):
        raise ReceiptError(f"the receipt's header is not an EdDSA {typ} header: {canonical_json(header)}")
    key = keys.get(kid)
    if key is None:
        raise ReceiptError(f"the receipt is signed with key {kid}, which is not in the pinned key set")
    try:
        key.verify(_b64decode(signature_part, "the signature"), f"{header_part}.{payload_part}".encode())
    except (InvalidSignature, ReceiptError):
        raise ReceiptError(f"the receipt's signature does not verify with key {kid}") from None
    try:
        claims = json.loads(_b64decode(payload_part, "the payload"))
    except ValueError:
        raise ReceiptError("the receipt is not a compact JWS: the payload is not JSON") from None
    if not isinstance(claims, dict):
        raise ReceiptError("the receipt is not a compact JWS: the payload is not an object")
    return claims


def verify_receipt(
    receipt: str,
    keys: KeySet,
    *,
    approval_id: str | None = None,
    args_digest: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The receipt's claims when its signature verifies with ``keys`` and, for each one given,
    it is about ``approval_id``, approves arguments with digest ``args_digest``, and is not
    expired at ``now`` (unix seconds; None: the current time). Raises ReceiptError otherwise."""
    claims = _verify_jws(receipt, RECEIPT_TYPE, keys)
    if approval_id is not None and (
        claims.get("approval_id") != approval_id or claims.get("sub") != approval_id
    ):
        raise ReceiptError(f"the receipt is for approval {claims.get('approval_id')}, not {approval_id}")
    if args_digest is not None:
        if claims.get("verdict") != "APPROVE":
            raise ReceiptError(f"the receipt's verdict is {claims.get('verdict')}, not APPROVE")
        if claims.get("args_digest") != args_digest:
            raise ReceiptError(
                f"the receipt approves arguments with digest {claims.get('args_digest')}, "
                f"not the arguments about to run (digest {args_digest})"
            )
    current = int(time.time() if now is None else now)
    expires = claims.get("exp")
    if not isinstance(expires, int) or current >= expires:
        raise ReceiptError(f"the receipt expired at {expires} (unix seconds), now is {current}")
    return claims
