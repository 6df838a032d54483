"""The emulator's one error: a request the API rejects, rendered as that backend's error
body by the renderers."""

from __future__ import annotations

from ..types import TrioSamplerError

__all__ = ["ApiError"]


class ApiError(TrioSamplerError):
    """A request the API rejects: rendered as that backend's error body."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.error_type = error_type
        #: Seconds the client should wait before trying again (``retry-after`` headers).
        self.retry_after = retry_after
