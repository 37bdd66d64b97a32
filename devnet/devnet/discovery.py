"""The development facilitator's bazaar: the resources it has settled a payment for.

x402's facilitators catalog a resource from its first settled payment that declares the
`bazaar` discovery extension (the paying client copies the 402's `extensions` into the payment
payload), and list the catalog at ``GET /discovery/resources``. This does the same with the
x402 package's own facilitator-side code (`extract_discovery_info`, which validates the
declaration against its schema), in memory: the catalog lives as long as the process.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from x402.extensions.bazaar import BAZAAR, DiscoveryResource, extract_discovery_info

MAX_LIMIT = 100


class Catalog:
    """Discovered resources by URL, each as its latest settled payment described it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # settles are decided in worker threads
        self.resources: dict[str, DiscoveryResource] = {}

    def record(self, payload: Any, requirements: Any) -> None:
        """Catalog the resource a settled payment paid for, when its payload declares discovery."""
        try:
            found = extract_discovery_info(payload, requirements)
        except Exception:  # noqa: BLE001 -- an undiscoverable payment is simply not listed
            return
        if found is None:
            return
        declared = (found.extensions or {}).get(BAZAAR.key)
        resource = DiscoveryResource(
            resource=found.resource_url,
            type="http",
            x402_version=found.x402_version,
            accepts=[requirements.model_dump(mode="json", by_alias=True, exclude_none=True)],
            last_updated=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            description=found.description,
            mime_type=found.mime_type,
            extensions={BAZAAR.key: declared} if declared is not None else None,
        )
        with self.lock:
            self.resources[found.resource_url] = resource

    def page(self, kind: str | None, limit: int, offset: int) -> dict[str, Any]:
        with self.lock:
            listed = [r for r in self.resources.values() if kind is None or r.type == kind]
        items = [r.to_dict() for r in listed[offset : offset + limit]]
        return {
            "x402Version": 2,
            "items": items,
            "pagination": {"limit": limit, "offset": offset, "total": len(listed)},
        }


def _count(value: str | None, default: int, highest: int) -> int | None:
    if value is None:
        return default
    if not value.isdigit():
        return None
    return min(int(value), highest)


async def discovery_resources(request: Request) -> Response:
    """``GET /discovery/resources?type=&limit=&offset=``: the catalog, a page at a time."""
    limit = _count(request.query_params.get("limit"), MAX_LIMIT, MAX_LIMIT)
    offset = _count(request.query_params.get("offset"), 0, 10**9)
    if limit is None or offset is None:
        return JSONResponse({"error": "invalid_request", "detail": "limit and offset are whole numbers"}, 400)
    catalog: Catalog = request.app.state.discovery
    return JSONResponse(catalog.page(request.query_params.get("type"), limit, offset))
