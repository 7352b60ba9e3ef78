"""What each provider setting is for, declared once with the field: `secret`, `semantic` or `operational`.

A provider declares each config field with one of the three constructors below instead of pydantic's `Field` (same
arguments). Everything that must tell the kinds apart reads that one declaration, never a list of names of its own:

- `secret`: a credential. Left out of the checkpoint fingerprint, the response cache key, `describe()` and the
  infer asset's metadata; its value is scrubbed from load errors (`ModelResource.secret_values`). A spec may only
  give it as `{env: NAME}` (resources/secrets.py refuses a literal by its name: tests/resources/test_fields.py
  holds the two in agreement).
- `semantic`: can change an answer (the model, its weights and runtime, decoding, what is sent on the wire, the
  tokenizer that truncates inputs). Part of the checkpoint fingerprint (a change recomputes committed chunks instead
  of mixing two setups in one partition) and of the cache key (a changed setup is never served an old answer).
- `operational`: throughput or resilience only (batch sizes, concurrency, rate limits, retries, timeouts, devices,
  polling, batch mode). A change keeps committed chunks and cached answers: lowering `max_concurrency` after a storm
  of 429s must not pay for the partition again.

A field declared with plain `Field` (a provider written outside this package) counts on the safe side of each
mistake: secret when its name says so (`is_secret_name`), else semantic (a change recomputes; it never reuses).
"""

from __future__ import annotations

from enum import Enum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field
from pydantic_core import PydanticUndefined

from batch_assets.resources.secrets import is_secret_name

# The key under which the role travels in the field's JSON schema (docs/spec-reference.md is made from that schema).
ROLE_KEY = "role"


class Role(str, Enum):
    SECRET = "secret"
    SEMANTIC = "semantic"
    OPERATIONAL = "operational"


def _declared(role: Role, default: Any, kwargs: dict[str, Any]) -> Any:
    extra = {**(kwargs.pop("json_schema_extra", None) or {}), ROLE_KEY: role.value}
    return Field(default, json_schema_extra=extra, **kwargs)


def secret(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
    """A credential field (pydantic `Field` arguments): never fingerprinted, described or logged."""
    return _declared(Role.SECRET, default, {"repr": False, **kwargs})


def semantic(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
    """A field that can change an answer (pydantic `Field` arguments)."""
    return _declared(Role.SEMANTIC, default, kwargs)


def operational(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
    """A field that changes throughput or resilience, never an answer (pydantic `Field` arguments)."""
    return _declared(Role.OPERATIONAL, default, kwargs)


def declared_role(cls: type, name: str) -> Role | None:
    """The role the class declares for its field `name`, or None (declared with plain `Field`, or no such field)."""
    info = getattr(cls, "model_fields", {}).get(name)
    extra = getattr(info, "json_schema_extra", None)
    value = extra.get(ROLE_KEY) if isinstance(extra, dict) else None
    return Role(value) if value is not None else None


def role(cls: type, name: str) -> Role:
    """The field's role; an undeclared field (or a config key the class does not know) on the safe side."""
    declared = declared_role(cls, name)
    if declared is not None:
        return declared
    return Role.SECRET if is_secret_name(name) else Role.SEMANTIC


def fields_with(cls: type, wanted: Role) -> list[str]:
    """The class's fields of one role, in declaration order."""
    return [name for name in getattr(cls, "model_fields", {}) if role(cls, name) is wanted]


def answer_settings(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The settings among `values` (field name -> value) that can change an answer: what the checkpoint fingerprint
    and the response cache key are made of. Secrets and operational settings are left out; a nested `{env: NAME}`
    stays the variable's name (its value is read only at load)."""
    return {name: value for name, value in values.items() if role(cls, name) is Role.SEMANTIC}


def public_url(url: str | None) -> str | None:
    """A URL as it may appear in metadata: no user:password@, no query string."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _shown(value: Any) -> Any:
    """A setting as metadata may show it: a mapping by its keys only (its values may carry anything: headers,
    constructor arguments), a URL without credentials or query."""
    if isinstance(value, dict):
        return sorted(str(k) for k in value)
    if isinstance(value, str) and "://" in value:
        return public_url(value)
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    return value


def chosen_settings(provider: Any) -> dict[str, Any]:
    """The settings a provider was configured with, away from their defaults, that can change an answer: what the
    infer asset's metadata shows beside the model (`describe()`), so a user sees what produced a partition and why a
    changed one was recomputed. Never a secret or an operational knob."""
    cls = type(provider)
    out = {}
    for name, info in cls.model_fields.items():
        value = getattr(provider, name)
        if role(cls, name) is not Role.SEMANTIC or (not info.is_required() and
                                                     value == info.get_default(call_default_factory=True)):
            continue
        out[name] = _shown(value)
    return out
