"""Typed errors. Front-ends map them to exit codes (CLI: 2) and HTTP statuses (server).

Every error carries a one-line, user-facing message; none of them should ever surface as a
traceback. This module knows nothing about how the errors are shown.
"""
from __future__ import annotations


class NinferError(Exception):
    """Base class: a problem the user can act on. `code` is a stable machine-readable tag."""

    code: str = "error"
    http_status: int = 400

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ModelNotFoundError(NinferError):
    code = "model_not_found"
    http_status = 404


class ModelFormatError(NinferError):
    """A model file exists but is corrupt, truncated or inconsistent with its config."""

    code = "model_format_error"
    http_status = 500


class UnsupportedModelError(NinferError):
    """The checkpoint's architecture / model_type / tensor format is not implemented."""

    code = "unsupported_model"
    http_status = 400


class InvalidRequestError(NinferError):
    """Bad request content: empty prompt, out-of-range sampling values, malformed messages."""

    code = "invalid_request_error"
    http_status = 400


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"
    http_status = 400


class DeviceError(NinferError):
    """The requested device is unavailable (no GPU, bad index, CUDA init failure)."""

    code = "device_error"
    http_status = 500


class EngineOverloadedError(NinferError):
    code = "overloaded"
    http_status = 429
