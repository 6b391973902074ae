#!/usr/bin/env python3
"""A small OpenAI-compatible server for the device tests: it loads a checkpoint folder with
transformers onto the GPU and answers with real generate() output.

    serve_hf.py MODEL_DIR --port P --served-model-name NAME [--host 127.0.0.1]
                [--load-time-file F]

MODEL_DIR is what modeld downloaded (config.json, sharded *.safetensors with their index, a
tokenizer). The weights are loaded with `AutoModelForCausalLM.from_pretrained(MODEL_DIR,
device_map="cuda", dtype=torch.bfloat16)`, timed from the call to its return (CUDA synchronised);
that time is logged on stderr ("weights loaded in S s") and, with --load-time-file, written to F
as a bare number of seconds (written to F.tmp and renamed, so a reader never sees half of it).

Routes (the port listens from the start, as vLLM's does, so readiness probes see a loading server):
  GET  /health          503 until the weights are loaded, then 200
  GET  /v1/models       {"object": "list", "data": [{"id": NAME, "object": "model", ...}]}
  POST /v1/completions  {"model", "prompt", "max_tokens" (default 16), "temperature" (0: greedy)}:
                        OpenAI-shaped {"id", "object": "text_completion", "created", "model",
                        "choices": [{"index", "text", "finish_reason"}], "usage"}; 503 while loading

Needs torch, transformers and aiohttp (the H200 machine has them; CI machines do not).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import uuid

from aiohttp import web


def log(message: str) -> None:
    print(f"serve_hf: {message}", file=sys.stderr, flush=True)


class Server:
    """The loaded model (None while loading) and the lock that serialises generate() calls."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = args.served_model_name
        self.model = None
        self.tokenizer = None
        self.failed: str | None = None
        self.lock = threading.Lock()

    def load(self) -> None:
        """Loads tokenizer and weights (in a thread: the port answers meanwhile); exits the process
        when loading fails, as a real server would."""
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            torch.cuda.init()  # CUDA start-up is not the weights' load: done before the clock starts
            self.tokenizer = AutoTokenizer.from_pretrained(self.args.model_dir)
            log("loading weights")
            t0 = time.monotonic()
            model = AutoModelForCausalLM.from_pretrained(self.args.model_dir, device_map="cuda",
                                                         dtype=torch.bfloat16)
            torch.cuda.synchronize()
            seconds = time.monotonic() - t0
            model.eval()
            self.model = model
            self.write_load_time(seconds)
            log(f"weights loaded in {seconds:.3f} s")
        except Exception as e:  # noqa: BLE001 - any failure ends the server, with its reason
            log(f"loading failed: {type(e).__name__}: {e}")
            os._exit(1)

    def write_load_time(self, seconds: float) -> None:
        path = self.args.load_time_file
        if not path:
            return
        with open(path + ".tmp", "w") as f:
            f.write(f"{seconds:.6f}\n")
        os.replace(path + ".tmp", path)

    def generate(self, prompt: str, max_tokens: int, temperature: float) -> tuple[str, int, int, str]:
        """(text, prompt tokens, completion tokens, finish reason); blocks, one call at a time."""
        import torch

        with self.lock, torch.inference_mode():
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids.to("cuda")
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            out = self.model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                      pad_token_id=self.tokenizer.eos_token_id, **sampling)
            new = out[0, ids.shape[1]:]
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            return text, int(ids.shape[1]), int(new.shape[0]), "length"


def loading_answer() -> web.Response:
    return web.json_response({"error": {"message": "model is loading", "type": "unavailable"}}, status=503)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def routes(server: Server) -> web.RouteTableDef:
    r = web.RouteTableDef()

    @r.get("/health")
    async def health(_request):
        return web.Response(status=200 if server.model is not None else 503)

    @r.get("/v1/models")
    async def models(_request):
        return web.json_response({"object": "list", "data": [
            {"id": server.name, "object": "model", "created": int(time.time()), "owned_by": "modeld-tests",
             "root": server.args.model_dir}]})

    @r.post("/v1/completions")
    async def completions(request):
        if server.model is None:
            return loading_answer()
        try:
            body = await request.json()
            prompt = body.get("prompt", "")
            prompt = prompt[0] if isinstance(prompt, list) and prompt else prompt
            max_tokens = int(body.get("max_tokens", 16))
            temperature = float(body.get("temperature", 0.0) or 0.0)
        except (ValueError, TypeError, AttributeError):
            return error(400, "body must be a JSON object with prompt and max_tokens")
        if body.get("model", server.name) != server.name:
            return error(404, f"model {body.get('model')!r} does not exist")
        if not isinstance(prompt, str) or max_tokens < 1:
            return error(400, "prompt must be a string and max_tokens at least 1")
        text, n_prompt, n_new, finish = await asyncio.to_thread(server.generate, prompt, max_tokens, temperature)
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": server.name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_new, "total_tokens": n_prompt + n_new}})

    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", metavar="MODEL_DIR")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--load-time-file", default=None, metavar="F",
                    help="where to write the weights' load time in seconds once loaded")
    args = ap.parse_args(argv)
    server = Server(args)
    app = web.Application()
    app.add_routes(routes(server))

    async def start_loading(_app):
        threading.Thread(target=server.load, daemon=True).start()

    app.on_startup.append(start_loading)
    log(f"listening on {args.host}:{args.port}, model {args.model_dir} as {args.served_model_name}")
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
