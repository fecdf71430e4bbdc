"""Credentials never printed: URIs and config values with secrets in them, as any message, param, tag or report
shows them.

    redact_text("MLflow at https://ann:s3cr3t@mlflow:5000 failed")   # 'MLflow at https://ann:***@mlflow:5000 failed'
    redact_config({"tracking": {"uri": "https://ann:s3cr3t@mlflow"}, "hf_token": "hf_x"})
    # {'tracking': {'uri': 'https://ann:***@mlflow'}, 'hf_token': '***'}

What is hidden: the password of a URI's user info (``user:***@``; a user info without password, often a token,
becomes ``***@``), the value of query parameters named like a secret (``?token=***``, S3 presigned
``X-Amz-Signature=***``), and every value under a key named like a secret (``password``, ``secret``, ``token``,
``access_key``, ``secret_key``, ``api_key``, ``credentials``, as a whole ``_``-separated word at the end of the
key: ``hf_token`` is one, ``max_total_tokens`` is not). Only for display: the run itself uses the real values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/\s?#]*)@")  # up to the authority's last @
_QUERY = re.compile(
    r"(?P<name>[?&][^=&\s#]*(?:password|passwd|secret|token|signature|credential|sig|key)[^=&\s#]*=)[^&\s#]+",
    re.IGNORECASE,
)
_SECRET_KEY = re.compile(
    r"(?:^|[._-])(?:password|passwd|secret|secret_key|secret_access_key|access_key|access_key_id|api_key|apikey|"
    r"token|auth_token|session_token|credentials?|private_key)$",
    re.IGNORECASE,
)


def _userinfo(m: re.Match[str]) -> str:
    user, colon, _ = m.group("info").partition(":")
    return f"{m.group('scheme')}{user}:{MASK}@" if colon else f"{m.group('scheme')}{MASK}@"


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***`` (see the module doc)."""
    if "://" not in text and "=" not in text:
        return text
    return _QUERY.sub(lambda m: m.group("name") + MASK, _USERINFO.sub(_userinfo, text))


def is_secret_key(key: str) -> bool:
    """Whether a config key (dotted or not) names a secret: its value is never shown."""
    return bool(_SECRET_KEY.search(str(key)))


def redact_value(key: str, value: Any) -> Any:
    """What to show of ``value`` under ``key``: ``***`` for a secret key, redacted text for a string, else itself."""
    if is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return redact_config(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(key, v) for v in value)
    return value


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a (nested or flat) config dict with every secret hidden, for params, files and reports."""
    return {k: redact_value(k, v) for k, v in config.items()}
