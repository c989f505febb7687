"""Fixtures of the server's tests: the tiny pair on each runtime, a running server on it,
and an openai client."""

import openai
import pytest

from helpers import char_tokenizer, perturbed_copy, tiny_llama
from servers import Running
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant


@pytest.fixture(scope="module", params=["float32", "int8", "int4"])
def models(request):
    """float32: requests take turns, a round each; int8 and int4: every step is one batched
    pass over all active requests (``BatchedModel``)."""
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    if request.param == "int8":
        target, draft = make_int8_batch_invariant(target), make_int8_batch_invariant(draft)
    if request.param == "int4":
        target, draft = make_int4_batch_invariant(target), make_int4_batch_invariant(draft)
    return target, draft, tokenizer


@pytest.fixture(scope="module")
def server(models):
    # prompts longer than 8 tokens join in parts between the other requests' steps
    running = Running(*models, max_active=4, max_queue=32, prefill_rows=8)
    yield running
    running.close()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
