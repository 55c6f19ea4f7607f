"""One inference replica: a model version's Hugging Face format folder served over an OpenAI-compatible
HTTP API, run as a Slurm job on a cluster node. CPU partitions (the tiny profiles) run the small
transformers server below; GPU partitions run vLLM's OpenAI server (`--engine vllm`), announced the
same way.

    python -m recipes.node.serve --model FOLDER --served-name NAME --version NAME:vN --announce FILE \
        [--token-file FILE] [--engine vllm]

    GET  /health                   200 once the model is loaded: {"status", "version", "in_flight"}
    GET  /v1/models                {"object": "list", "data": [{"id": NAME, ...}]}
    POST /v1/completions           {"prompt", "max_tokens"=16, "temperature"=0} -> OpenAI's text_completion
    POST /v1/chat/completions      {"messages": [{"role", "content"}], ...}     -> OpenAI's chat.completion
    POST /predict                  {"instances": ["text" | {"prompt", "max_tokens"}]} -> {"predictions": [...]}

The CPU engine honours `prompt`/`messages`, `max_tokens` (or `max_completion_tokens`), `temperature`,
`top_p`, `stop` (up to 4 strings), `seed`, `stream` with `stream_options.include_usage`, `n` of 1, and
ignores `model` (the router names the endpoint) and `user`; any other field is a 400 naming it, never
silently dropped. `stream: true` answers server-sent events, one per new piece of text, then
`data: [DONE]`; a client that goes away stops its generation.

With --token-file (the console always gives one: a token per replica, in a 0600 file of the job's
account), every path but /health needs `Authorization: Bearer <token>`, which only the router holds;
vLLM gets it as VLLM_API_KEY. Anything else on the node that finds the port gets 401.

Every answer names the version that produced it (`system_fingerprint`, and `X-Model-Version`). A bad
body or a prompt longer than the model's context is a 400 in OpenAI's error shape
({"error": {"message", "type": "invalid_request_error", "param", "code"}}). The replica binds an
ephemeral port and writes {"host", "port", "version"} to --announce once it is ready: the console
reads it through the cluster agent and routes to the port on the address Slurm has for the job's node.
With `--bind node` (what the console's replica jobs pass) it listens on that address alone, not on
every interface of the node (a container bridge, a public address, on the local backend the console
host's LAN address).
"""

import argparse
import hmac
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from recipes.node import chat as chat_format

# torch and the libraries on top of it are imported inside the functions that use them (start-up cost:
# torch alone takes about 1.4 s), so `--help`, the health agent and the console's imports stay fast.

MAX_BODY = 1 << 20
MAX_NEW_TOKENS = 256


class BadRequest(Exception):
    def __init__(self, message, param=None, code=None):
        super().__init__(message)
        self.param, self.code = param, code


# The request fields the CPU engine honours (the rest are refused, naming the field): OpenAI's protocol.
COMMON = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n", "stream",
          "stream_options", "user"}  # fmt: skip
FIELDS = {"/v1/completions": COMMON | {"prompt"}, "/v1/chat/completions": COMMON | {"messages"}}


class Options:
    """A request's generation options, checked (BadRequest names the field)."""

    def __init__(self, body, path="/v1/completions"):
        unknown = sorted(set(body) - FIELDS[path])
        if unknown:
            raise BadRequest(f"{unknown[0]} is not supported by this engine (docs/endpoints.md)", unknown[0])
        self.max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        self.temperature = body.get("temperature", 0)
        self.top_p = body.get("top_p", 1)
        if body.get("n", 1) != 1:
            raise BadRequest("n must be 1 on this engine", "n")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise BadRequest("top_p must be a number above 0 and at most 1", "top_p")
        stop = body.get("stop") or []
        self.stop = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(self.stop, list)
            or len(self.stop) > 4
            or not all(isinstance(s, str) and s for s in self.stop)
        ):
            raise BadRequest("stop must be a string or a list of up to 4 non-empty strings", "stop")
        self.seed = body.get("seed")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise BadRequest("seed must be a whole number", "seed")
        self.stream = body.get("stream", False)
        if not isinstance(self.stream, bool):
            raise BadRequest("stream must be true or false", "stream")
        usage = (body.get("stream_options") or {}).get("include_usage", False)
        self.include_usage = usage is True


class Model:
    def __init__(self, folder, served_name, version, threads=1):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        self.context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.name, self.version = served_name, version
        self.lock = threading.Lock()  # one generation at a time: the CPU replica has one core

    def generate(self, prompt, options, cancelled=None):
        """Yield the completion's new text piece by piece (held back where a stop string may begin);
        the generator's return value is (finish_reason, usage). Setting `cancelled` stops it."""
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be a non-empty string", "prompt")
        max_tokens, temperature = options.max_tokens, options.temperature
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
            raise BadRequest(f"max_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}", "max_tokens")
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise BadRequest("temperature must be a number from 0 to 2", "temperature")
        if isinstance(prompt, ChatPrompt):
            ids = torch.tensor([prompt.ids])
        else:
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        if ids.shape[1] + max_tokens > self.context:
            raise BadRequest(
                f"This model's maximum context length is {self.context} tokens; the prompt has {ids.shape[1]} "
                f"and max_tokens asks for {max_tokens} more",
                "prompt",
                "context_length_exceeded",
            )
        cancelled = cancelled or threading.Event()

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return cancelled.is_set()

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        made = {}

        def work():
            with self.lock, torch.no_grad():
                if options.seed is not None:
                    torch.manual_seed(options.seed)
                sampled = temperature > 0
                made["out"] = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_tokens,
                    do_sample=sampled,
                    temperature=temperature if sampled else None,
                    top_p=options.top_p if sampled else None,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([Cancelled()]),
                )

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        text, sent, stopped, ended = "", 0, False, False
        hold = max((len(stop) for stop in options.stop), default=1) - 1
        try:
            for piece in streamer:
                text += piece
                cuts = [text.find(stop) for stop in options.stop if stop in text]
                if cuts:
                    text, stopped = text[: min(cuts)], True
                    cancelled.set()
                    break
                if len(text) - hold > sent:
                    yield text[sent : len(text) - hold]
                    sent = len(text) - hold
            else:
                ended = True
        finally:
            # Stopped, or the reader went away (GeneratorExit): the generation stops at its next token;
            # drain what it still puts out (an ended streamer has nothing more, and would block).
            cancelled.set()
            if not ended:
                for _ in streamer:
                    pass
            worker.join()
        if len(text) > sent:
            yield text[sent:]
        new = len(self.tokenizer(text)["input_ids"]) if stopped else int(made["out"].shape[1] - ids.shape[1])
        finish = "stop" if stopped or new < max_tokens else "length"
        return finish, {"prompt_tokens": int(ids.shape[1]), "completion_tokens": new,
                        "total_tokens": int(ids.shape[1] + new)}  # fmt: skip

    def complete(self, prompt, options):
        """(text, finish_reason, usage) of a whole completion."""
        pieces = self.generate(prompt, options)
        text = []
        while True:
            try:
                text.append(next(pieces))
            except StopIteration as done:
                finish, usage = done.value
                return "".join(text), finish, usage


class ChatPrompt(str):
    """A chat request rendered with the model's template (the text) and its token ids, BOS included as
    the template places it: what SFT trained the model on (recipes/node/chat.py)."""

    def __new__(cls, text, ids):
        made = super().__new__(cls, text)
        made.ids = ids
        return made


def chat_prompt(model, messages):
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise BadRequest("each message needs a role and a string content", "messages")
    turns = [{"role": m.get("role", "user"), "content": m["content"]} for m in messages]
    return ChatPrompt(*chat_format.prompt_ids(model.tokenizer, turns))


class Counter:
    """Requests being answered (a drain stops the replica once this is 0)."""

    def __init__(self):
        self.value, self.lock = 0, threading.Lock()

    def __enter__(self):
        with self.lock:
            self.value += 1

    def __exit__(self, *exc):
        with self.lock:
            self.value -= 1


def handler_for(model, token=""):
    busy = Counter()

    class Handler(BaseHTTPRequestHandler):
        server_version = "tcc-replica/1"
        protocol_version = "HTTP/1.1"

        def admitted(self):
            """With a token, every path but /health wants `Authorization: Bearer <token>`: the router holds
            it; a job of anyone else's on the node that finds the port does not."""
            given = self.headers.get("Authorization", "").encode()
            if not token or hmac.compare_digest(given, f"Bearer {token}".encode()):
                return True
            self.answer(HTTPStatus.UNAUTHORIZED, {"error": {
                "message": "this replica answers its endpoint's router only", "type": "invalid_request_error",
                "param": None, "code": "invalid_api_key"}})  # fmt: skip
            return False

        def log_message(self, format, *args):  # one line per request, no bodies
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

        def answer(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("X-Model-Version", model.version)
            self.end_headers()
            self.wfile.write(raw)

        def stream(self, events):
            """Server-sent events, written as they come; the connection closes after [DONE]. A reader
            that went away ends the generation (closing `events` cancels it)."""
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.send_header("X-Model-Version", model.version)
            self.end_headers()
            self.close_connection = True
            try:
                for event in events:
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                events.close()

        def do_GET(self):
            if self.path == "/health":
                return self.answer(HTTPStatus.OK, {"status": "ok", "version": model.version, "in_flight": busy.value})
            if not self.admitted():
                return None
            if self.path == "/v1/models":
                return self.answer(HTTPStatus.OK, {"object": "list", "data": [
                    {"id": model.name, "object": "model", "created": 0, "owned_by": "tcc", "version": model.version}
                ]})  # fmt: skip
            self.answer(HTTPStatus.NOT_FOUND, error("no such path", code="not_found"))

        def do_POST(self):
            if not self.admitted():
                return
            with busy:
                self.post()

        def post(self):
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise BadRequest("the body is too large")
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    raise BadRequest("the body must be JSON") from None
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
                if self.path == "/predict":
                    return self.answer(HTTPStatus.OK, predict(model, body))
                if self.path not in FIELDS:
                    return self.answer(HTTPStatus.NOT_FOUND, error("no such path", code="not_found"))
                options = Options(body, self.path)
                chat = self.path == "/v1/chat/completions"
                prompt = chat_prompt(model, body.get("messages")) if chat else body.get("prompt")
                if options.stream:
                    pieces = model.generate(prompt, options)
                    first = next(pieces, None)  # a bad request fails here, before the 200 is sent
                    return self.stream(chunks(model, chat, first, pieces, options))
                text, finish, usage = model.complete(prompt, options)
                self.answer(HTTPStatus.OK, whole(model, chat, text, finish, usage))
            except BadRequest as exc:
                self.answer(HTTPStatus.BAD_REQUEST, error(str(exc), exc.param, exc.code))

    return Handler


def error(message, param=None, code=None):
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def base(model, kind, request_id=None):
    return {"id": request_id or f"cmpl-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": model.name, "system_fingerprint": model.version}  # fmt: skip


def whole(model, chat, text, finish, usage):
    """OpenAI's text_completion or chat.completion."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        return {**base(model, "chat.completion"), "choices": [choice], "usage": usage}
    choice = {"text": text, "index": 0, "finish_reason": finish}
    return {**base(model, "text_completion"), "choices": [choice], "usage": usage}


def chunks(model, chat, first, pieces, options):
    """OpenAI's streaming chunks for a completion whose first piece is `first` (or None)."""
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text, finish=None, role=False):
        if chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"text": text, "index": 0, "finish_reason": finish}
        return {**base(model, kind, request_id), "choices": [choice]}

    try:
        if chat:
            yield chunk("", role=True)
        if first is not None:
            yield chunk(first)
        while True:
            try:
                yield chunk(next(pieces))
            except StopIteration as done:
                finish, usage = done.value if done.value else ("stop", None)
                break
        yield chunk("", finish)
        if options.include_usage and usage:
            yield {**base(model, kind, request_id), "choices": [], "usage": usage}
    finally:
        pieces.close()  # the reader went away: stop generating


def predict(model, body):
    """The managed service's shape: {"instances": [...]} -> {"predictions": [...]}."""
    instances = body.get("instances")
    if not isinstance(instances, list) or not 1 <= len(instances) <= 32:
        raise BadRequest("instances must be a list of 1 to 32 prompts", "instances")
    predictions = []
    for instance in instances:
        if isinstance(instance, str):
            instance = {"prompt": instance}
        if not isinstance(instance, dict):
            raise BadRequest("each instance is a prompt or {prompt, max_tokens}", "instances")
        options = Options({"max_tokens": instance.get("max_tokens", 16)})
        text, _, _ = model.complete(instance.get("prompt"), options)
        predictions.append(text)
    return {"predictions": predictions, "deployedModelId": model.version}


def advertised_address():
    """The address other machines reach this node on (the route's source address), for the announce file."""
    if os.environ.get("TCC_ADVERTISE_ADDRESS"):
        return os.environ["TCC_ADVERTISE_ADDRESS"]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def announce(path, port, version, bound=""):
    """Write {host, port, version} to `path` whole (beside, then renamed): the console reads it."""
    path = Path(path)
    staging = path.with_name(path.name + ".partial")
    host = bound if bound and bound != "0.0.0.0" else advertised_address()
    staging.write_text(json.dumps({"host": host, "port": port, "version": version, "pid": os.getpid()}))
    staging.rename(path)
    print(f"[serve] {version} on port {port}", flush=True)


def bind_address(bind):
    """The address to listen on: with "node", the one Slurm has for this job's node (NodeAddr: what the
    router connects to); "" or "0.0.0.0" is every address."""
    if bind != "node":
        return bind or "0.0.0.0"
    node = os.environ.get("SLURMD_NODENAME", "")
    try:
        shown = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                               timeout=30, check=True).stdout if node else ""  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        shown = ""
    found = re.search(r"\bNodeAddr=(\S+)", shown)
    if found:
        return found.group(1)
    # Without Slurm's answer no guess: the route's source address may not be the one the router uses.
    print(f"[serve] Slurm named no address for node {node or '?'}: listening on every address", flush=True)
    return "0.0.0.0"


def bind_in(host, ports):
    """A TCP socket bound to `host` on a free port of `ports` ("LOW-HIGH"; "" for any): the range the cluster's
    firewall opens to the console's router (gce: a rule per cluster for exactly this range)."""
    if not ports:
        candidates = [0]
    else:
        low, _, high = ports.partition("-")
        candidates = list(range(int(low), int(high or low) + 1))
        random.shuffle(candidates)  # replicas starting together on one node do not all try the same first
    for port in candidates:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
    raise SystemExit(f"[serve] no free port in {ports} on {host}")


class ReplicaServer(ThreadingHTTPServer):
    daemon_threads = True
    # Connections a burst may leave waiting for accept(): Python's default of 5 had the kernel drop the
    # SYNs beyond it, each retried 1 s later (then 3, 7, ... s): seconds of latency from nothing but a
    # burst of new connections (routers starting, health checks beside requests).
    request_queue_size = 1024


def listening(host, ports, handler):
    """The replica's HTTP server, listening on `host` on a free port of `ports` (bind_in)."""
    server = ReplicaServer((host, 0), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = bind_in(host, ports)  # already bound: the port is taken from the range, not 0
    server.server_address = server.socket.getsockname()
    server.server_name, server.server_port = host, server.server_address[1]  # what server_bind would set
    server.server_activate()
    return server


def free_port(host="0.0.0.0", ports=""):
    """A port of `ports` free now (vLLM binds it itself a moment later)."""
    with bind_in(host, ports) as probe:
        return probe.getsockname()[1]


ENGINE_STOP_GRACE = 20  # seconds an engine has to finish after SIGTERM before it is killed


def die_with_parent():
    """In the engine's process, before exec: the kernel sends it SIGKILL when this wrapper dies, even by
    SIGKILL (PR_SET_PDEATHSIG), so an engine never outlives its replica."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def stop_engine(server):
    """SIGTERM to the engine now, SIGKILL after the grace period if it is still there. It does not wait
    (a signal handler may run inside Popen.wait, whose lock it holds): the caller's wait() ends once the
    engine has."""
    if server.returncode is None:
        server.terminate()
        killer = threading.Timer(ENGINE_STOP_GRACE, lambda: server.returncode is None and server.kill())
        killer.daemon = True
        killer.start()


def chat_template_file(model, folder):
    """vLLM uses a model folder's own chat template; for a folder without one (a model whose tokenizer
    was saved before templates, or an HF folder lacking it), the console's format in a file of the
    replica's `folder`, so vLLM asks as the CPU replica and SFT do. None when the folder has its own."""
    config = Path(model) / "tokenizer_config.json"
    try:
        own = json.loads(config.read_text()).get("chat_template") if config.exists() else None
    except ValueError:
        own = None
    if own or (Path(model) / "chat_template.jinja").exists():
        return None
    path = Path(folder) / "chat_template.jinja"
    path.write_text(chat_format.TEMPLATE)
    return path


def serve_vllm(args, timeout=1800):
    """GPU partitions: vLLM's own OpenAI-compatible server on the node's GPUs (it must be installed in
    the nodes' image), announced once its /health answers; this process lives as long as it does, and
    the engine as long as this process: a SIGTERM or SIGINT here (scancel, the reconcile's drain) stops
    the engine first. vLLM's answers do not name the version: the router adds X-Model-Version from its
    table."""
    host = bind_address(args.bind)
    port = free_port(host, args.ports)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
               "--served-model-name", args.served_name, "--host", host, "--port", str(port),
               "--tensor-parallel-size", str(args.gpus), "--dtype", "bfloat16"]  # fmt: skip
    template = chat_template_file(args.model, Path(args.announce).parent)
    if template:
        command += ["--chat-template", str(template)]
    # vLLM checks /v1's Authorization against VLLM_API_KEY: from the environment, which other accounts on
    # the node cannot read (an --api-key would show in every `ps`).
    environment = {**os.environ, "VLLM_API_KEY": args.token} if args.token else None
    server = subprocess.Popen(command, preexec_fn=die_with_parent, env=environment)

    def stop(signum, frame):
        stop_engine(server)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return server.returncode or 1
        try:
            probe = "127.0.0.1" if host == "0.0.0.0" else host
            with urllib.request.urlopen(f"http://{probe}:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        stop_engine(server)
        server.wait()
        return 1
    announce(args.announce, port, args.version, host)
    return server.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face format folder")
    parser.add_argument("--served-name", required=True)
    parser.add_argument("--version", required=True, help="name:vN, echoed in every answer")
    parser.add_argument("--announce", required=True, help="where to write {host, port, version} once ready")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--gpus", type=int, default=1, help="vLLM's tensor parallel size")
    parser.add_argument("--token-file", help="a file (0600) holding the bearer token the router sends")
    parser.add_argument("--bind", default="", help='"node": Slurm\'s address for this node alone; an address; '
                        'default every address')  # fmt: skip
    parser.add_argument("--ports", default="", help='"LOW-HIGH": listen on a free port of this range (default any)')
    args = parser.parse_args(argv)
    args.token = Path(args.token_file).read_text().strip() if args.token_file else ""
    if args.engine == "vllm":
        return serve_vllm(args)
    model = Model(args.model, args.served_name, args.version, args.threads)
    host = bind_address(args.bind)
    server = listening(host, args.ports, handler_for(model, args.token))
    announce(args.announce, server.server_address[1], args.version, host)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
