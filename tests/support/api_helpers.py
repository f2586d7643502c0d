"""Helpers for the REST API and command tests: authenticated requests and their error bodies."""

import json
from typing import Any

from django.test import Client


def headers_for(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def get(client: Client, path: str, token: str | None = None, **params: Any):
    return client.get(path, params, headers=headers_for(token))


def post(client: Client, path: str, body: Any = None, token: str | None = None):
    return client.post(path, json.dumps(body or {}), content_type="application/json", headers=headers_for(token))


def patch(client: Client, path: str, body: Any, token: str | None = None):
    return client.patch(path, json.dumps(body), content_type="application/json", headers=headers_for(token))


def delete(client: Client, path: str, token: str | None = None):
    return client.delete(path, headers=headers_for(token))


def error_of(response) -> tuple[int, str]:
    """The status and error code of an error response, checking its shape on the way."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"], body
    return response.status_code, body["error"]["code"]
