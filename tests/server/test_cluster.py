"""specdec serve on Ray Serve: two replicas of tiny models behind Ray's proxy, on loopback.

Slow (a local Ray instance starts in seconds, replicas in more). Checks: the official openai
client gets answers from both replicas, greedy outputs equal a single-process server's,
and a replica killed mid-run is replaced while requests to the endpoint keep succeeding.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from helpers import char_tokenizer, perturbed_copy, tiny_llama
from servers import MODEL, Running, free_port

ray = pytest.importorskip("ray", reason="Ray Serve (the cluster extra) is not installed")
pytestmark = pytest.mark.slow

PROMPTS = [f"replica {c} {c * 3}" for c in "abcdefghijkl"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-models")
    tokenizer = char_tokenizer()
    target = tiny_llama(seed=0)
    for name, model in (("target", target), ("draft", perturbed_copy(target, 0.03, seed=1))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


@pytest.fixture(scope="module")
def cluster(model_dirs):
    from ray import serve

    from specdec.server import cluster
    from specdec.server.setup import ServerConfig

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    port = free_port()
    config = ServerConfig(
        target=str(model_dirs[0]),
        draft=str(model_dirs[1]),
        dtype="float32",
        k=3,
        threads=1,
        model_name=MODEL,
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = cluster.build_application(config, replicas=2, replica_cpus=0.5)
        serve.run(app, name=cluster.APP_NAME, route_prefix="/", blocking=False)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def complete(url: str, prompt: str, retries: int = 0):
    for attempt in range(retries + 1):
        try:
            return client(url).completions.create(
                model=MODEL, prompt=prompt, max_tokens=12, temperature=0.0
            )
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
            if attempt == retries:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def test_both_replicas_answer_and_outputs_equal_a_single_server(cluster, model_dirs):
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda p: complete(cluster, p), PROMPTS * 2))
    replicas = {answer.system_fingerprint for answer in answers}
    assert len(replicas) == 2, f"answered by {replicas}"
    tokenizer = char_tokenizer()
    from specdec.loading import load_hf

    target = load_hf(model_dirs[0], "float32").model
    draft = load_hf(model_dirs[1], "float32").model
    single = Running(target, draft, tokenizer, max_active=4, max_queue=32)
    try:
        for prompt, answer in zip(PROMPTS * 2, answers, strict=True):
            alone = complete(single.url, prompt)
            assert answer.choices[0].text == alone.choices[0].text, prompt
    finally:
        single.close()


def test_a_killed_replica_is_replaced_and_requests_keep_succeeding(cluster):
    names = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if "SERVE_REPLICA" in actor["name"]
    ]
    assert len(names) == 2
    errors: list[Exception] = []
    texts: list[str] = []
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            try:
                texts.append(complete(cluster, PROMPTS[0], retries=20).choices[0].text)
            except Exception as error:  # noqa: BLE001 - collected and asserted on below
                errors.append(error)

    threads = [threading.Thread(target=traffic) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        alive = [
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if "SERVE_REPLICA" in actor["name"] and actor["name"] != names[0]
        ]
        if len(alive) == 2:
            break
        time.sleep(1)
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    assert len(alive) == 2, "the killed replica was not replaced"
    assert not errors, errors[:3]
    assert texts and len(set(texts)) == 1, "every answer is the same greedy text"
