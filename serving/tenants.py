"""Tenants: API keys by tenant, each with its priority ceiling and its rates, checked by every front.

The keys file (tenants.keys_file; in Kubernetes a mounted Secret) is TOML:

    [[tenant]]
    name = "search"               # letters, digits and ._- (at most 64): log lines, spans and metrics name it
    keys = ["sk-search-1"]        # its API keys; a key belongs to one tenant only
    max_priority = "query"        # "query" (default): both classes; "ingestion": ingestion only
    requests_per_s = 50           # 0 or absent: unlimited
    texts_per_s = 2000            # 0 or absent: unlimited

A request names its tenant by `authorization: Bearer <key>` (gRPC: that metadata or Triton's
`triton-grpc-protocol-authorization`). The key's SHA-256 is looked up, so the time taken does not depend on
how much of a key matches (constant time). The file is checked for a change at most every tenants.reload_s and read
again when it changed (no restart); a new file that does not parse, or says something wrong, is logged and the
old one kept. With BERT_TRITON_API_KEY set too, that key is tenant "default", unlimited (what the probes and
the fronts' own calls send). Rates hold across every front of the server (tenant_limits.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

from common.contract import QUERY_LANE_SUFFIX
from protocol.api_key import api_key
from serving.tenant_limits import COUNTS, FRONTS, NAME_BYTES, UNKNOWN, SharedBuckets, shm_path
from settings import Deployment
from settings.schema import PRIORITY_CLASSES

log = logging.getLogger("tenants")
ENV_TENANT = "default"  # BERT_TRITON_API_KEY's, with a keys file
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{NAME_BYTES}}}")
_FIELDS = {"name", "keys", "max_priority", "requests_per_s", "texts_per_s"}


class KeysError(ValueError):
    """What is wrong with a keys file, naming the tenant and the field."""


@dataclass(frozen=True)
class Tenant:
    name: str
    keys: tuple[str, ...]
    max_priority: str = "query"
    requests_per_s: float = 0.0
    texts_per_s: float = 0.0


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(text: str, source: str = "the keys file") -> list[Tenant]:
    """The tenants of a keys file's text; KeysError naming the tenant and field at fault."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeysError(f"{source} is not TOML: {exc}") from None
    if set(raw) - {"tenant"}:
        raise KeysError(f"{source}: only [[tenant]] tables belong here, not {sorted(set(raw) - {'tenant'})}")
    tables = raw.get("tenant", [])
    if not isinstance(tables, list) or not tables:
        raise KeysError(f"{source} names no tenant: add [[tenant]] tables with name and keys")
    tenants, owners = [], {}
    for position, table in enumerate(tables):
        name = table.get("name")
        where = f"{source}: tenant {name!r}" if isinstance(name, str) else f"{source}: tenant #{position + 1}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise KeysError(f"{where}: name must be 1-{NAME_BYTES} letters, digits or ._-")
        if name == ENV_TENANT:
            raise KeysError(f"{where}: the name {ENV_TENANT!r} is BERT_TRITON_API_KEY's; pick another")
        if name in {tenant.name for tenant in tenants}:
            raise KeysError(f"{where}: a second tenant of that name")
        if set(table) - _FIELDS:
            raise KeysError(f"{where}: unknown field(s) {sorted(set(table) - _FIELDS)}; known: {sorted(_FIELDS)}")
        keys = table.get("keys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k.strip() == k and k for k in keys):
            raise KeysError(f"{where}: keys must be a non-empty list of non-empty strings without spaces around")
        for key in keys:
            if key in owners:
                raise KeysError(f"{where}: one of its keys belongs to tenant {owners[key]!r} too")
            owners[key] = name
        ceiling = table.get("max_priority", "query")
        if ceiling not in PRIORITY_CLASSES:
            raise KeysError(f"{where}: max_priority must be one of {', '.join(PRIORITY_CLASSES)}, not {ceiling!r}")
        rates = {}
        for field in ("requests_per_s", "texts_per_s"):
            value = table.get(field, 0)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise KeysError(f"{where}: {field} must be a number >= 0 (0: unlimited), not {value!r}")
            rates[field] = float(value)
        tenants.append(Tenant(name, tuple(keys), ceiling, **rates))
    return tenants


def read_keys(path: str | Path) -> list[Tenant]:
    """The tenants of the keys file at `path`; KeysError saying what is wrong, unreadable included."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysError(f"tenants.keys_file {path} cannot be read: {exc}") from None
    return parse_keys(text, f"tenants.keys_file {path}")


class Tenants:
    """One front process's view of the keys file and the shared buckets; `front` is api, http or grpc."""

    def __init__(self, path: Path, reload_s: float, buckets: SharedBuckets, front: str, deployment: Deployment):
        self.path, self.reload_s, self.buckets, self.front = path, reload_s, buckets, front
        self.priority = deployment.priority
        self._signature: tuple | None = None
        self._error = ""
        self._checked = 0.0
        self._by_digest: dict[bytes, Tenant] = {}
        self._by_name: dict[str, Tenant] = {}
        self._load()
        if not self._by_name:
            raise KeysError(self._error)

    @classmethod
    def of(cls, deployment: Deployment, scope: int, front: str) -> Tenants | None:
        """The tenants of `deployment`'s keys file, their buckets those of the server whose gRPC port is
        `scope`; None without a keys file (BERT_TRITON_API_KEY alone then, protocol/api_key.py)."""
        settings = deployment.tenants
        if not settings.keys_file:
            return None
        return cls(Path(settings.keys_file), settings.reload_s, SharedBuckets(shm_path(scope)), front, deployment)

    def _load(self) -> None:
        try:
            stat = os.stat(self.path)
            signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if signature == self._signature:
                return
            self._signature = signature
            tenants = read_keys(self.path)
        except (OSError, KeysError) as exc:
            self._error = str(exc)
            if self._by_name:
                log.error(f"keys file not taken, the previous one stays: {exc}")
            return
        env = api_key()
        if env and env not in {key for tenant in tenants for key in tenant.keys}:
            tenants.append(Tenant(ENV_TENANT, (env,)))
        self._by_digest = {_digest(key): tenant for tenant in tenants for key in tenant.keys}
        self._by_name = {tenant.name: tenant for tenant in tenants}
        if self._checked:
            log.info(f"keys file {self.path} read again: {len(tenants)} tenants")

    def _reload_if_due(self) -> None:
        now = time.monotonic()
        if now - self._checked >= self.reload_s:
            self._load()
            self._checked = now

    def identify(self, authorization: str | None) -> Tenant | None:
        """The tenant whose key `authorization` (Bearer <key>) carries, or None (a 401 counted)."""
        self._reload_if_due()
        scheme, _, given = (authorization or "").partition(" ")
        tenant = self._by_digest.get(_digest(given.strip())) if scheme.lower() == "bearer" else None
        if tenant is None:
            self.buckets.count(UNKNOWN, self.front, "401")
            return None
        return tenant

    def admit(self, tenant: Tenant, requests: int = 1, texts: int = 0) -> float:
        """Take `requests` and `texts` from the tenant's rates: 0.0 when they pass, else the seconds to wait."""
        current = self._by_name.get(tenant.name, tenant)  # its rates as the file says now
        return self.buckets.charge(
            tenant.name, self.front, requests, current.requests_per_s, texts, current.texts_per_s
        )

    def named(self, name: str) -> Tenant | None:
        return self._by_name.get(name)

    def admit_texts(self, name: str, texts: int) -> float:
        """admit() for texts counted after the request passed (the API front's), by the tenant's name."""
        tenant = self._by_name.get(name)
        return self.admit(tenant, 0, texts) if tenant is not None and texts else 0.0

    def needs_shape(self, tenant: Tenant) -> bool:
        """Whether a KServe request of `tenant` must be read for its texts (kserve_shape)."""
        return tenant.texts_per_s > 0

    def priority_problem(self, tenant: Tenant, model: str, lane: str = "") -> str | None:
        """Why a KServe request to `model` is above its tenant's ceiling (a 403 counted), or None: a tenant
        capped at ingestion may not call a model's query lane (<model>-query), nor name a request to the model
        itself a query (the request's lane parameter)."""
        query = model.endswith(QUERY_LANE_SUFFIX) or lane == "query"
        if tenant.max_priority == "query" or not self.priority.enabled or not query:
            return None
        self.buckets.count(tenant.name, self.front, "403")
        if lane == "query":
            return f'tenant {tenant.name!r} may send ingestion only (max_priority), not queries: no lane = "query"'
        return (
            f"tenant {tenant.name!r} may send ingestion only (max_priority), not queries: call "
            f"{model.removesuffix(QUERY_LANE_SUFFIX)!r}, not its query lane {model!r}"
        )

    def prometheus(self) -> str:
        """Every front's requests and refusals per tenant, in Prometheus' text format."""
        requests = ["# HELP bert_tenant_requests_total Requests carrying a tenant's key, by front"]
        requests.append("# TYPE bert_tenant_requests_total counter")
        refused = ["# HELP bert_tenant_rejections_total Requests refused: 401 unknown key, 403 priority, 429 rate"]
        refused.append("# TYPE bert_tenant_rejections_total counter")
        for name, counts in sorted(self.buckets.counters().items()):
            for front in FRONTS:
                if name != UNKNOWN:
                    labels = f'tenant="{name}",front="{front}"'
                    requests.append(f"bert_tenant_requests_total{{{labels}}} {counts[front, 'requests']}")
                for status in COUNTS[1:]:
                    if counts[front, status]:
                        labels = f'tenant="{name}",front="{front}",code="{status}"'
                        refused.append(f"bert_tenant_rejections_total{{{labels}}} {counts[front, status]}")
        return "\n".join(requests + refused) + "\n"
