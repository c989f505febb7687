import pytest

from helpers import char_tokenizer, perturbed_copy, tiny_llama


@pytest.fixture(scope="session")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="session")
def target_model():
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def draft_model(target_model):
    """Agrees with the target on roughly half of its greedy tokens."""
    return perturbed_copy(target_model, noise=0.03, seed=1)


@pytest.fixture(autouse=True)
def fresh_int4_check():
    """The CLI asks once per process whether the int4 kernel builds; tests that pretend it
    does or does not must not see another test's answer."""
    from specdec import runtime as choosing

    choosing._int4_builds.cache_clear()
    yield
    choosing._int4_builds.cache_clear()


@pytest.fixture
def threads():
    """Tests that set torch's thread count get it back afterwards."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model_dir(tmp_path):
    """The tiny target saved as a model directory, with its tokenizer."""
    directory = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory
