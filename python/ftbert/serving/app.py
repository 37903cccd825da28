"""The ASGI app: routes, request schemas, errors. It holds no engine logic: every route turns its
request into a batcher job (`Service.run`) and formats the rows that come back.

    POST /v1/embeddings  OpenAI-compatible: input (a string, strings, token ids, lists of token ids),
                         encoding_format ("float" | "base64"), dimensions (truncate, renormalize)
    POST /v1/rerank      query + texts against a one-label cross-encoder: scores, best first, in
                         this server's shape ({object, model, results, usage}; /rerank's before the
                         TEI routes came)
    POST /classify       texts or (text, text) pairs through the sequence-classification head
    GET  /v1/models (OpenAI's model list: the one model), /health, /info, /metrics

HF text-embeddings-inference's routes, in its request and response shapes (tei.py), so that its
clients switch without code changes: POST /embed, /rerank, /predict, /tokenize, and POST /, which
dispatches by the model's task (embeddings without a head, /predict with a sequence head); and
POST /embed_sparse (SPLADE, a *ForMaskedLM checkpoint) and /embed_multivector (ColBERT, a
checkpoint with a token projection) in the same request shape.

Every error a client can cause answers JSON in OpenAI's shape,
`{"error": {"message": ..., "type": ..., "param": ...}}`, with its status: 400 (the model has no
such head), 404/405 (no such route or method), 413 (too many inputs, an input too long when the
server does not truncate, a body too large), 422 (malformed JSON, a wrong type or value; `param`
names the field), 429 (queue full, with Retry-After), 503 (shutting down). A forward that raises
fails the requests whose inputs were in it, type server_error: 503 with Retry-After when the device
ran out of memory (a later batch may fit), 500 for any other error; the server goes on.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import time
from typing import Any, Callable, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .batcher import (EMBED, IDS, PAIR, SCORE, TEXT, ForwardFailed, InputTooLong, Job, NonFiniteOutput, NoTokens,
                      QueueFull, ShuttingDown)
from .jsonrows import float_rows
from .service import Service
from .service import freeze_heap as _freeze_heap
from .settings import ServeSettings
from .tei import register_tei_routes

ROUTES = ("/v1/embeddings", "/v1/models", "/v1/rerank", "/classify", "/health", "/info", "/metrics",
          "/embed", "/rerank", "/predict", "/tokenize", "/embed_sparse", "/embed_multivector", "/")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type, param, headers


def _error_response(status: int, message: str, type: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": status}},
                        status_code=status, headers=headers)


# ---- request schemas ---------------------------------------------------------------------------
class _Request(BaseModel):
    # Fields a client may add that this server does not use (OpenAI's `user`, say) are ignored.
    model_config = ConfigDict(extra="ignore")


def _describe(x) -> str:
    return "null" if x is None else type(x).__name__


def _parse_embedding_input(value) -> tuple[str, list, bool]:
    """OpenAI's accepted shapes -> (TEXT, [str]) or (IDS, [[int]]), and whether the client sent a
    list of inputs (error messages index them as the client wrote them)."""
    if isinstance(value, str):
        return TEXT, [value], False
    if not isinstance(value, list):
        raise ValueError(f"must be a string, a list of strings, a list of token ids or a list of token-id lists; "
                         f"got {_describe(value)}")
    if not value:
        raise ValueError("is empty: give at least one input")
    first = value[0]
    if isinstance(first, str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise ValueError(f"[{i}] is {_describe(v)}; a list of strings must hold strings only")
        return TEXT, value, True
    if _is_int(first):
        _check_ids(value, "")
        return IDS, [value], False
    if isinstance(first, list):
        for i, v in enumerate(value):
            if not isinstance(v, list):
                raise ValueError(f"[{i}] is {_describe(v)}; a list of token-id lists must hold lists only")
            _check_ids(v, f"[{i}]")
        return IDS, value, True
    raise ValueError(f"[0] is {_describe(first)}; expected a string, a token id or a list of token ids")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_ids(ids: list, where: str) -> None:
    if not ids:
        raise ValueError(f"{where} is an empty token list")
    for j, t in enumerate(ids):
        if not _is_int(t):
            raise ValueError(f"{where}[{j}] is {_describe(t)}; token ids are integers")


class EmbeddingRequest(_Request):
    input: Any
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: StrictStr | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, v):
        return _parse_embedding_input(v)


class RerankRequest(_Request):
    query: StrictStr
    texts: list[StrictStr] = Field(min_length=1)
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_text: StrictBool = False
    raw_scores: StrictBool = False


def _parse_classify_input(value) -> tuple[str, list]:
    if isinstance(value, str):
        return TEXT, [value]
    if not isinstance(value, list):
        raise ValueError(f"must be a string, a list of strings or a list of [text, text] pairs; got {_describe(value)}")
    if not value:
        raise ValueError("is empty: give at least one input")
    if isinstance(value[0], str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise ValueError(f"[{i}] is {_describe(v)}; a list of strings must hold strings only")
        return TEXT, value
    pairs = []
    for i, v in enumerate(value):
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(t, str) for t in v)):
            raise ValueError(f"[{i}] is not a [text, text] pair of two strings")
        pairs.append((v[0], v[1]))
    return PAIR, pairs


class ClassifyRequest(_Request):
    input: Any
    raw_scores: StrictBool = False

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, v):
        return _parse_classify_input(v)


# ---- the app -----------------------------------------------------------------------------------
# Routes the _Guard middleware answers itself for a body their schema takes: path -> (schema, handler),
# the handler an `async (svc, state, body) -> Response` that the FastAPI route calls too; the schema
# a pydantic model, or a function of the service giving one (None: FastAPI answers this service's
# requests). Validation is the schema's own (pydantic, as FastAPI runs it); only FastAPI's routing,
# dependency solving and the layers around them are left out, which cost a front more CPU than the
# rest of a short request.
DIRECT_ROUTES: dict[str, tuple[type[BaseModel] | Callable, Callable]] = {}


def _direct_body(schema: type[BaseModel], body: bytes):
    """The body as `schema` validates it, or None where FastAPI must see it (not JSON, or refused by
    the schema: FastAPI words the error, so both ways answer alike)."""
    try:
        return schema.model_validate(json.loads(body))
    except (ValueError, UnicodeDecodeError):  # pydantic's ValidationError is a ValueError
        return None


def create_app(settings: ServeSettings | None = None, service: Service | None = None,
               close_service: bool = False, freeze_heap: bool = False) -> FastAPI:
    """The ASGI app. Without `service`, it loads one from `settings` at startup and closes it at
    shutdown, after uvicorn has finished the requests in flight: every accepted request is
    answered. With `service` (started already) it serves that one, and closes it at shutdown only
    when `close_service` is true. `freeze_heap`: the process is the server's own (ftbert serve,
    a front, a Ray replica): once the service is attached, service.freeze_heap() keeps the
    collector's full passes off everything loaded before."""
    if service is None and settings is None:
        settings = ServeSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        own = service is None or close_service
        svc = service if service is not None else await run_in_threadpool(Service.load, settings)
        app.state.service = svc
        await svc.attach()
        if freeze_heap:
            _freeze_heap()
        try:
            yield
        finally:
            await svc.detach()
            if own:
                await run_in_threadpool(svc.close)
                report = getattr(app.state, "on_closed", None)
                if report is not None:
                    report(svc)

    app = FastAPI(title="ftbert", lifespan=lifespan)
    if service is not None:
        app.state.service = service
    max_bytes = (service.settings if service is not None else settings).max_request_bytes
    app.add_middleware(_Guard, max_bytes=max_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return _error_response(e.status, e.message, e.type, e.param, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return _validation_response(e.errors())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        message = {404: f"no route {request.url.path}; routes: {', '.join(ROUTES)}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return _error_response(e.status_code, message, "invalid_request_error", None, getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        return _error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request):
        return await _embeddings(_service(request), request.state, body)

    @app.post("/v1/rerank")
    async def rerank(body: RerankRequest, request: Request):
        return await _rerank(_service(request), request.state, body)

    @app.post("/classify")
    async def classify(body: ClassifyRequest, request: Request):
        import torch

        svc = _service(request)
        if svc.head != "sequence_classification":
            raise ApiError(400, "/classify needs a sequence-classification head; the loaded model has "
                                f"{_head_words(svc)}", param=None)
        how, inputs = body.input
        _check_client_batch(svc, len(inputs), "input")
        request.state.inputs = len(inputs)
        res = await _run(svc, Job(SCORE, how, inputs), "input")
        logits = torch.from_numpy(res.values)  # [N, num_labels]
        if body.raw_scores:
            scores = logits
        elif svc.num_labels == 1:
            scores = torch.sigmoid(logits)
        else:
            scores = torch.softmax(logits, dim=-1)
        labels = svc.labels
        data = []
        for i, row in enumerate(scores.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            data.append({"index": i, "label": labels[best], "score": row[best],
                         "scores": [{"label": lab, "score": s} for lab, s in zip(labels, row)]})
        return JSONResponse({"object": "list", "model": svc.model_name, "data": data,
                             "usage": {"prompt_tokens": res.tokens, "total_tokens": res.tokens}})

    register_tei_routes(app)

    @app.get("/v1/models")
    async def models(request: Request):  # what OpenAI clients list before they pick a model
        svc = _service(request)
        return {"object": "list", "data": [{"id": svc.model_name, "object": "model", "created": int(svc.started),
                                            "owned_by": "ftbert"}]}

    @app.get("/health")
    async def health(request: Request):
        svc = getattr(request.app.state, "service", None)
        if svc is None or not await svc.healthy():
            return _error_response(503, "the server is starting or shutting down", "unavailable")
        return {"status": "ok"}

    @app.get("/info")
    async def info(request: Request):
        return _service(request).info()

    @app.get("/metrics")
    async def metrics(request: Request):
        svc = _service(request)
        return Response(await svc.metrics_text(), media_type=svc.metrics.content_type)

    return app


# ---- route helpers -----------------------------------------------------------------------------
def _service(request: Request) -> Service:
    svc = getattr(request.app.state, "service", None)
    if svc is None:
        raise ApiError(503, "the server is starting", "unavailable")
    return svc


def _head_words(svc: Service) -> str:
    if svc.head is None:
        return "no task head (an embedding model: use /v1/embeddings)"
    if svc.head == "sequence_classification":
        return f"a sequence-classification head with {svc.num_labels} labels"
    return f"a {svc.head} head"


def _check_client_batch(svc: Service, n: int, param: str) -> None:
    limit = svc.settings.max_client_batch
    if n > limit:
        raise ApiError(413, f"{param} holds {n} inputs, more than this server takes in one request ({limit})",
                       param=param)


def _check_vocab(svc: Service, inputs: list[list[int]], nested: bool) -> None:
    vocab = svc.vocab_size
    for i, ids in enumerate(inputs):
        for j, t in enumerate(ids):
            if not 0 <= t < vocab:
                where = f"input[{i}][{j}]" if nested else f"input[{j}]"
                raise ApiError(422, f"{where} is {t}, not a token id of this model (0 to {vocab - 1})", param="input")


async def _rerank(svc: Service, state, body: RerankRequest) -> Response:
    """POST /v1/rerank's answer (state: the request's, as _embeddings')."""
    scores, res = await rerank_scores(svc, state, body.query, body.texts, body.raw_scores, "/v1/rerank")
    results = ranked(scores, body.texts, body.return_text, body.top_n)
    return JSONResponse({"object": "list", "model": svc.model_name, "results": results,
                         "usage": {"prompt_tokens": res.tokens, "total_tokens": res.tokens}})


DIRECT_ROUTES["/v1/rerank"] = (RerankRequest, _rerank)


def ranked(scores: list[float], texts: list[str], return_text: bool, top_n: int | None = None) -> list[dict]:
    """{index, score[, text]} per text, best first (stable: ties keep their order), the top_n first."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:top_n]
    return [{"index": i, "score": scores[i], "text": texts[i]} if return_text else {"index": i, "score": scores[i]}
            for i in order]


async def rerank_scores(svc: Service, state, query: str, texts: list[str], raw_scores: bool,
                        route: str, **job_options) -> tuple[list[float], Any]:
    """The scores of (query, text) pairs through a one-label cross-encoder: the checkpoint's
    activation (CrossEncoder's), or the raw logits; and the job's result (its usage)."""
    import torch

    if svc.head != "sequence_classification" or svc.num_labels != 1:
        raise ApiError(400, f"{route} needs a cross-encoder (a sequence-classification head with one label); "
                            f"the loaded model has {_head_words(svc)}", param=None)
    _check_client_batch(svc, len(texts), "texts")
    state.inputs = len(texts)
    res = await _run(svc, Job(SCORE, PAIR, [(query, t) for t in texts], **job_options), "texts")
    logits = torch.from_numpy(res.values)  # [N, 1]
    act = None if raw_scores else svc.score_activation()
    return (logits if act is None else act(logits)).squeeze(-1).tolist(), res


async def _embeddings(svc: Service, state, body: EmbeddingRequest) -> Response:
    """POST /v1/embeddings' answer. state: the request's state (`inputs` is left there for the
    metrics)."""
    how, inputs, nested = body.input
    dimensions, encoding_format = body.dimensions, body.encoding_format
    _check_client_batch(svc, len(inputs), "input")
    if how == IDS:
        _check_vocab(svc, inputs, nested)
    if dimensions is not None and dimensions > svc.hidden_size:
        raise ApiError(422, f"dimensions ({dimensions}) is more than the model's {svc.hidden_size}",
                       param="dimensions")
    state.inputs = len(inputs)
    if how == TEXT and svc.task_instruction:  # as Encoder.encode puts it (token ids: the caller's)
        inputs = [svc.task_instruction + t for t in inputs]
    res = await _run(svc, Job(EMBED, how, inputs), "input")
    values = res.values
    if dimensions is not None and dimensions < values.shape[1]:
        values = values[:, :dimensions]
        values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
    if encoding_format == "base64":
        rows = ['"' + base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii") + '"'
                for v in values]
    else:
        rows = float_rows(values)
    # Written as text around the rows (jsonrows.py: json's floats cost more than the request).
    data = ",".join(f'{{"object":"embedding","index":{i},"embedding":{row}}}' for i, row in enumerate(rows))
    usage = f'{{"prompt_tokens":{int(res.tokens)},"total_tokens":{int(res.tokens)}}}'
    return Response(f'{{"object":"list","data":[{data}],"model":{json.dumps(svc.model_name)},"usage":{usage}}}',
                    media_type="application/json")


DIRECT_ROUTES["/v1/embeddings"] = (EmbeddingRequest, _embeddings)


class _State:
    """request.state's stand-in on the direct path: attributes into the scope's state dict."""

    __slots__ = ("_d",)

    def __init__(self, d: dict):
        object.__setattr__(self, "_d", d)

    def __setattr__(self, name, value):
        self._d[name] = value


async def _run(svc: Service, job: Job, param: str):
    # The batcher refuses a job at once (a local one) or once the engine has answered (a front
    # process's): either way as one of these errors.
    try:
        return await svc.batcher.submit(job)
    except QueueFull as e:
        retry = str(svc.settings.retry_after_s)
        raise ApiError(429, f"server busy: {e}; retry after {retry} s", "rate_limit_error",
                       headers={"Retry-After": retry}) from None
    except ShuttingDown as e:
        raise ApiError(503, str(e), "unavailable", headers={"Retry-After": str(svc.settings.retry_after_s)}) from None
    except InputTooLong as e:
        raise ApiError(413, f"{param}[{e.index}] has {e.tokens} tokens, more than the limit of {e.limit} "
                            "(inputs are not truncated: the server's setting, or the request's truncate)",
                       param=param) from None
    except NoTokens as e:
        raise ApiError(422, f"{param}[{e.index}] gives no tokens, so there is nothing to encode",
                       param=param) from None
    except NonFiniteOutput as e:
        raise ApiError(500, f"the model's output for {param}[{e.index}] holds NaN or Inf: the checkpoint's "
                            "weights drive its activations out of range for this input (float16 overflow, "
                            "say; float32 or bfloat16 may not)", "server_error", param=param) from None
    except ForwardFailed as e:
        if e.out_of_memory:
            # Transient: the same request may fit a later, smaller batch. 503 with Retry-After is
            # what clients' retry logic (and other engines' clients) expect of an overloaded server.
            retry = str(svc.settings.retry_after_s)
            raise ApiError(503, f"{e}; nothing was computed for this request: retry it after {retry} s",
                           "server_error", headers={"Retry-After": retry}) from None
        raise ApiError(500, str(e), "server_error") from None


def _validation_response(errors: list[dict]) -> JSONResponse:
    def where(loc) -> str:  # ("body", "texts", 1) -> "texts[1]"
        out = ""
        for p in loc:
            if p == "body":
                continue
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out

    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        why = str(first.get("ctx", {}).get("error", "")).strip()
        return _error_response(422, "the request body is not valid JSON" + (f": {why}" if why else ""),
                               "invalid_request_error", None)
    messages = []
    for err in errors[:5]:
        kind, msg, name = err.get("type", ""), str(err.get("msg", "")), where(err.get("loc", ()))
        if kind == "value_error":  # our own validators' messages go on from the field's name
            msg = msg.removeprefix("Value error, ")
            messages.append(f"{name}{msg}" if msg.startswith("[") else f"{name} {msg}")
        elif kind == "missing":
            messages.append(f"{name} is required")
        elif kind in ("model_attributes_type", "dict_type") and not name:
            messages.append("the request body must be a JSON object")
        else:
            msg = msg[:1].lower() + msg[1:]
            messages.append(f"{name}: {msg}" if name else msg)
    param = where(first.get("loc", ())) or None
    return _error_response(422, "; ".join(messages), "invalid_request_error", param)


class _Guard:
    """Pure ASGI middleware round every request:
    - refuses bodies over max_bytes (413: by Content-Length before they are read; a body without
      one, sent in chunks, is read up to the limit first);
    - reads every POST body before the app does, so that it knows when the client has sent all of
      it: a request still unanswered WATCH_AFTER_S later watches its connection from then on, and
      a client that goes away before its answer has the request's work dropped (its inputs not yet
      forwarded leave the queue, in this process or the engine's) and is recorded with status 499;
    - answers the DIRECT_ROUTES itself for a body their schema takes;
    - records each request's route, status and latency in the service's metrics."""

    # Watching costs a task: only requests that wait this long (a queue, a long batch) pay it.
    WATCH_AFTER_S = 0.05

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        status = 500
        scope.setdefault("state", {})  # where the route leaves its input count (request.state)
        headers = dict(scope.get("headers") or ())
        post = scope.get("method") == "POST"
        if post and b"json" not in headers.get(b"content-type", b""):
            # Every body here is JSON: read it as such whatever the client declared (curl -d sends
            # application/x-www-form-urlencoded), so a bad body reads "not valid JSON", not "not an object".
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                too_big = False
            if too_big:
                resp = _error_response(413, f"the request body has {int(length)} bytes, more than this server "
                                            f"takes ({self.max_bytes})", "invalid_request_error", None)
                await resp(scope, receive, send)
                self._record(scope, route, 413, t0)
                return
        chunks = None
        if post:
            chunks = await self._read_capped(receive)
            if chunks is None:
                resp = _error_response(413, f"the request body has more bytes than this server takes "
                                            f"({self.max_bytes})", "invalid_request_error", None)
                await resp(scope, _disconnected, send)
                self._record(scope, route, 413, t0)
                return
            app_receive = _replay(chunks, receive)
        else:
            app_receive = receive

        answering = False

        async def send_status(message):
            nonlocal status, answering
            if message["type"] == "http.response.start":
                status, answering = message["status"], True
            await send(message)

        task = asyncio.current_task()
        gone, watcher, timer = False, None, None

        async def watch():
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not answering:
                gone = True
                task.cancel()

        def start_watching():
            nonlocal watcher
            watcher = asyncio.ensure_future(watch())

        if chunks and chunks[-1]["type"] == "http.request":  # all of the body is here
            timer = asyncio.get_running_loop().call_later(self.WATCH_AFTER_S, start_watching)
        try:
            if chunks and path in DIRECT_ROUTES and await self._answer_directly(scope, path, chunks, send_status):
                return
            await self.app(scope, app_receive, send_status)
        except asyncio.CancelledError:
            if not gone:
                raise
            if hasattr(task, "uncancel"):  # ours, handled: the task goes on as not cancelled
                task.uncancel()
            status = 499  # nginx's "client closed request"
        finally:
            if timer is not None:
                timer.cancel()
            if watcher is not None:
                watcher.cancel()
            self._record(scope, route, status, t0)

    async def _answer_directly(self, scope, path: str, chunks: list, send) -> bool:
        """A DIRECT_ROUTES route answered here; False where its body must go to FastAPI instead
        (refused by the schema, cut short by the client, or no service yet)."""
        svc = getattr(getattr(scope.get("app"), "state", None), "service", None)
        if svc is None or chunks[-1]["type"] != "http.request":
            return False
        schema, handler = DIRECT_ROUTES[path]
        if not isinstance(schema, type):
            schema = schema(svc)
            if schema is None:
                return False
        body = _direct_body(schema, b"".join(m.get("body", b"") for m in chunks))
        if body is None:
            return False
        try:
            resp = await handler(svc, _State(scope["state"]), body)
        except ApiError as e:
            resp = _error_response(e.status, e.message, e.type, e.param, e.headers)
        except Exception as e:  # noqa: BLE001 - as the app's handler of anything else answers
            resp = _error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")
        await resp(scope, _disconnected, send)
        return True

    async def _read_capped(self, receive) -> list | None:
        """The body's messages as read (ending with the last chunk, or with the client's leaving);
        None once they pass max_bytes."""
        chunks, size = [], 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":  # the client went away: let the app see it
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return None
            if not message.get("more_body", False):
                break
        return chunks

    @staticmethod
    def _record(scope, route: str, status: int, t0: float) -> None:
        app = scope.get("app")
        svc = getattr(getattr(app, "state", None), "service", None)
        if svc is None:
            return
        state = scope.get("state") or {}
        inputs = state.get("inputs")  # set by the route as request.state.inputs
        svc.metrics.on_request(route, status, time.perf_counter() - t0, inputs)


def _replay(chunks: list, receive):
    """A receive that hands out the body's messages already read, then the client's own."""
    pending = collections.deque(chunks)

    async def replay():
        return pending.popleft() if pending else await receive()

    return replay


async def _disconnected():
    # The body was left unread: the response needs nothing more from the client.
    return {"type": "http.disconnect"}
