"""What a token stands for in OpenAI's logprobs: its UTF-8 bytes, part of a character
included (``detokenizer.token_bytes``)."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from helpers import char_tokenizer
from specdec.detokenizer import _BYTE_LEVEL, token_bytes


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE (as Qwen's and Llama 3's) over the 256 bytes, with "é" merged into one
    token from its two bytes."""
    char_of = {b: char for char, b in _BYTE_LEVEL.items()}
    vocab = {char_of[b]: b for b in range(256)}
    e_acute = "".join(char_of[b] for b in "é".encode())
    vocab |= {e_acute: 256, "<eos>": 257}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[(e_acute[0], e_acute[1])]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def test_byte_level_tokens_are_their_bytes():
    tokenizer = byte_level_tokenizer()
    ids = tokenizer.encode("é a")
    assert ids == [256, 32, 97]
    assert [token_bytes(tokenizer, i) for i in ids] == ["é".encode(), b" ", b"a"]
    assert token_bytes(tokenizer, 0xC3) == b"\xc3"  # half of "é": not text on its own
    assert token_bytes(tokenizer, 257) == b""  # EOS is not part of the text


def test_other_tokens_are_their_text():
    tokenizer = char_tokenizer()
    ids = tokenizer.encode("ab c")
    assert b"".join(token_bytes(tokenizer, i) for i in ids) == b"ab c"
    assert token_bytes(tokenizer, tokenizer.eos_token_id) == b""
