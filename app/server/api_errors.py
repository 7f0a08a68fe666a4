"""Errors in the OpenAI API's shape: {"error": {"message", "type", "param", "code"}}."""

from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", headers: dict | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers, self.param = status, message, kind, headers, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param), status_code=self.status,
                            headers=self.headers)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
