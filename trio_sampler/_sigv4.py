"""AWS Signature Version 4 for Amazon Bedrock, through ``botocore`` (the ``bedrock`` extra).

One function, :func:`sign`: a request's method, URL, headers and body in, the headers that
make AWS accept it out (``Authorization``, ``X-Amz-Date``, and ``X-Amz-Security-Token``
with temporary credentials). The client calls it once per request, where the request's
headers are final (``SamplingClient._build`` in ``client.py``): a signature covers the
time and the body, so it is never cached.

Credentials come from botocore's default chain (the ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` variables, the shared files, an
instance or container role), resolved once per process and refreshed by botocore when
they expire. The region is read from the Bedrock host
(``bedrock-runtime.<region>.amazonaws.com``), else from botocore's configuration; the
service is ``bedrock``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = ["SERVICE", "require_botocore", "secrets", "sign"]

#: The SigV4 service name of Bedrock's runtime endpoints.
SERVICE = "bedrock"

_HOST_REGION = re.compile(r"^bedrock[a-z-]*\.([a-z0-9-]+)\.(?:amazonaws\.com|api\.aws)$")
_INSTALL = "SigV4 signing needs botocore: pip install 'trio-sampler[bedrock]'"


def require_botocore() -> None:
    """Raise :class:`ValueError` with the install command when botocore is missing."""
    try:
        import botocore.auth  # noqa: F401
    except ImportError:
        raise ValueError(_INSTALL) from None


def sign(
    method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes
) -> list[tuple[str, str]]:
    """The headers to add so AWS accepts this request (see the module)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    credentials = _credentials()
    if credentials is None:
        raise ValueError(
            "no AWS credentials for SigV4: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or a profile or role), or use the bedrock provider with a Bedrock API key"
        )
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    SigV4Auth(credentials.get_frozen_credentials(), SERVICE, _region(url)).add_auth(request)
    added = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")
    return [(name, request.headers[name]) for name in added if name in request.headers]


def secrets() -> list[tuple[str, str]]:
    """``(label, value)`` of the credentials a signed request depends on that must never
    be shown: the session token (sent as ``X-Amz-Security-Token``) and the secret key
    (never sent, but no string should hold it). Empty without botocore or credentials;
    the current values, so a refreshed token is scrubbed too."""
    try:
        credentials = _credentials()
    except ImportError:
        return []
    if credentials is None:
        return []
    frozen = credentials.get_frozen_credentials()
    found = [("x-amz-security-token", frozen.token), ("aws_secret_access_key", frozen.secret_key)]
    return [(label, value) for label, value in found if value]


@functools.lru_cache(maxsize=1)
def _session() -> Any:
    from botocore.session import get_session

    return get_session()


def _credentials() -> Any:
    return _session().get_credentials()


def _region(url: str) -> str:
    found = _HOST_REGION.match(urlsplit(url).hostname or "")
    if found is not None:
        return found[1]
    region = _session().get_config_variable("region")
    if not region:
        raise ValueError(
            f"no AWS region for SigV4: {url!r} is not a regional Bedrock address; "
            "set AWS_REGION (or AWS_DEFAULT_REGION)"
        )
    return str(region)
