"""``python -m <package> serve --ckpt_path CKPT``: a trained model over HTTP, on LitServe
(``pip install -e ".[serve]"``).

- ``GET /health`` answers ``ok`` once the model is loaded.
- ``POST /predict`` takes JSON: for a table model ``{"rows": [{"<column>": value, ...}, ...]}``,
  each row's raw values as in the data file (numbers for numeric columns, text for the others,
  null for a missing value where the model imputes them); for an image model
  ``{"images": ["<base64 of a PNG or JPEG file>", ...]}``; for a text model
  ``{"texts": ["<text>", ...]}``, each tokenized by the checkpoint's tokenizer. It answers
  ``{"predictions": [{"class": ..., "probability": ..., "top_k": [[class, probability], ...]}]}``,
  or ``{"predictions": [{"value": ...}]}`` for a regression target in its own units: what
  ``predict`` writes for the same inputs, through the same checkpoint's preprocessing.
- A request it cannot answer gets a 4xx answer ``{"error": "<one line>"}``, and the server goes
  on serving.

Requests that arrive together are predicted together (LitServe's dynamic batching): up to
``--max_batch_size`` requests, waiting at most ``--batch_timeout`` seconds for them.
"""

import argparse
import base64
import binascii
import io
import json
import math
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import litserve
import numpy as np
import torch
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from torch import Tensor

from .data.images import ImageFolderDataModule, UnreadableImageError, decode_image
from .data.preprocessing import encode_features
from .data.tables import LARGEST_VALUE, MISSING_CATEGORY, Table, numeric_problems
from .data.text import concatenated, encode, tokenizers_module
from .models.trained import check_project_model, load_trained
from .runs.checkpoints import check_made_here, read_checkpoint
from .utils.predictions import top_classes

PACKAGE = __name__.partition(".")[0]
SERVER_PROCESS = os.getpid()
# How deep a request's JSON may nest (``{"rows": [{...}]}`` is 3): a deeper one would exhaust the
# recursion of what reads it after the check (LitServe's parser, the queues to its workers).
DEEPEST_BODY = 32
# The longest value quoted in a message.
QUOTED_CHARACTERS = 80
# The digits of the largest float64 (1.8e308): a longer integer may be beyond it.
FLOAT64_DIGITS = 309


class RequestError(ValueError):
    """A request the model cannot answer: why, in one line, and the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Predictor:
    """A checkpoint's model with what turns a request's JSON into its input (``inputs``) and its
    outputs into answers (``answers``), as ``predict`` does for files."""

    def __init__(self, checkpoint: str | Path, top_k: int = 3, device: str = "cpu") -> None:
        self.model, data = load_trained(checkpoint)
        self.model.to(device)
        self.top_k, self.device = top_k, torch.device(device)
        self.transform = data.transform(train=False) if isinstance(data, ImageFolderDataModule) else None
        preprocess = self.model.preprocess
        if preprocess.tokenizer:  # a model of texts
            self.tokenizer = tokenizers_module().Tokenizer.from_str(preprocess.tokenizer)
            self.max_length = data.hparams.max_length
        self.kind = "images" if self.transform else "texts" if preprocess.tokenizer else "rows"
        self.numeric, self.text = list(preprocess.numeric), list(preprocess.categories)
        self.imputes = getattr(data, "hparams", {}).get("missing") == "impute"

    def inputs(self, body: Any) -> Tensor:
        """The model's input batch for a request's JSON body; ``RequestError`` when it has none."""
        if not isinstance(body, dict) or list(body) != [self.kind]:
            found = (
                f"the keys {_listed(list(body))}" if isinstance(body, dict) else f"a {type(body).__name__}"
            )
            raise RequestError(f"the body must be a JSON object with one key, {self.kind!r}: not {found}")
        items = body[self.kind]
        if not isinstance(items, list) or not items:
            raise RequestError(f"{self.kind} must be a list of one or more {self.kind[:-1]}s")
        return {"images": self._images, "texts": self._texts, "rows": self._rows}[self.kind](items)

    def _images(self, images: list[Any]) -> Tensor:
        batch = []
        for n, image in enumerate(images):
            if not isinstance(image, str):
                raise RequestError(f"images[{n}] must be a string: the base64 of an image file")
            try:
                data = base64.b64decode(image, validate=True)
                batch.append(self.transform(decode_image(io.BytesIO(data), f"images[{n}]")))
            except binascii.Error:
                raise RequestError(f"images[{n}] is not base64") from None
            except UnreadableImageError as error:
                raise RequestError(str(error)) from None
        return torch.stack(batch)

    def _texts(self, texts: list[Any]) -> Tensor:
        """Token ids, as ``predict`` encodes a file's texts: stripped, cut to the checkpoint's
        ``max_length`` and padded with 0."""
        for n, text in enumerate(texts):
            if not isinstance(text, str):
                raise RequestError(f"texts[{n}] must be a string, got {_quoted(text)}")
            if not text.strip():
                raise RequestError(f"texts[{n}] is empty; send the text to predict")
        return encode(self.tokenizer, [text.strip() for text in texts], self.max_length)[0]

    def _rows(self, rows: list[Any]) -> Tensor:
        columns = [*self.numeric, *self.text]
        numbers = np.empty((len(rows), len(self.numeric)))
        text = np.empty((len(rows), len(self.text)), dtype=object)
        for n, row in enumerate(rows):
            if not isinstance(row, dict):
                raise RequestError(f"rows[{n}] must be an object of column names and values")
            if missing := [name for name in columns if name not in row]:
                raise RequestError(f"rows[{n}] lacks the columns {_listed(missing)}")
            if extra := [name for name in row if name not in columns]:
                raise RequestError(f"rows[{n}] has columns the model was not trained on: {_listed(extra)}")
            numbers[n] = [self._number(row[name], f"rows[{n}][{name!r}]") for name in self.numeric]
            text[n] = [self._text(row[name], f"rows[{n}][{name!r}]") for name in self.text]
        names = [f"rows[{n}]" for n in range(len(rows))]
        table = _RequestTable(Path("request"), numbers, self.numeric, text.astype(str), self.text, rows=names)
        # The check of a file's numbers: infinite ones and those float32 cannot train on or predict.
        if problems := numeric_problems(table):
            raise RequestError(problems[0])
        return encode_features(table, self.model.preprocess, "serve")

    def _number(self, value: Any, where: str) -> float:
        """The number ``value`` is; NaN where missing, as ``NaN`` or null, for a model that imputes."""
        missing = value is None or (isinstance(value, float) and math.isnan(value))  # a file's NaN too
        if missing and self.imputes:
            return math.nan
        if missing:
            raise RequestError(f"{where} is missing; this model was trained without missing values")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(f"{where} must be a number, got {_quoted(value)}")
        return float(value)  # an integer beyond float64 was refused with the body's JSON

    def _text(self, value: Any, where: str) -> str:
        if value is None and self.imputes:
            return MISSING_CATEGORY
        if value is None:
            raise RequestError(f"{where} is missing; this model was trained without missing values")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise RequestError(f"{where} must be text, got {_quoted(value)}")
        return str(value)

    def predict(self, inputs: Tensor) -> Tensor:
        """The model's outputs as ``predict`` gives them: class probabilities, or values."""
        with torch.inference_mode():
            return self.model.predict_step((inputs.to(self.device),), 0).float().cpu()

    def answers(self, outputs: Tensor) -> list[dict[str, Any]]:
        """One answer per sample: its class, probability and top classes, or its value."""
        if self.model.task == "regression":
            return [{"value": value} for value in outputs.tolist()]
        return [
            {"class": ranked[0][0], "probability": ranked[0][1], "top_k": [list(pair) for pair in ranked]}
            for ranked in top_classes(outputs, self.model.class_names, self.top_k)
        ]


class _RequestTable(Table):
    """A request's rows, whose values messages name as the other request errors do: ``rows[0]['x']``."""

    def where(self, index: int, column: str | None = None) -> str:
        return f"{self.rows[index]}[{column!r}]" if column is not None else self.rows[index]


def _listed(names: list[str], shown: int = 10) -> str:
    """Names for a one-line message: the first ``shown``, each cut, and how many more."""
    cut = [_cut(name) for name in names[:shown]]
    return f"{cut}" + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _quoted(value: Any) -> str:
    """A request's value as JSON, cut."""
    return _cut(json.dumps(value))


def _cut(text: str) -> str:
    """``text`` cut at ``QUOTED_CHARACTERS``: a request's names and values are the client's, of any length."""
    return text if len(text) <= QUOTED_CHARACTERS else text[: QUOTED_CHARACTERS - 3] + "..."


class IntegerTooLarge(ValueError):
    """A JSON integer beyond float64, which no column takes."""


def _integer(text: str) -> int:
    """A JSON integer, refused beyond float64: read as infinite it would be named as ``inf``, and
    past Python's limit on an integer's digits (4,300) its advice would answer."""
    if len(text) > FLOAT64_DIGITS and math.isinf(float(text)):
        raise IntegerTooLarge
    return int(text)


def _too_deep(body: Any) -> bool:
    """Whether ``body`` nests arrays and objects more than ``DEEPEST_BODY`` deep, found level by
    level (a recursive walk would fail on the bodies it is to find)."""
    level = [body] if isinstance(body, list | dict) else []
    for _ in range(DEEPEST_BODY):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, list | dict)
        ]
    return bool(level)


class CheckedBodies:
    """ASGI middleware before LitServe: a ``POST`` body over ``limit`` bytes is answered 413, and
    one that is not JSON, or nests deeper than ``DEEPEST_BODY``, 400, each with ``{"error": ...}``,
    before it reaches a worker."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:  # read here, chunk by chunk, so that a body without Content-Length is bounded too
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await _answer(send, 413, f"the body is over {self.limit:,} bytes")
            more = message.get("more_body", False)
        body = b"".join(chunks)
        deep = f"the body nests arrays and objects more than {DEEPEST_BODY} deep"
        try:
            if _too_deep(json.loads(body, parse_int=_integer)):
                return await _answer(send, 400, deep)
        except RecursionError:  # nested too deep for the parser itself
            return await _answer(send, 400, deep)
        except IntegerTooLarge:
            too_large = (
                f"the body has an integer too large for float64; a number must be within ±{LARGEST_VALUE:.0e}"
            )
            return await _answer(send, 400, too_large)
        except ValueError as error:
            return await _answer(send, 400, f"the body is not JSON ({error})")

        async def replay() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _answer(send: Any, status: int, error: str) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ModelAPI(litserve.LitAPI):
    """Requests in, answers out, through a ``Predictor`` in each inference worker. A request the
    model cannot answer is answered on its own, without failing the others batched with it."""

    def __init__(self, checkpoint: str, top_k: int, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict")
        self.checkpoint, self.top_k = checkpoint, top_k

    def setup(self, device: str) -> None:
        torch.set_num_threads(1)  # one thread a worker: --workers spreads them over the cores
        self.predictor = Predictor(self.checkpoint, self.top_k, device)

    def decode_request(self, request) -> Tensor | RequestError:  # unannotated: LitServe reads the JSON
        try:
            return self.predictor.inputs(request)
        except RequestError as error:
            return error

    def batch(self, inputs: list[Tensor | RequestError]) -> list[Tensor | RequestError]:
        return inputs

    def predict(self, inputs: Any) -> Any:
        # Without batching (max_batch_size 1) LitServe passes one request, not a list of them.
        requests = inputs if isinstance(inputs, list) else [inputs]
        batches = [request for request in requests if isinstance(request, Tensor)]
        if batches:
            outputs = iter(self.predictor.predict(concatenated(batches)).split([len(b) for b in batches]))
        answers = [
            request if isinstance(request, RequestError) else self.predictor.answers(next(outputs))
            for request in requests
        ]
        return answers if isinstance(inputs, list) else answers[0]

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, RequestError):
            return JSONResponse({"error": str(output)}, status_code=output.status)
        return {"predictions": output}


async def _as_error(request: Any, error: HTTPException) -> JSONResponse:
    """LitServe's and FastAPI's own errors (a worker's failure, an unknown path) as ``{"error"}``."""
    return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)


def _stop(signal_number: int, frame: Any) -> None:
    """SIGTERM, as Ctrl-C: LitServe stops its workers and servers on KeyboardInterrupt. A process
    it forked inherits this handler and just ends."""
    if os.getpid() != SERVER_PROCESS:
        raise SystemExit(0)
    raise KeyboardInterrupt


def main(argv: list[str]) -> None:
    """``serve``'s command line; runs until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE} serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="the checkpoint of a trained run")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        choices=["127.0.0.1", "0.0.0.0", "::"],
        help="the address to listen on: this machine only, or every address (IPv4, IPv6)",
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--accelerator", default="auto", choices=["auto", "cpu", "cuda"], help="auto: a GPU when there is one"
    )
    parser.add_argument("--workers", type=int, default=1, help="inference worker processes (on each GPU)")
    parser.add_argument("--max_batch_size", type=int, default=8, help="requests predicted together")
    parser.add_argument(
        "--batch_timeout", type=float, default=0.005, help="seconds to wait for a batch to fill"
    )
    parser.add_argument("--top_k", type=int, default=3, help="classes ranked in each answer")
    parser.add_argument("--max_body_mb", type=int, default=16, help="the largest request body taken")
    args = parser.parse_args(argv)
    try:
        checkpoint = read_checkpoint(args.ckpt_path)
        check_made_here(checkpoint, args.ckpt_path)  # here: a worker's failure ends LitServe in tracebacks
        check_project_model(checkpoint)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--ckpt_path: {error}")
    if "pytorch-lightning_version" not in checkpoint:
        parser.error(f"--ckpt_path: {args.ckpt_path} is not a Lightning checkpoint")
    for name in ("workers", "max_batch_size", "top_k", "max_body_mb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be 1 or more")
    # ModelAPI's batch and unbatch serve any max_batch_size, 1 too, which LitServe warns of.
    warnings.filterwarnings("ignore", message="The LitServer has both batch and unbatch methods implemented")
    api = ModelAPI(str(args.ckpt_path), args.top_k, args.max_batch_size, args.batch_timeout)
    server = litserve.LitServer(
        api,
        accelerator=args.accelerator,
        workers_per_device=args.workers,
        healthcheck_path="/health",
        middlewares=[(CheckedBodies, {"limit": args.max_body_mb * 1024 * 1024})],
        disable_openapi_url=True,
    )
    server.app.add_exception_handler(HTTPException, _as_error)
    signal.signal(signal.SIGTERM, _stop)
    print(f"Serving {args.ckpt_path} on http://{args.host}:{args.port}/predict (Ctrl-C stops)", flush=True)
    server.run(host=args.host, port=args.port, log_level="warning", generate_client_file=False)
