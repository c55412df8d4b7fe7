"""A real llama.cpp server for tests: a tiny random-weight GGUF and the server from the xllamacpp wheel.

- :func:`make_tiny_llama` writes a LLaMA-architecture GGUF (random weights, a small self-made
  SentencePiece-style vocab with byte fallback) with the ``gguf`` package: about 1 MB, well under
  a second; the text is gibberish but tokenisation, prefill, decode and the token counters are real.
- :class:`LlamaServer` runs llama.cpp's own HTTP server (``--metrics`` on, 1 thread: ggml's
  spinning threads starve on a shared 2-core box) in a subprocess on 127.0.0.1, waits for
  ``/health`` and stops it with SIGTERM (then SIGKILL).
- ``python tests/llamacpp_server.py serve MODEL PORT`` is the subprocess itself.

Adapted from ``reference/engine/`` (RECIPE.md, make_tiny_llama.py, serve_xllamacpp.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from netutil import free_port
from procs import terminate

MODEL_ALIAS = "tiny-llama"  # the model id the server reports
START_TIMEOUT = 60.0  # seconds; the server answers /health 0.2-0.5 s after start on an idle box

_WORD_TEXT = """the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little llama token model request latency metric server"""
WORDS = _WORD_TEXT.split()  # common English words, so prompts tokenise into whole words


def make_tiny_llama(out: Path, *, embd: int = 64, layers: int = 2, heads: int = 4, ff: int = 256,
                    ctx: int = 2048, seed: int = 0) -> Path:  # fmt: skip
    """Write the tiny random-weight GGUF to ``out`` and return it."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embd // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    normal, unknown, control, byte = 1, 2, 3, 6  # SentencePiece token types
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [unknown, control, control]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(byte)
    seen: set[str] = set()

    def add(piece: str, score: float) -> None:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            scores.append(score)
            types.append(normal)

    add("\u2581", -1.0)
    for c in (chr(i) for i in range(33, 127)):
        add(c, -1.0)
    for rank, word in enumerate(WORDS):
        piece = "\u2581" + word
        for k in range(2, len(piece) + 1):  # every prefix, so the bigram merges reach the word
            add(piece[:k], -rank / 1000.0 - (len(piece) - k))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_vocab_size(len(tokens))

    def tensor(name: str, *shape: int, ones: bool = False) -> None:
        arr = np.ones(shape, np.float32) if ones else (rng.standard_normal(shape) * 0.02).astype(np.float32)
        w.add_tensor(name, arr)

    tensor("token_embd.weight", len(tokens), embd)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", embd, ones=True)
        for p in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{p}.weight", embd, embd)
        tensor(f"blk.{i}.ffn_norm.weight", embd, ones=True)
        tensor(f"blk.{i}.ffn_gate.weight", ff, embd)
        tensor(f"blk.{i}.ffn_up.weight", ff, embd)
        tensor(f"blk.{i}.ffn_down.weight", embd, ff)
    tensor("output_norm.weight", embd, ones=True)
    tensor("output.weight", len(tokens), embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _serve(model: str, port: int) -> None:
    """The subprocess: run llama.cpp's server until SIGTERM."""
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = model
    p.model_alias = {MODEL_ALIAS}  # a set: a plain string would be split into characters
    p.hostnames = ["127.0.0.1"]
    p.port = port
    p.endpoint_metrics = True  # == llama-server --metrics
    p.n_ctx = 2048  # total KV over the slots
    p.n_parallel = 2
    p.cpuparams.n_threads = 1
    p.cpuparams_batch.n_threads = 1
    p.ui = False
    p.warmup = False
    server = xlc.Server(p)  # loads the model and starts the HTTP thread
    print(f"LISTENING {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server


def post_json(url: str, body: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """POST a JSON body, return the JSON answer."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        result: dict[str, Any] = json.loads(resp.read())
    return result


class LlamaServer:
    """llama.cpp's server on ``127.0.0.1:port`` in a subprocess (see the module docstring)."""

    def __init__(self, model: Path, port: int | None = None) -> None:
        self.model = model
        self.port = port or free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until ``/health`` answers ok."""
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", str(self.model), str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama.cpp server did not become healthy in {START_TIMEOUT} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None:
            return
        terminate(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port (every counter starts from zero)."""
        self.stop()
        self.start()

    def complete(
        self, prompt: str, max_tokens: int, seed: int, cache_prompt: bool | None = None
    ) -> dict[str, Any]:
        """One ``/v1/completions`` request; returns the OpenAI-style answer (with ``usage``, and
        llama.cpp's ``timings``: ``prompt_n``/``prompt_ms``, ``predicted_n``/``predicted_ms``,
        ``cache_n``). ``cache_prompt``: reuse (True) or ignore (False) the slot's KV cache for a
        common prefix; None leaves the server's default (reuse)."""
        body: dict[str, Any] = {
            "model": MODEL_ALIAS,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.8,
            "seed": seed,
        }
        if cache_prompt is not None:
            body["cache_prompt"] = cache_prompt
        return post_json(self.base_url + "/v1/completions", body)

    def metrics(self) -> dict[str, float]:
        """The server's own ``/metrics``, read with prometheus_client's parser: sample name → value
        (llama.cpp's series carry no labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}

    def settled_metrics(self, timeout: float = 60.0) -> dict[str, float]:
        """``/metrics`` once no request is in flight and two reads in a row agree on every counter
        (a finished request's counters are final); raises after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last = self.metrics()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            cur = self.metrics()
            counters = [k for k in cur if k.endswith("_total")]
            if cur.get("llamacpp:requests_processing") == 0 and all(cur[k] == last.get(k) for k in counters):
                return cur
            last = cur
        raise RuntimeError(f"llama.cpp /metrics did not settle in {timeout} s")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        _serve(sys.argv[2], int(sys.argv[3]))
    else:
        print("usage: llamacpp_server.py serve MODEL.gguf PORT", file=sys.stderr)
        raise SystemExit(2)
