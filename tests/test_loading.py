"""Loading: a pair's tokenizer files parsed once (``loading.tokenizer_of``)."""

from helpers import char_tokenizer
from specdec.loading import tokenizer_of


def test_a_draft_with_the_targets_tokenizer_files_shares_the_parse(tmp_path):
    target, draft, other = tmp_path / "target", tmp_path / "draft", tmp_path / "other"
    tokenizer = char_tokenizer()
    for directory in (target, draft):
        tokenizer.save_pretrained(directory)
    (target / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    (draft / "chat_template.jinja").write_text("draft: {{ messages[0]['content'] }}")
    other_tokenizer = char_tokenizer()
    other_tokenizer.add_tokens(["<extra>"])
    other_tokenizer.save_pretrained(other)
    first, second = tokenizer_of(target), tokenizer_of(draft)
    assert second._tokenizer is first._tokenizer  # one parse of the same bytes
    messages = [{"role": "user", "content": "hi"}]
    assert first.apply_chat_template(messages, tokenize=False) == "hi"
    assert second.apply_chat_template(messages, tokenize=False) == "draft: hi"  # its own
    assert tokenizer_of(target) is first
    assert tokenizer_of(other)._tokenizer is not first._tokenizer  # other files, own parse
    assert len(tokenizer_of(other)) == len(first) + 1
