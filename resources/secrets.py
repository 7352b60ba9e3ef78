"""Secrets in a model's config: `{env: NAME}` references, resolved at run time, never literal in a spec.

A spec is shown in the UI (run config, asset descriptions) and kept in the run storage, so a secret may only appear
in it as a reference to an environment variable:
- a top-level field becomes `dg.EnvVar(NAME)`: Dagster reads it at run time and hides its value in the UI;
- a reference nested inside a dict/list field (`init_kwargs: {token: {env: HF_TOKEN}}`) stays a marker in the config
  Dagster stores, and the provider resolves it when it loads the model (`resolve_env_refs`), inside the run's process.
- a literal value in a field whose name says it is a secret is refused at spec load (`literal_secrets`). Nested keys
  have only their name to go by; a provider's own fields declare `secret()` (resources/fields.py), and
  tests/resources/test_fields.py holds the declaration and these names in agreement.
"""

from __future__ import annotations

import os
import re
from typing import Any

import dagster as dg

# Field names that hold credentials, judged by their last word(s) so that `hf_token`, `api_key` and `Authorization`
# are secrets while `max_tokens`, `tokens_per_minute` or `max_tokens_param` are not. Matched at every depth.
SECRET_LAST_WORDS = {"token", "password", "passwd", "pwd", "secret", "authorization", "credential", "credentials",
                     "bearer", "apikey", "passphrase"}
SECRET_LAST_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"), ("auth", "key"),
                     ("session", "key"), ("account", "key"), ("sas", "key"), ("signing", "key")}


class SecretError(ValueError):
    """A secret is missing from the environment, or written literally where only a reference may be."""


def is_env_ref(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str)


def is_secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    if not words:
        return False
    return words[-1] in SECRET_LAST_WORDS or tuple(words[-2:]) in SECRET_LAST_PAIRS


def literal_secrets(config: Any, path: str = "model.config") -> list[str]:
    """Paths of secret-named fields holding a literal value (empty and null values are fine: no secret there)."""
    found: list[str] = []
    if isinstance(config, dict):
        for key, value in config.items():
            where = f"{path}.{key}"
            if is_env_ref(value):
                continue
            if is_secret_name(str(key)) and isinstance(value, str) and value.strip():
                found.append(where)
            else:
                found += literal_secrets(value, where)
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found += literal_secrets(value, f"{path}[{i}]")
    return found


def literal_secret_problem(paths: list[str]) -> str:
    return (
        f"{', '.join(paths)} hold{'s' if len(paths) == 1 else ''} a literal secret, which would be stored in the run "
        "history and shown in the UI: write `{env: NAME}` instead and export NAME where the pipeline runs"
    )


def resource_config(config: dict[str, Any]) -> dict[str, Any]:
    """A provider's constructor arguments from a spec's model.config: top-level references become dg.EnvVar;
    nested ones stay markers for `resolve_env_refs` at load time."""
    return {key: dg.EnvVar(value["env"]) if is_env_ref(value) else value for key, value in config.items()}


def resolve_env_refs(value: Any, path: str = "model.config") -> Any:
    """`value` with every `{env: NAME}` (at any depth) replaced by the variable's value. Call it inside the run
    (provider load), never at definition load: the value must not reach anything Dagster stores."""
    if is_env_ref(value):
        name = value["env"]
        if name not in os.environ:
            raise SecretError(
                f"{path} refers to environment variable {name}, which is not set where this step runs: export it "
                "(or set it in the deployment's secret store) and run again"
            )
        return os.environ[name]
    if isinstance(value, dict):
        return {k: resolve_env_refs(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env_refs(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def env_secret_values(config: Any) -> list[str]:
    """The current values of every variable a config refers to: what must never appear in output."""
    if is_env_ref(config):
        value = os.environ.get(config["env"])
        return [value] if value else []
    if isinstance(config, dict):
        return [v for item in config.values() for v in env_secret_values(item)]
    if isinstance(config, list):
        return [v for item in config for v in env_secret_values(item)]
    return []


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with each secret value (4+ characters, so we do not mangle ordinary words) replaced."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text
