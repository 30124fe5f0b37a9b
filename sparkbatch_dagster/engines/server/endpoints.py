"""What an OpenAI-compatible server serves, asked before the first request: ``/v1/models`` on
one endpoint or on each of several, the check that they all serve one and the same model, and
the model identity rows record for it. Blocking and light (urllib): the resource calls it
outside a run too (the CLI's status, a code version)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError, EngineError
from ...spec import fingerprint

log = logging.getLogger("sparkbatch")


def root_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")  # ".../v1" is a common way to write the same server


def configured_urls(server_url: str | None, server_urls: list[str]) -> list[str]:
    """The servers a resource names (``server_url`` or ``server_urls``), each once."""
    if server_url and server_urls:
        raise ConfigError("VLLMResource sets both server_url and server_urls: set server_urls only (a list of "
                          "one is one server)")
    urls = [server_url] if server_url else list(server_urls)
    twice = sorted({u for u in urls if [root_url(v) for v in urls].count(root_url(u)) > 1})
    if twice:
        raise ConfigError(f"VLLMResource.server_urls lists {twice} more than once: list each server once "
                          "(max_in_flight is per server)")
    return urls


def message(text: str) -> str:
    """The error message of an OpenAI-style error body, else the body itself (shortened)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        data = json.loads(text)
        err = data.get("error")
        text = str((err.get("message") if isinstance(err, dict) else err) or data.get("message") or text)
    return text[:300]


def key_error(url: str, status: int) -> ConfigError:
    return ConfigError(f"server at {url} refused the request (HTTP {status}): the API key is missing or wrong: "
                       "set VLLMResource.api_key to the server's key, read from the environment: "
                       'api_key=EnvVar("MY_KEY") (Python) or {{ env.MY_KEY }} (YAML)')


def served_models(base_url: str, api_key: str | None, timeout_s: float = 10.0) -> list[dict]:
    """``/v1/models``' entries (``id``; from vLLM also ``root``, ``max_model_len``). Blocking: a preflight."""
    import urllib.error
    import urllib.request

    url = root_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    req = urllib.request.Request(url + "/v1/models", headers=headers)  # noqa: S310 - the configured server
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310
            body = r.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise key_error(url, exc.code) from None
        if exc.code == 404:
            raise ConfigError(f"server at {url} has no /v1/models (HTTP 404): set VLLMResource.server_url to "
                              "the root URL of an OpenAI-compatible server (vllm serve)") from None
        raise EngineError(f"server at {url} answered HTTP {exc.code} to /v1/models: "
                          f"{message(exc.read().decode(errors='replace'))}") from None
    except OSError as exc:  # refused, reset, DNS, timeout
        raise EngineError(f"server at {url} unreachable: {exc}: check VLLMResource.server_url(s)") from None
    try:
        return list(json.loads(body)["data"])
    except (ValueError, KeyError, TypeError):
        raise EngineError(f"server at {url} answered /v1/models with no model list: {body[:200]!r}") from None


def entry_of(models: list[dict], url: str, model: str) -> dict:
    for entry in models:
        if entry.get("id") == model:
            return entry
    raise ConfigError(f"server at {root_url(url)} serves {[m.get('id') for m in models]}, not model={model!r}: "
                      "set VLLMResource.model to one of them")


def check_served(base_url: str, model: str, api_key: str | None) -> dict:
    """The ``/v1/models`` entry of ``model``, or a ConfigError listing what the server serves."""
    return entry_of(served_models(base_url, api_key), base_url, model)


def served_identity(entry: dict) -> str:
    """The model identity rows record for a server's model: its name and what it was loaded from."""
    return f"{entry['id']}@{fingerprint([entry.get('root'), entry.get('max_model_len')])[:12]}"


def _loaded(entry: dict) -> str:
    return f"root={entry.get('root')!r}, max_model_len={entry.get('max_model_len')}"


def check_endpoints(urls: Sequence[str], model: str, api_key: str | None) -> tuple[dict, set[str], list[str]]:
    """Every endpoint's ``/v1/models``, checked to serve ``model`` as one and the same model.

    Returns the model's entry, the names it answers under (vLLM answers with the first served
    name of a model, whichever was asked for) and the endpoints that answered. A wrong key, a
    model an endpoint does not serve, or two endpoints serving it from different weights or
    context lengths is a ConfigError naming the endpoint. With several endpoints, one that does
    not answer is left out of the run (logged); none answering is an EngineError.
    """
    found: dict[str, list[dict]] = {}
    entry: dict[str, Any] | None = None
    first, down = "", []
    for url in dict.fromkeys(root_url(u) for u in urls):
        try:
            models = served_models(url, api_key)
        except EngineError as exc:
            if len(urls) == 1:
                raise
            down.append(str(exc))
            continue
        mine = entry_of(models, url, model)
        if entry is None:
            entry, first = mine, url
        elif _loaded(mine) != _loaded(entry):
            raise ConfigError(f"server at {url} serves {model!r} with {_loaded(mine)}, but server at {first} with "
                              f"{_loaded(entry)}: every server in server_urls must serve the same model")
        found[url] = models
    if entry is None:
        raise EngineError(f"none of the {len(down)} servers in server_urls answers: {'; '.join(down)}")
    for reason in down:
        log.warning("%s: left out of this run, the other %d server(s) answer", reason, len(found))
    root = entry.get("root")
    names = {model} | {str(m["id"]) for ms in found.values() for m in ms if root and m.get("root") == root}
    return entry, names, list(found)


def unknown_model(url: str, model: str, api_key: str | None, text: str) -> ConfigError:
    """What a 404 for ``model`` means: the served models when the server lists them."""
    with contextlib.suppress(EngineError):  # /v1/models does not answer: say what we know
        check_served(url, model, api_key)  # raises, listing what it serves
    return ConfigError(f"server at {url} answered HTTP 404 for model={model!r} ({text}): "
                       "set VLLMResource.model to a model it serves")
