"""The id of a request to either front: its X-Request-Id when that is a plain token (letters, digits and
`._:-`, at most 128 characters), else one made here (32 hex digits), so that a bad one is never echoed or
logged. Both fronts echo it in the response and put it in their log lines about the request."""

from __future__ import annotations

import re
import uuid

REQUEST_ID = "X-Request-Id"
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(given: str | None) -> str:
    """The caller's id if it is a plain token, else a new one."""
    return given if given is not None and _PLAIN_ID.fullmatch(given) else uuid.uuid4().hex
