"""Salted slow password hashes (scrypt) as group0 stores them, and their constant-time check."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

SCHEME = "scrypt"
N, R, P = 2 ** 14, 8, 1  # about 16 MiB and tens of milliseconds a hash: slow for guessing, fine for a login
SALT_BYTES = 16
KEY_BYTES = 32
MAX_PASSWORD_BYTES = 1024


class PasswordError(ValueError):
    """A password that cannot be used (the message never holds it)."""


def hash_password(password: str) -> str:
    """`scrypt$N$R$P$SALT$KEY` (base64) of `password` with a new random salt."""
    encoded = _checked(password)
    salt = os.urandom(SALT_BYTES)
    key = hashlib.scrypt(encoded, salt=salt, n=N, r=R, p=P, dklen=KEY_BYTES)
    return "$".join((SCHEME, str(N), str(R), str(P), _b64(salt), _b64(key)))


def verify(password: str, stored: str) -> bool:
    """Whether `password` is the one `stored` was made from (False for an empty or malformed `stored`)."""
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != SCHEME:
            return False
        expected = base64.b64decode(key)
        actual = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                                dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def _checked(password: str) -> bytes:
    encoded = password.encode()
    if not encoded:
        raise PasswordError("an empty password is not allowed")
    if len(encoded) > MAX_PASSWORD_BYTES:
        raise PasswordError(f"a password has at most {MAX_PASSWORD_BYTES} bytes")
    return encoded


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
