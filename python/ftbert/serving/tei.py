"""HF text-embeddings-inference's routes, in its request and response shapes, so that its clients
(huggingface_hub's InferenceClient, TEI's own examples) talk to ftbert unchanged:

    POST /embed     {"inputs": str | [str], "normalize": true, "truncate": null, "truncation_direction":
                    "right", "prompt_name": null, "dimensions": null} -> [[float, ...], ...]
    POST /rerank    {"query", "texts", "raw_scores": false, "return_text": false, "truncate",
                    "truncation_direction"} -> [{"index", "score", "text"?}], best first
    POST /predict   {"inputs": str | [str, str] (one pair) | [str | [str, str], ...], "raw_scores",
                    "truncate", "truncation_direction"} -> [{"label", "score"}] best first, or a list
                    of those per input for a batch
    POST /tokenize  {"inputs": str | [str], "add_special_tokens": true, "prompt_name"} ->
                    [[{"id", "text", "special", "start", "stop"}, ...], ...]
    POST /embed_sparse  {"inputs": str | [str], "truncate", "truncation_direction", "prompt_name",
                    "top_k": null} -> [[{"index", "value"}, ...], ...] per input, sorted by index:
                    SPLADE's vector (Encoder.encode_sparse) of a *ForMaskedLM checkpoint; top_k is
                    ftbert's own (TEI has none)
    POST /embed_multivector  {"inputs", "normalize": true, "truncate", "truncation_direction",
                    "prompt_name", "is_query": false} -> [[[float, ...], ...], ...]: per input, its
                    tokens' ColBERT vectors (Encoder.encode_multivector, documents or queries);
                    ftbert's own route, in TEI's request shape
    POST /          the model's task: /embed without a head; with a sequence head, /rerank for a
                    body with query and texts, else /predict with a list per input (what the Hub's
                    inference clients read: text_classification takes [[...]]), honouring
                    "parameters": {"top_k", "function_to_apply"}

As in TEI, `truncate` left out means the server's setting (`ftbert serve --no-truncate` refuses long
inputs with 413 unless a request asks to truncate); `truncation_direction` picks the end that is cut
("left" keeps a text's end). `prompt_name` prepends the checkpoint's sentence-transformers prompt
of that name (config_sentence_transformers.json). Errors answer in this server's one error shape
(app.py), not TEI's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from ..encoder import ColbertInputTooLong, colbert_inputs_for
from ..weights_tools.layout import usable_seq_length
from .batcher import EMBED, IDS, MULTIVECTOR, PAIR, SCORE, SPARSE, TEXT, Job
from .jsonrows import float_rows


class _TeiRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    truncate: StrictBool | None = None
    truncation_direction: str = "right"

    @field_validator("truncation_direction", mode="before")
    @classmethod
    def _direction(cls, v):
        # TEI spells them Right / Left; the Hub's clients send them in lower case.
        if not isinstance(v, str) or v.lower() not in ("right", "left"):
            raise ValueError(f"must be 'right' or 'left', got {v!r}")
        return v.lower()

    def job_options(self) -> dict:
        return {"truncate": self.truncate, "truncation_side": self.truncation_direction}


def _texts(value) -> tuple[list[str], bool]:
    """str | [str] -> (texts, whether the client sent a list)."""
    if isinstance(value, str):
        return [value], False
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string or a non-empty list of strings")
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise ValueError(f"[{i}] is {type(v).__name__}; a list of strings must hold strings only")
    return value, True


class _TextsRequest(_TeiRequest):
    """A route over texts: `inputs` a string or a list of them (_texts), and a prompt by name."""

    inputs: Any
    prompt_name: StrictStr | None = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, v):
        return _texts(v)


class EmbedRequest(_TextsRequest):
    normalize: StrictBool = True
    dimensions: StrictInt | None = Field(default=None, ge=1)


class EmbedSparseRequest(_TextsRequest):
    top_k: StrictInt | None = Field(default=None, ge=1)


class EmbedMultivectorRequest(_TextsRequest):
    normalize: StrictBool = True
    is_query: StrictBool = False  # Encoder.encode_multivector's: a ColBERT query, else a document


class TeiRerankRequest(_TeiRequest):
    query: StrictStr
    texts: list[StrictStr] = Field(min_length=1)
    raw_scores: StrictBool = False
    return_text: StrictBool = False


def _predict_inputs(value) -> tuple[str, list, bool]:
    """TEI's predict inputs -> (TEXT or PAIR, inputs, batch?). As TEI reads them: a string is one
    text; a list of two strings is one pair; any other list is a batch of texts or pairs."""
    if isinstance(value, str):
        return TEXT, [value], False
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return PAIR, [(value[0], value[1])], False
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string, a [text, text] pair, or a non-empty list of those")
    if all(isinstance(v, str) for v in value):
        return TEXT, value, True
    pairs = []
    for i, v in enumerate(value):
        if not (isinstance(v, list) and len(v) == 2 and all(isinstance(t, str) for t in v)):
            raise ValueError(f"[{i}] is not a [text, text] pair; a batch holds texts only or pairs only")
        pairs.append((v[0], v[1]))
    return PAIR, pairs, True


class _Parameters(BaseModel):
    model_config = ConfigDict(extra="ignore")
    top_k: StrictInt | None = Field(default=None, ge=1)
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


class PredictRequest(_TeiRequest):
    inputs: Any
    raw_scores: StrictBool = False
    parameters: _Parameters | None = None  # the Hub's text-classification parameters (POST /)

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, v):
        return _predict_inputs(v)


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: Any
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, v):
        return _texts(v)


def register_tei_routes(app: FastAPI) -> None:
    from . import app as core  # the shared route helpers (app.py imports this module)

    def prompted(svc, texts: list[str], prompt_name: str | None) -> list[str]:
        if prompt_name is None:  # the task's instruction where the server was started with --task
            instruction = svc.task_instruction
            return [instruction + t for t in texts] if instruction else texts
        prompts = svc.prompts
        if prompt_name not in prompts:
            have = ", ".join(map(repr, prompts)) or "none"
            raise core.ApiError(422, f"prompt_name {prompt_name!r} is not one of the checkpoint's prompts ({have})",
                                param="prompt_name")
        return [prompts[prompt_name] + t for t in texts]

    async def embed_answer(svc, state, body: EmbedRequest) -> Response:
        texts, _ = body.inputs
        texts = prompted(svc, texts, body.prompt_name)
        core._check_client_batch(svc, len(texts), "inputs")
        if body.dimensions is not None and body.dimensions > svc.hidden_size:
            raise core.ApiError(422, f"dimensions ({body.dimensions}) is more than the model's {svc.hidden_size}",
                                param="dimensions")
        state.inputs = len(texts)
        res = await core._run(svc, Job(EMBED, TEXT, texts, normalize=body.normalize, **body.job_options()),
                              "inputs")
        values = res.values
        if body.dimensions is not None and body.dimensions < values.shape[1]:
            values = values[:, : body.dimensions]
            if body.normalize:
                values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
        return Response("[" + ",".join(float_rows(values)) + "]", media_type="application/json")

    async def embed(body: EmbedRequest, request: Request):
        return await embed_answer(core._service(request), request.state, body)

    core.DIRECT_ROUTES["/embed"] = (EmbedRequest, embed_answer)  # the middleware's own path (app.py)
    # POST / of an embedding model is /embed (root below); a classifier's goes through FastAPI.
    core.DIRECT_ROUTES["/"] = (lambda svc: None if svc.head == "sequence_classification" else EmbedRequest,
                               embed_answer)

    async def per_token_job(svc, request: Request, route: str, kind: str, what: str, texts: list[str],
                            prompt_name: str | None, **options):
        """The result of a SPARSE or MULTIVECTOR job over `texts` (400 where the model lacks the head)."""
        reason = svc.output_unavailable(kind)
        if reason is not None:
            raise core.ApiError(400, f"{route} needs {what}; the loaded model has none: {reason}", param=None)
        texts = prompted(svc, texts, prompt_name)
        core._check_client_batch(svc, len(texts), "inputs")
        request.state.inputs = len(texts)
        return await core._run(svc, Job(kind, TEXT, texts, **options), "inputs")

    async def embed_sparse(body: EmbedSparseRequest, request: Request):
        svc = core._service(request)
        res = await per_token_job(svc, request, "/embed_sparse", SPARSE, "a masked-LM head (a SPLADE, *ForMaskedLM "
                                  "checkpoint)", body.inputs[0], body.prompt_name, top_k=body.top_k,
                                  **body.job_options())
        return JSONResponse([[{"index": i, "value": v}
                              for i, v in zip(np.asarray(idx).tolist(), np.asarray(val).tolist())]
                             for idx, val in res.values])

    async def embed_multivector(body: EmbedMultivectorRequest, request: Request):
        svc = core._service(request)
        what = "a token projection (a ColBERT checkpoint)"
        colbert = None
        if svc.output_unavailable(MULTIVECTOR) is None and svc.path is not None:
            try:
                colbert = colbert_inputs_for(svc.path, usable_seq_length(svc.config))
            except ValueError as e:  # a settings file that is there but malformed
                raise core.ApiError(400, f"/embed_multivector: {e}", param=None) from None
        if colbert is None:  # no ColBERT settings (or no head, answered 400): the texts as they are
            res = await per_token_job(svc, request, "/embed_multivector", MULTIVECTOR, what, body.inputs[0],
                                      body.prompt_name, normalize=body.normalize, **body.job_options())
            return JSONResponse([np.asarray(v, dtype=np.float32).tolist() for v in res.values])
        texts = prompted(svc, body.inputs[0], body.prompt_name)
        core._check_client_batch(svc, len(texts), "inputs")
        request.state.inputs = len(texts)
        truncate = svc.settings.truncate if body.truncate is None else body.truncate

        def build():
            with svc.tokenizer() as tok:
                return colbert.build(tok, texts, body.is_query, truncate=truncate, side=body.truncation_direction)

        try:
            seqs = await asyncio.to_thread(build)
        except ColbertInputTooLong as e:
            raise core.ApiError(413, f"inputs[{e.index}] has {e.tokens} tokens, more than the {e.limit} this "
                                f"checkpoint's ColBERT {'query' if body.is_query else 'document'} takes (inputs are "
                                "not truncated: the server's setting, or the request's truncate)",
                                param="inputs") from None
        except ValueError as e:  # settings the tokenizer cannot follow (a marker it does not have)
            raise core.ApiError(400, f"/embed_multivector: {e}", param=None) from None
        # Token ids built here, forwarded by the batcher with every other request's inputs; a query whose
        # [MASK] tokens nothing attends to runs there in a padded forward (Job.attended). The text was cut
        # on the request's side already; a server cap (--max-input-length) below ColBERT's length cuts the
        # end, keeping [CLS] and the marker, and each keep mask alike.
        attended = [int(s.attended) for s in seqs] if any(s.attended < len(s.ids) for s in seqs) else None
        res = await core._run(svc, Job(MULTIVECTOR, IDS, [s.ids.tolist() for s in seqs], normalize=body.normalize,
                                       truncate=truncate, truncation_side="right", attended=attended), "inputs")
        rows = [np.asarray(v) if s.keep is None else np.asarray(v)[s.keep[: len(v)]]
                for v, s in zip(res.values, seqs)]
        return JSONResponse([np.asarray(v, dtype=np.float32).tolist() for v in rows])

    async def rerank_answer(svc, state, body: TeiRerankRequest) -> JSONResponse:
        scores, _ = await core.rerank_scores(svc, state, body.query, body.texts, body.raw_scores, "/rerank",
                                             **body.job_options())
        return JSONResponse(core.ranked(scores, body.texts, body.return_text))

    async def rerank(body: TeiRerankRequest, request: Request):
        return await rerank_answer(core._service(request), request.state, body)

    core.DIRECT_ROUTES["/rerank"] = (TeiRerankRequest, rerank_answer)

    async def predict_rows(body: PredictRequest, request: Request, nested: bool):
        import torch

        svc = core._service(request)
        if svc.head != "sequence_classification":
            raise core.ApiError(400, "/predict needs a sequence-classification head; the loaded model has "
                                     f"{core._head_words(svc)}", param=None)
        how, inputs, batch = body.inputs
        core._check_client_batch(svc, len(inputs), "inputs")
        request.state.inputs = len(inputs)
        res = await core._run(svc, Job(SCORE, how, inputs, **body.job_options()), "inputs")
        logits = torch.from_numpy(res.values)  # [N, num_labels]
        params = body.parameters or _Parameters()
        fn = params.function_to_apply or ("none" if body.raw_scores else
                                          "sigmoid" if svc.num_labels == 1 else "softmax")
        scores = {"none": logits, "sigmoid": torch.sigmoid(logits),
                  "softmax": torch.softmax(logits, dim=-1)}[fn].tolist()
        rows = []
        for row in scores:
            ranked = sorted(zip(svc.labels, row), key=lambda p: p[1], reverse=True)
            if params.top_k is not None:
                ranked = ranked[: params.top_k]
            rows.append([{"label": label, "score": s} for label, s in ranked])
        return JSONResponse(rows if batch or nested else rows[0])

    async def predict(body: PredictRequest, request: Request):
        return await predict_rows(body, request, nested=False)

    async def tokenize(body: TokenizeRequest, request: Request):
        svc = core._service(request)
        texts, _ = body.inputs
        texts = prompted(svc, texts, body.prompt_name)
        core._check_client_batch(svc, len(texts), "inputs")
        with svc.tokenizer() as tok:
            out = tok(texts, add_special_tokens=body.add_special_tokens, return_offsets_mapping=True,
                      return_special_tokens_mask=True, return_attention_mask=False)
        rows = []
        for t, (text, ids, offsets, special) in enumerate(zip(texts, out["input_ids"], out["offset_mapping"],
                                                             out["special_tokens_mask"])):
            tokens = tok.convert_ids_to_tokens(ids)
            row = []
            for i, (start, stop) in enumerate(offsets):
                is_special = bool(special[i])
                row.append({"id": int(ids[i]), "text": tokens[i] if is_special else text[start:stop],
                            "special": is_special, "start": None if is_special else int(start),
                            "stop": None if is_special else int(stop)})
            rows.append(row)
        return JSONResponse(rows)

    async def root(request: Request):
        svc = core._service(request)
        try:
            body = await request.json()
        except ValueError:
            raise core.ApiError(422, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise core.ApiError(422, "the request body must be a JSON object")
        from pydantic import ValidationError

        try:
            if svc.head == "sequence_classification":
                if "query" in body and "texts" in body:
                    return await rerank(TeiRerankRequest.model_validate(body), request)
                return await predict_rows(PredictRequest.model_validate(body), request, nested=True)
            return await embed(EmbedRequest.model_validate(body), request)
        except ValidationError as e:
            return core._validation_response(e.errors())

    app.post("/embed")(embed)
    app.post("/rerank")(rerank)
    app.post("/predict")(predict)
    app.post("/tokenize")(tokenize)
    app.post("/embed_sparse")(embed_sparse)
    app.post("/embed_multivector")(embed_multivector)
    app.post("/")(root)
