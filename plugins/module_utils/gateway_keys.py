"""The gateway's client keys in PostgreSQL: the schema, key creation, revocation, usage (issue 25).

One table holds a row per key NAME: the key's SHA-256 digest (never the key), when it was made and revoked, and
its usage counters. The gateway's auth hook (roles/gateway/files/sparkops_gateway_auth.py) looks the digest of
the presented key up; the keys module (plugins/modules/gateway_key.py) creates and revokes rows; status reads
names and counters. Standard library only and any DB-API 2 connection with the `format` paramstyle (psycopg 3,
pg8000): the same file runs inside the gateway's venv and under Ansible on the head.

Why a digest and not a salted slow hash: the keys are 256-bit random strings, not passwords, so a dictionary
attack has nothing to guess and a fast lookup by digest (indexed, one query per request) is enough.
"""

from __future__ import annotations

import hashlib
import re
import secrets

TABLE = "sparkops_gateway_keys"  # written out in each statement below: no query is built from strings
KEY_PREFIX = "sk-sparkops-"
# Names end up in file names (<credentials>/keys/NAME) and Prometheus label values: keep them plain.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sparkops_gateway_keys (
    name text PRIMARY KEY,
    digest text NOT NULL UNIQUE,
    created timestamptz NOT NULL DEFAULT now(),
    revoked timestamptz,
    requests bigint NOT NULL DEFAULT 0,
    prompt_tokens bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0
)
"""
# The key's class and its admission limits (docs/gateway.md, "Limits per key"), and how many of its requests
# were refused over them (429), added to tables made before them; NULL limit = none. The gateway's hook hands
# the limits to LiteLLM's limiter in the key's UserAPIKeyAuth.
LIMIT_COLUMNS = """
ALTER TABLE sparkops_gateway_keys
    ADD COLUMN IF NOT EXISTS key_class text NOT NULL DEFAULT 'interactive',
    ADD COLUMN IF NOT EXISTS max_parallel_requests integer,
    ADD COLUMN IF NOT EXISTS tpm_limit integer,
    ADD COLUMN IF NOT EXISTS refused bigint NOT NULL DEFAULT 0
"""
KEY_CLASSES = ("interactive", "batch")
LIMIT_FIELDS = ("key_class", "max_parallel_requests", "tpm_limit")


class KeyNameError(ValueError):
    """The key name cannot be used (file name and Prometheus label)."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise KeyNameError(
            f"key name {name!r} is not usable: 1-63 characters, letters, digits, '_', '.', '-', "
            "starting with a letter or digit (it becomes a file name and a Prometheus label)"
        )
    return name


# What new_key() makes (token_urlsafe(32): 43 characters of the URL-safe alphabet): the only keys the
# table can hold, so anything else is refused without asking the database.
KEY_RE = re.compile(r"^sk-sparkops-[A-Za-z0-9_-]{43}\Z")


def new_key() -> str:
    """A fresh key: 32 random bytes (secrets), URL-safe, with a prefix that says whose key it is."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def bearer_token(authorization: str | None) -> str:
    """The token of `Bearer <token>` (scheme case-insensitive); '' for anything else."""
    if not authorization:
        return ""
    scheme, _sep, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def ensure_schema(conn) -> None:
    with conn.cursor() as cur:
        cur.execute(SCHEMA)
        cur.execute(LIMIT_COLUMNS)
    conn.commit()


class KeyLimitsError(ValueError):
    """A key's class or limits cannot be stored."""


def check_limits(name: str, limits: dict | None) -> dict:
    """`limits` ({key_class, max_parallel_requests, tpm_limit}; missing: interactive, no limit) made whole and
    checked: a known class, each limit a whole number >= 1 or None. The error names the key."""
    limits = dict(limits or {})
    unknown = sorted(set(limits) - set(LIMIT_FIELDS))
    if unknown:
        raise KeyLimitsError(
            f"key {name}: unknown limit field(s) {', '.join(unknown)}; known: {', '.join(LIMIT_FIELDS)}"
        )
    out = {"key_class": limits.get("key_class") or "interactive"}
    if out["key_class"] not in KEY_CLASSES:
        raise KeyLimitsError(f"key {name}: class {out['key_class']!r} is not one of {', '.join(KEY_CLASSES)}")
    for field in LIMIT_FIELDS[1:]:
        value = limits.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise KeyLimitsError(f"key {name}: {field} must be a whole number >= 1 (or unset), got {value!r}")
        out[field] = value
    return out


def key_limits(conn, name: str) -> dict | None:
    """The stored class and limits of `name`'s row, or None when there is no row."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT key_class, max_parallel_requests, tpm_limit FROM sparkops_gateway_keys WHERE name = %s",
            (check_name(name),),
        )
        row = cur.fetchone()
    conn.commit()
    return None if row is None else dict(zip(LIMIT_FIELDS, row, strict=True))


def set_limits(conn, name: str, limits: dict) -> bool:
    """Store `name`'s class and limits (check_limits); True when the row changed. The hook sees them within
    its cache window (2 s), without a restart."""
    limits = check_limits(name, limits)
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE sparkops_gateway_keys SET key_class = %s, max_parallel_requests = %s, tpm_limit = %s "
            "WHERE name = %s AND (key_class, max_parallel_requests, tpm_limit) IS DISTINCT FROM (%s, %s, %s)",
            (*(limits[f] for f in LIMIT_FIELDS), name, *(limits[f] for f in LIMIT_FIELDS)),
        )
        changed = cur.rowcount == 1
    conn.commit()
    return changed


def key_state(conn, name: str) -> str:
    """'active', 'revoked' or 'absent'."""
    with conn.cursor() as cur:
        cur.execute("SELECT revoked IS NULL FROM sparkops_gateway_keys WHERE name = %s", (check_name(name),))
        row = cur.fetchone()
    if row is None:
        return "absent"
    return "active" if row[0] else "revoked"


def create(conn, name: str) -> str | None:
    """A new key for `name`, stored as its digest; None (nothing changed) when `name` already has an active key.

    A revoked name gets a new key in the same row, its usage counters kept (the name's history)."""
    check_name(name)
    key = new_key()
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO sparkops_gateway_keys (name, digest) VALUES (%s, %s) "
            "ON CONFLICT (name) DO UPDATE SET digest = EXCLUDED.digest, created = now(), revoked = NULL "
            "WHERE sparkops_gateway_keys.revoked IS NOT NULL RETURNING name",
            (name, digest(key)),
        )
        made = cur.fetchone() is not None
    conn.commit()
    return key if made else None


def revoke(conn, name: str) -> bool:
    """Revoke `name`'s key; True when it was active. The digest is replaced so that no lookup can match it."""
    check_name(name)
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE sparkops_gateway_keys SET revoked = now(), digest = 'revoked:' || name "
            "WHERE name = %s AND revoked IS NULL",
            (name,),
        )
        changed = cur.rowcount == 1
    conn.commit()
    return changed


def lookup_entry(conn, key: str) -> dict | None:
    """The active key `key`'s name, class and limits ({name, key_class, max_parallel_requests, tpm_limit}), or
    None."""
    if not key:
        return None
    with conn.cursor() as cur:
        cur.execute(
            "SELECT name, key_class, max_parallel_requests, tpm_limit FROM sparkops_gateway_keys "
            "WHERE digest = %s AND revoked IS NULL",
            (digest(key),),
        )
        row = cur.fetchone()
    conn.commit()  # end the read transaction: the next lookup sees a revocation committed meanwhile
    return dict(zip(("name", *LIMIT_FIELDS), row, strict=True)) if row else None


def lookup(conn, key: str) -> str | None:
    """The name of the active key `key`, or None."""
    entry = lookup_entry(conn, key)
    return entry["name"] if entry else None


def add_usage(conn, name: str, prompt_tokens: int, completion_tokens: int) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE sparkops_gateway_keys SET requests = requests + 1, prompt_tokens = prompt_tokens + %s, "
            "completion_tokens = completion_tokens + %s WHERE name = %s",
            (int(prompt_tokens), int(completion_tokens), name),
        )
    conn.commit()


def add_refusal(conn, name: str) -> None:
    """One more request of `name` refused with 429 (over its limit)."""
    with conn.cursor() as cur:
        cur.execute("UPDATE sparkops_gateway_keys SET refused = refused + 1 WHERE name = %s", (name,))
    conn.commit()


def usage(conn) -> list[dict]:
    """Every key's name, state, counters, class, limits and refusals (never a key or digest), by name."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT name, created, revoked, requests, prompt_tokens, completion_tokens, "
            "key_class, max_parallel_requests, tpm_limit, refused FROM sparkops_gateway_keys ORDER BY name"
        )
        rows = cur.fetchall()
    conn.commit()
    return [
        {
            "name": r[0],
            "state": "revoked" if r[2] is not None else "active",
            "created": r[1].isoformat(),
            "revoked": r[2].isoformat() if r[2] is not None else None,
            "requests": int(r[3]),
            "prompt_tokens": int(r[4]),
            "completion_tokens": int(r[5]),
            "key_class": r[6],
            "max_parallel_requests": r[7],
            "tpm_limit": r[8],
            "refused": int(r[9]),
        }
        for r in rows
    ]
