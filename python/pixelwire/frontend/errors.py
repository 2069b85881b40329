"""The frontend's own answers to a client: OpenAI's error JSON."""

from __future__ import annotations

from aiohttp import web


class OpenAIError(Exception):
    """An error answered in OpenAI's error JSON."""

    def __init__(self, status: int, message: str, *, param: str | None = None, close: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = _KINDS.get(status, "InternalServerError")
        self.param = param
        # The answer closes the connection (what the client sent is not
        # read to its end).
        self.close = close

    def response(self) -> web.Response:
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }
        headers = {"Retry-After": "1"} if self.status == 503 else None
        response = web.json_response(body, status=self.status, headers=headers)
        if self.close:
            response.force_close()
        return response


_KINDS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
