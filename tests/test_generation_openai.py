"""The OpenAI-compatible backend against a real server process on 127.0.0.1 (`transformers serve` with the tiny
local model, offline), and its retries against a small local HTTP server that answers 429/5xx/slowly on purpose
(`FlakyEndpointStandIn`: a stand-in for a rate-limited or failing hosted API, which no test may reach)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from test_generation_prompts import rows  # noqa: F401  (the release rows fixture)

from themisto.generation.backends import Sampling, make_backend
from themisto.generation.prompts import render_prompt
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.runs import RunSettings, generate_run
from themisto.release.folder import open_release


def test_generates_against_a_real_transformers_serve_process(served, tiny_model_dir, rows):  # noqa: F811
    backend = make_backend("openai", str(tiny_model_dir), base_url=served, concurrency=2)
    prompts = [render_prompt(rows["next_cell"][0], "next_cell", c) for c in ("none", "variables")]
    out = backend.generate(prompts, Sampling(n=2, max_new_tokens=4))
    assert [len(s) for s in out] == [2, 2]
    for samples in out:
        for g in samples:
            assert g.status == "ok" and g.raw and g.tokens_out == 4 and g.tokens_in > 100, g
    # the variables prompt is longer than the none prompt of the same row, as the server counted it
    assert out[1][0].tokens_in > out[0][0].tokens_in
    assert backend.describe()["backend"] == "openai"


class FlakyEndpointStandIn:
    """A loopback HTTP server that plays a failing OpenAI-compatible endpoint: each request takes the next status
    from `script` (the last one repeats); 200 answers a chat completion with `content` (sent as JSON with
    `\\uXXXX` escapes, as Python's json writes it); `delay_s` holds every answer."""

    def __init__(self, script: list[int], delay_s: float = 0.0, content: str = "```python\ndf.shape\n```") -> None:
        self.script, self.delay_s, self.content = list(script), delay_s, content
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stand_in.lock:
                    stand_in.requests.append(body)
                    status = stand_in.script[min(len(stand_in.requests) - 1, len(stand_in.script) - 1)]
                    stand_in.in_flight += 1
                    stand_in.max_in_flight = max(stand_in.max_in_flight, stand_in.in_flight)
                time.sleep(stand_in.delay_s)
                with stand_in.lock:
                    stand_in.in_flight -= 1
                payload = {"error": {"message": f"stand-in status {status}", "type": "x"}}
                if status == 200:
                    payload = {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": stand_in.content}}],
                               "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FlakyEndpointStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _backend(url: str, **options):
    return make_backend("openai", "stand-in-model", base_url=url, backoff_s=0.01, **options)


def _prompt(rows):  # noqa: F811
    return render_prompt(rows["next_cell"][0], "next_cell", "none")


def test_rate_limits_and_server_errors_are_retried(rows):  # noqa: F811
    with FlakyEndpointStandIn([429, 500, 200]) as endpoint:
        ((g,),) = _backend(endpoint.url, max_retries=3).generate([_prompt(rows)], Sampling(max_new_tokens=5))
    assert g.status == "ok" and g.raw == "```python\ndf.shape\n```" and (g.tokens_in, g.tokens_out) == (11, 5)
    assert len(endpoint.requests) == 3 and endpoint.requests[0]["max_tokens"] == 5


def test_past_the_retries_a_sample_is_recorded_as_failed_with_the_reason(rows):  # noqa: F811
    with FlakyEndpointStandIn([503]) as endpoint:
        ((g,),) = _backend(endpoint.url, max_retries=2).generate([_prompt(rows)], Sampling())
    assert g.status == "failed" and "HTTP 503" in g.reason and "after 3 attempts" in g.reason
    assert len(endpoint.requests) == 3
    with FlakyEndpointStandIn([400]) as endpoint:  # a client error is not retried
        ((g,),) = _backend(endpoint.url, max_retries=2).generate([_prompt(rows)], Sampling())
    assert g.status == "failed" and "HTTP 400" in g.reason and len(endpoint.requests) == 1


def test_a_timeout_is_retried_then_recorded(rows):  # noqa: F811
    with FlakyEndpointStandIn([200], delay_s=1.0) as endpoint:
        ((g,),) = _backend(endpoint.url, max_retries=1, timeout_s=0.3).generate([_prompt(rows)], Sampling())
    assert g.status == "failed" and "Timeout" in g.reason and "after 2 attempts" in g.reason


def test_concurrency_is_bounded(rows):  # noqa: F811
    prompts = [render_prompt(r, "next_cell", "none") for r in rows["next_cell"][:6]]
    with FlakyEndpointStandIn([200], delay_s=0.15) as endpoint:
        out = _backend(endpoint.url, concurrency=2).generate(prompts, Sampling())
    assert all(s[0].status == "ok" for s in out) and len(endpoint.requests) == 6
    assert endpoint.max_in_flight == 2


def test_a_run_against_a_failing_endpoint_records_every_failure(small_release, tmp_path):
    settings = RunSettings(ExampleSpec(tasks=("output_prediction",), contexts=("none", "variables"), limit=3),
                           backend="openai", model="stand-in-model", sampling=Sampling(n=2))
    with FlakyEndpointStandIn([500]) as endpoint:
        report = generate_run(open_release(small_release), tmp_path / "run", settings,
                              backend=_backend(endpoint.url, max_retries=1), progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * 2 * 2 and report.counts == {"generations": 12, "failed": 12}
    assert all(r["status"] == "failed" and "HTTP 500" in r["reason"] and r["prediction"] == "" for r in lines)
