"""A failed talk with the Hugging Face hub as one plain sentence a user can act on: no network, an
unknown repository, a gated one without a token, a connection that dropped.

The exception may come from huggingface_hub, its HTTP client, urllib or the socket itself: its chain of
causes is read, so the sentence does not depend on which library raised it."""

import os
import socket
import urllib.error
from collections.abc import Iterator
from urllib.parse import urlparse

from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from app.errors import first_line

DEFAULT_HOST = "huggingface.co"
RESUMES = "the download resumes where it stopped"
# exception class names of HTTP clients (httpx, httpcore, http.client, urllib3 and their forks), by what they mean
_UNREACHABLE = {"ConnectError", "ConnectTimeout", "PoolTimeout", "NewConnectionError"}
_DROPPED = {"RemoteProtocolError", "ReadError", "ReadTimeout", "WriteError", "WriteTimeout", "IncompleteRead",
            "RemoteDisconnected", "ProtocolError", "ChunkedEncodingError"}


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what caused it, and so on."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def connection_problem(error: BaseException) -> str | None:
    """"no network", "dropped" or "unreachable" when `error` is a failed connection; None when it is not
    one (an answer from the server is not)."""
    found = set()
    for cause in causes(error):
        if isinstance(cause, HfHubHTTPError | urllib.error.HTTPError):
            return None
        names = {kind.__name__ for kind in type(cause).__mro__}
        if isinstance(cause, socket.gaierror):
            found.add("no network")
        elif names & _DROPPED or isinstance(cause, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
            found.add("dropped")
        elif names & _UNREACHABLE or isinstance(cause, ConnectionRefusedError | TimeoutError):
            found.add("unreachable")
    return next((problem for problem in ("no network", "dropped", "unreachable") if problem in found), None)


def host_of(endpoint: str | None) -> str:
    return urlparse(endpoint).netloc if endpoint else DEFAULT_HOST


def lookup_failure(error: BaseException, repo_id: str, revision: str, endpoint: str | None = None) -> str:
    """Why listing `repo_id` at `revision` failed, in one sentence."""
    host = host_of(endpoint)
    if isinstance(error, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set, so the hub is not asked: unset it to look models up and download them."
    if isinstance(error, GatedRepoError):
        if os.environ.get("HF_TOKEN"):
            return (f"'{repo_id}' is gated and the token in HF_TOKEN has no access to it yet: accept its terms "
                    f"on its page at {host}, then Retry.")
        return (f"'{repo_id}' is gated: accept its terms on its page at {host}, set HF_TOKEN to a token of that "
                "account, then Retry.")
    if isinstance(error, RepositoryNotFoundError):
        return f"The hub has no model '{repo_id}': check its name (a private model also needs HF_TOKEN)."
    if isinstance(error, RevisionNotFoundError):
        return f"'{repo_id}' has no revision '{revision}'."
    problem = connection_problem(error)
    if problem is not None:
        return _connection_sentence(problem, host, f"looking up '{repo_id}'", "Retry")
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return f"The hub answered {error.response.status_code} when asked for '{repo_id}': Retry later."
    return f"Looking up '{repo_id}' failed: {first_line(error)}"


def download_failure(error: BaseException | None, path: str, endpoint: str | None = None) -> str:
    """Why fetching the file `path` stopped, in one sentence; None: the server ended the file early."""
    host = host_of(endpoint)
    problem = "dropped" if error is None else connection_problem(error)
    if problem is not None:
        return _connection_sentence(problem, host, f"downloading {path}", f"Retry: {RESUMES}")
    if isinstance(error, urllib.error.HTTPError):
        return f"The hub answered {error.code} for {path}: Retry later, {RESUMES}."
    return f"Downloading {path} failed: {first_line(error)}. Retry: {RESUMES}."


def _connection_sentence(problem: str, host: str, doing: str, retry: str) -> str:
    if problem == "no network":
        return f"No network: {host} cannot be found. Check the connection, then {retry}."
    if problem == "dropped":
        return f"The connection to {host} dropped while {doing}: {retry}."
    return f"Cannot connect to {host}: the network or the hub is down. Check the connection, then {retry}."
