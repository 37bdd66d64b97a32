"""The two A2A protocol dialects served on one endpoint.

Inside the server every Message, Task and event has the A2A v0.3 JSON shape
(``kind`` fields, kebab-case states). A v1.0 request is converted on the way in and
its answers on the way out, dict to dict: no protobuf round trip on the hot path.
"""

from __future__ import annotations

from typing import Any

V03 = "0.3"
V10 = "1.0"

# method name -> (dialect, operation)
METHODS: dict[str, tuple[str, str]] = {
    "message/send": (V03, "send"),
    "message/stream": (V03, "stream"),
    "tasks/get": (V03, "get"),
    "tasks/cancel": (V03, "cancel"),
    "tasks/resubscribe": (V03, "subscribe"),
    "agent/getAuthenticatedExtendedCard": (V03, "unsupported"),
    "tasks/pushNotificationConfig/set": (V03, "push"),
    "tasks/pushNotificationConfig/get": (V03, "push"),
    "tasks/pushNotificationConfig/list": (V03, "push"),
    "tasks/pushNotificationConfig/delete": (V03, "push"),
    "SendMessage": (V10, "send"),
    "SendStreamingMessage": (V10, "stream"),
    "GetTask": (V10, "get"),
    "CancelTask": (V10, "cancel"),
    "ListTasks": (V10, "list"),
    "SubscribeToTask": (V10, "subscribe"),
    "GetExtendedAgentCard": (V10, "unsupported"),
    "CreateTaskPushNotificationConfig": (V10, "push"),
    "GetTaskPushNotificationConfig": (V10, "push"),
    "ListTaskPushNotificationConfigs": (V10, "push"),
    "DeleteTaskPushNotificationConfig": (V10, "push"),
}

TERMINAL_STATES = frozenset({"completed", "failed", "canceled", "rejected"})
INTERRUPTED_STATES = frozenset({"input-required", "auth-required"})
STATES_V03 = ("submitted", "working", "input-required", "auth-required", "completed", "failed", "canceled", "rejected")
_STATE_TO_V10 = {s: "TASK_STATE_" + s.upper().replace("-", "_") for s in STATES_V03}
_STATE_FROM_V10 = {v: k for k, v in _STATE_TO_V10.items()}
_ROLE_TO_V10 = {"user": "ROLE_USER", "agent": "ROLE_AGENT"}
_ROLE_FROM_V10 = {v: k for k, v in _ROLE_TO_V10.items()}


class InvalidShape(ValueError):
    """A request object that cannot be read; becomes JSON-RPC -32602 with this text."""


# --- inbound -----------------------------------------------------------------

_OPAQUE = frozenset({"metadata", "data"})  # protobuf Structs: the client's own keys, never renamed


def proto_json_names(value: Any) -> Any:
    """v1.0 params with protobuf field names (`history_length`) also read as their JSON
    names (`historyLength`): a ProtoJSON parser accepts both, as the a2a-sdk server does.
    The JSON name wins when both are sent; Struct contents are left alone."""
    if isinstance(value, list):
        return [proto_json_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _camel(key) if "_" in key else key
        if name != key and name in value:
            continue  # the JSON name was sent too
        out[name] = item if key in _OPAQUE else proto_json_names(item)
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def message_in(raw: Any, dialect: str) -> dict[str, Any]:
    """Read a request's message into the canonical shape, keeping only usable parts."""
    if not isinstance(raw, dict):
        raise InvalidShape("params.message must be an object")
    parts_raw = raw.get("parts")
    if not isinstance(parts_raw, list):
        raise InvalidShape("params.message.parts must be a list")
    read = part_in_v10 if dialect == V10 else part_in_v03
    parts = [p for p in (read(item) for item in parts_raw) if p is not None]
    if not parts:
        raise InvalidShape("params.message has no usable parts (text, data or file)")
    if raw.get("messageId") is None:
        raise InvalidShape("params.message.messageId is required")
    message: dict[str, Any] = {"kind": "message", "role": "user", "parts": parts}
    for key in ("messageId", "contextId", "taskId"):
        value = raw.get(key)
        if value is not None:
            if not isinstance(value, str) or not value or len(value) > 256 or "\x00" in value:
                raise InvalidShape(f"params.message.{key} must be a non-empty string (no NUL)")
            message[key] = value
    metadata = raw.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise InvalidShape("params.message.metadata must be an object")
        message["metadata"] = metadata
    refs = raw.get("referenceTaskIds")
    if isinstance(refs, list) and all(isinstance(r, str) for r in refs):
        message["referenceTaskIds"] = refs
    extensions = raw.get("extensions")
    if isinstance(extensions, list) and all(isinstance(e, str) for e in extensions):
        message["extensions"] = extensions
    role = raw.get("role")  # any JSON value: an object or a list cannot be looked up (unhashable)
    if dialect == V03 and not (isinstance(role, str) and role in _ROLE_TO_V10):  # v0.3 section 6.4: required
        raise InvalidShape("params.message.role is required: 'user' or 'agent'")
    return message


def part_in_v03(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    kind = raw.get("kind", "text" if "text" in raw else None)
    part: dict[str, Any] | None = None
    if kind == "text" and isinstance(raw.get("text"), str) and raw["text"]:
        part = {"kind": "text", "text": raw["text"]}
    elif kind == "data" and "data" in raw and raw["data"] is not None:
        part = {"kind": "data", "data": raw["data"]}
    elif kind == "file" and isinstance(raw.get("file"), dict):
        file = _file_in(
            raw["file"].get("uri"), raw["file"].get("bytes"), raw["file"].get("mimeType"), raw["file"].get("name")
        )
        part = None if file is None else {"kind": "file", "file": file}
    if part is not None and isinstance(raw.get("metadata"), dict):
        part["metadata"] = raw["metadata"]
    return part


def part_in_v10(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    part: dict[str, Any] | None = None
    if isinstance(raw.get("text"), str) and raw["text"]:
        part = {"kind": "text", "text": raw["text"]}
    elif "data" in raw and raw["data"] is not None:
        part = {"kind": "data", "data": raw["data"]}
    elif "url" in raw or "raw" in raw:
        file = _file_in(raw.get("url"), raw.get("raw"), raw.get("mediaType"), raw.get("filename"))
        part = None if file is None else {"kind": "file", "file": file}
    if part is not None and isinstance(raw.get("metadata"), dict):
        part["metadata"] = raw["metadata"]
    return part


def _file_in(uri: Any, data: Any, media_type: Any, name: Any) -> dict[str, Any] | None:
    file: dict[str, Any] = {}
    if isinstance(uri, str) and uri:
        file["uri"] = uri
    elif isinstance(data, str) and data:
        file["bytes"] = data
    else:
        return None
    if isinstance(media_type, str):
        file["mimeType"] = media_type
    if isinstance(name, str):
        file["name"] = name
    return file


def state_in(raw: Any, dialect: str) -> str | None:
    """A task state filter (`TASK_STATE_*` in v1.0, kebab-case in v0.3); None when absent."""
    if raw is None or raw == "" or raw == "TASK_STATE_UNSPECIFIED":
        return None
    state = _STATE_FROM_V10.get(raw) if dialect == V10 else (raw if raw in _STATE_TO_V10 else None)
    if state is None:
        raise InvalidShape(f"status must be one of {', '.join(_STATE_FROM_V10 if dialect == V10 else STATES_V03)}")
    return state


def history_length(raw: Any) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise InvalidShape("historyLength must be a non-negative integer")
    return raw


# --- outbound ----------------------------------------------------------------


def task_out(task: dict[str, Any], dialect: str) -> dict[str, Any]:
    if dialect == V03:
        return task
    out: dict[str, Any] = {"id": task["id"], "contextId": task["contextId"], "status": status_out_v10(task["status"])}
    if task.get("artifacts"):
        out["artifacts"] = [artifact_out_v10(a) for a in task["artifacts"]]
    if task.get("history"):
        out["history"] = [message_out_v10(m) for m in task["history"]]
    if task.get("metadata"):
        out["metadata"] = task["metadata"]
    return out


def send_result(obj: dict[str, Any], dialect: str) -> dict[str, Any]:
    """The result of a send: v0.3 returns the object; v1.0 wraps it by kind."""
    if dialect == V03:
        return obj
    if obj.get("kind") == "message":
        return {"message": message_out_v10(obj)}
    return {"task": task_out(obj, dialect)}


def event_out(event: dict[str, Any], dialect: str) -> dict[str, Any]:
    """One stream event; v1.0 wraps each in a StreamResponse."""
    if dialect == V03:
        return event
    kind = event.get("kind")
    if kind == "status-update":
        body = {"taskId": event["taskId"], "contextId": event["contextId"], "status": status_out_v10(event["status"])}
        if event.get("metadata"):
            body["metadata"] = event["metadata"]
        return {"statusUpdate": body}
    if kind == "artifact-update":
        body = {
            "taskId": event["taskId"],
            "contextId": event["contextId"],
            "artifact": artifact_out_v10(event["artifact"]),
        }
        for key in ("append", "lastChunk"):
            if key in event:
                body[key] = event[key]
        return {"artifactUpdate": body}
    return send_result(event, dialect)


def status_out_v10(status: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state": _STATE_TO_V10.get(status["state"], "TASK_STATE_UNSPECIFIED")}
    if status.get("message"):
        out["message"] = message_out_v10(status["message"])
    if status.get("timestamp"):
        out["timestamp"] = status["timestamp"]
    return out


def message_out_v10(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k not in ("kind", "role", "parts")}
    out["role"] = _ROLE_TO_V10.get(message.get("role", "agent"), "ROLE_AGENT")
    out["parts"] = [part_out_v10(p) for p in message.get("parts", [])]
    return out


def artifact_out_v10(artifact: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in artifact.items() if k != "parts"}
    out["parts"] = [part_out_v10(p) for p in artifact.get("parts", [])]
    return out


def part_out_v10(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("kind")
    out: dict[str, Any]
    if kind == "data":
        out = {"data": part["data"]}
    elif kind == "file":
        file = part["file"]
        out = {"url": file["uri"]} if "uri" in file else {"raw": file.get("bytes", "")}
        if "mimeType" in file:
            out["mediaType"] = file["mimeType"]
        if "name" in file:
            out["filename"] = file["name"]
    else:
        out = {"text": part.get("text", "")}
    if part.get("metadata"):
        out["metadata"] = part["metadata"]
    return out


# --- reading another server's answers (upstream agents) -----------------------


def state_from_any(value: Any) -> str | None:
    """A task state in either dialect, or None when it is neither."""
    if isinstance(value, str):
        if value in _STATE_FROM_V10:
            return _STATE_FROM_V10[value]
        if value in _STATE_TO_V10:
            return value
    return None


def message_from_any(raw: Any) -> dict[str, Any] | None:
    """A Message from either dialect into the canonical shape, or None."""
    if not isinstance(raw, dict) or not isinstance(raw.get("parts"), list):
        return None
    v10 = raw.get("kind") != "message" and isinstance(raw.get("role"), str) and raw["role"].startswith("ROLE_")
    read = part_in_v10 if v10 else part_in_v03
    role = raw.get("role")
    role = _ROLE_FROM_V10.get(role, role) if isinstance(role, str) else "agent"
    message: dict[str, Any] = {"kind": "message", "role": role if role in ("user", "agent") else "agent"}
    message["parts"] = [p for p in (read(x) for x in raw["parts"]) if p is not None]
    for key in ("messageId", "contextId", "taskId"):
        if isinstance(raw.get(key), str):
            message[key] = raw[key]
    return message


def parts_from_any(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        return []
    parts = []
    for item in raw:
        part = part_in_v03(item) if isinstance(item, dict) and "kind" in item else part_in_v10(item)
        if part is not None:
            parts.append(part)
    return parts
