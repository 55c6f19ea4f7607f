"""One inference replica: a model version's Hugging Face format folder served over an OpenAI-compatible
HTTP API, run as a Slurm job on a cluster node. CPU partitions (the tiny profiles) run the small
transformers server below; GPU partitions run vLLM's OpenAI server (`--engine vllm`), announced the
same way.

    python -m recipes.node.serve --model FOLDER --served-name NAME --version NAME:vN --announce FILE [--engine vllm]

    GET  /health                   200 once the model is loaded
    GET  /v1/models                {"object": "list", "data": [{"id": NAME, ...}]}
    POST /v1/completions           {"prompt", "max_tokens"=16, "temperature"=0} -> OpenAI's text_completion
    POST /v1/chat/completions      {"messages": [{"role", "content"}], ...}     -> OpenAI's chat.completion
    POST /predict                  {"instances": ["text" | {"prompt", "max_tokens"}]} -> {"predictions": [...]}

Every answer names the version that produced it (`system_fingerprint`, and `X-Model-Version`). A bad
body or a prompt longer than the model's context is a 400 in OpenAI's error shape
({"error": {"message", "type": "invalid_request_error", "param", "code"}}). The replica binds an
ephemeral port on every address and writes {"host", "port", "version"} to --announce once it is
ready: the console reads it through the cluster agent and routes to it.
"""

import argparse
import json
import os
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

# torch and the libraries on top of it are imported inside the functions that use them (start-up cost:
# torch alone takes about 1.4 s), so `--help`, the health agent and the console's imports stay fast.

MAX_BODY = 1 << 20
MAX_NEW_TOKENS = 256


class BadRequest(Exception):
    def __init__(self, message, param=None, code=None):
        super().__init__(message)
        self.param, self.code = param, code


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

    def complete(self, prompt, max_tokens=16, temperature=0.0):
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be a non-empty string", "prompt")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_NEW_TOKENS:
            raise BadRequest(f"max_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}", "max_tokens")
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
            raise BadRequest("temperature must be a number from 0 to 2", "temperature")
        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        if ids.shape[1] + max_tokens > self.context:
            raise BadRequest(
                f"This model's maximum context length is {self.context} tokens; the prompt has {ids.shape[1]} "
                f"and max_tokens asks for {max_tokens} more",
                "prompt",
                "context_length_exceeded",
            )
        with self.lock, self.torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        new = out[0, ids.shape[1] :]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        finish = "stop" if len(new) < max_tokens else "length"
        return text, finish, {"prompt_tokens": int(ids.shape[1]), "completion_tokens": len(new),
                              "total_tokens": int(ids.shape[1] + len(new))}  # fmt: skip


def chat_prompt(messages):
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    lines = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise BadRequest("each message needs a role and a string content", "messages")
        lines.append(f"{message.get('role', 'user')}: {message['content']}")
    return "\n".join(lines) + "\nassistant:"


def handler_for(model):
    class Handler(BaseHTTPRequestHandler):
        server_version = "tcc-replica/1"
        protocol_version = "HTTP/1.1"

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

        def do_GET(self):
            if self.path == "/health":
                return self.answer(HTTPStatus.OK, {"status": "ok", "version": model.version})
            if self.path == "/v1/models":
                return self.answer(HTTPStatus.OK, {"object": "list", "data": [
                    {"id": model.name, "object": "model", "created": 0, "owned_by": "tcc", "version": model.version}
                ]})  # fmt: skip
            self.answer(HTTPStatus.NOT_FOUND, error("no such path", code="not_found"))

        def do_POST(self):
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
                route = {"/v1/completions": completions, "/v1/chat/completions": chat, "/predict": predict}
                if self.path not in route:
                    return self.answer(HTTPStatus.NOT_FOUND, error("no such path", code="not_found"))
                self.answer(HTTPStatus.OK, route[self.path](model, body))
            except BadRequest as exc:
                self.answer(HTTPStatus.BAD_REQUEST, error(str(exc), exc.param, exc.code))

    return Handler


def error(message, param=None, code=None):
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def base(model, kind):
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()), "model": model.name,
            "system_fingerprint": model.version}  # fmt: skip


def completions(model, body):
    text, finish, usage = model.complete(body.get("prompt"), body.get("max_tokens", 16), body.get("temperature", 0))
    return {**base(model, "text_completion"), "choices": [{"text": text, "index": 0, "finish_reason": finish}],
            "usage": usage}  # fmt: skip


def chat(model, body):
    prompt = chat_prompt(body.get("messages"))
    text, finish, usage = model.complete(prompt, body.get("max_tokens", 16), body.get("temperature", 0))
    message = {"role": "assistant", "content": text}
    return {**base(model, "chat.completion"), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage}  # fmt: skip


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
        text, _, _ = model.complete(instance.get("prompt"), instance.get("max_tokens", 16), 0)
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


def announce(path, port, version):
    """Write {host, port, version} to `path` whole (beside, then renamed): the console reads it."""
    path = Path(path)
    staging = path.with_name(path.name + ".partial")
    staging.write_text(json.dumps({"host": advertised_address(), "port": port, "version": version,
                                   "pid": os.getpid()}))  # fmt: skip
    staging.rename(path)
    print(f"[serve] {version} on port {port}", flush=True)


def free_port():
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
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


def serve_vllm(args, timeout=1800):
    """GPU partitions: vLLM's own OpenAI-compatible server on the node's GPUs (it must be installed in
    the nodes' image), announced once its /health answers; this process lives as long as it does, and
    the engine as long as this process: a SIGTERM or SIGINT here (scancel, the reconcile's drain) stops
    the engine first. vLLM's answers do not name the version: the router adds X-Model-Version from its
    table."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
               "--served-model-name", args.served_name, "--host", "0.0.0.0", "--port", str(port),
               "--tensor-parallel-size", str(args.gpus)]  # fmt: skip
    server = subprocess.Popen(command, preexec_fn=die_with_parent)

    def stop(signum, frame):
        stop_engine(server)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return server.returncode or 1
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        stop_engine(server)
        server.wait()
        return 1
    announce(args.announce, port, args.version)
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
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        return serve_vllm(args)
    model = Model(args.model, args.served_name, args.version, args.threads)
    server = ThreadingHTTPServer(("0.0.0.0", 0), handler_for(model))
    server.daemon_threads = True
    announce(args.announce, server.server_address[1], args.version)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
