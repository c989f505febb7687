"""``specdec chat`` on two local model directories (tiny models with a chat template)."""

import io
import signal
import sys

import pytest

from specdec import SamplingParams, SpecConfig
from specdec.bench.tiny import char_tokenizer
from specdec.cli import build_parser, main
from specdec.cli import output as cli_output
from specdec.cli.generate import build_engine
from specdec.prompting import chat_ids

TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
FLAGS = ["--max-tokens", "8", "--dtype", "int8", "-k", "2"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory, target_model, draft_model):
    root = tmp_path_factory.mktemp("chat-models")
    tokenizer = char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    for name, model in (("target", target_model), ("draft", draft_model)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return ["--target", str(root / "target"), "--draft", str(root / "draft")]


def alone(chat_dirs, messages, ignore_eos: bool = False) -> str:
    """The reply a fresh engine (empty caches) gives this conversation, greedy."""
    args = build_parser().parse_args(["generate", "x", *chat_dirs, *FLAGS])
    engine, _ = build_engine(args, args.drafter)
    ids = chat_ids(engine.target.tokenizer, messages)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=ignore_eos)
    return engine.generate(ids, params, SpecConfig(k=2)).text


def chat(chat_dirs, monkeypatch, lines: str, *extra: str) -> int:
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    return main(["chat", *chat_dirs, *FLAGS, *extra])


def test_each_reply_is_the_engines_alone_and_the_conversation_goes_on(
    chat_dirs, monkeypatch, capsys
):
    """Piped messages, one a line: each reply is what a fresh engine gives the whole
    conversation so far (the caches kept between turns change nothing), the system
    message first; /reset forgets, /exit ends (later lines unread); only replies on
    stdout, a summary line each on stderr."""
    assert chat(chat_dirs, monkeypatch, "ab\n\ncd\n/reset\ncd\n/exit\nzz\n", "--system", "s") == 0
    captured = capsys.readouterr()
    system = {"role": "system", "content": "s"}
    first = alone(chat_dirs, [system, {"role": "user", "content": "ab"}])
    second = alone(
        chat_dirs,
        [
            system,
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "cd"},
        ],
    )
    fresh = alone(chat_dirs, [system, {"role": "user", "content": "cd"}])
    assert captured.out == f"{first}\n{second}\n{fresh}\n"
    assert len([line for line in captured.err.splitlines() if "tok/s" in line]) == 3
    assert "forgotten" in captured.err


def test_ctrl_c_stops_a_reply_after_its_round_and_the_chat_goes_on(chat_dirs, monkeypatch, capsys):
    """Ctrl-C while a reply streams ends that reply after the round under way (finish:
    stopped), not the program; the stopped reply stays in the conversation as far as it
    came, and the next turn answers from there as a fresh engine would."""
    written = []
    real = cli_output.write_chunk

    def interrupted(chunk, *args, **kwargs):
        real(chunk, *args, **kwargs)
        written.append(chunk.text)
        if len(written) == 1:
            signal.raise_signal(signal.SIGINT)  # as a terminal's Ctrl-C

    monkeypatch.setattr(cli_output, "write_chunk", interrupted)
    assert chat(chat_dirs, monkeypatch, "ab\ncd\n", "--ignore-eos") == 0
    captured = capsys.readouterr()
    assert "finish: stopped" in captured.err
    partial = written[0]
    whole = alone(chat_dirs, [{"role": "user", "content": "ab"}], ignore_eos=True)
    assert whole.startswith(partial) and len(partial) < len(whole), (partial, whole)
    after = alone(
        chat_dirs,
        [
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": partial},
            {"role": "user", "content": "cd"},
        ],
        ignore_eos=True,
    )
    assert captured.out == f"{partial}\n{after}\n"


def test_a_model_without_a_chat_template_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    from specdec.bench.tiny import tiny_llama

    model, tokenizer = tiny_llama(seed=0), char_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert (
        main(["chat", "--target", str(tmp_path / "m"), "--drafter", "none", "--dtype", "int8"]) == 2
    )
    err = capsys.readouterr().err
    assert "no chat template" in err.strip().splitlines()[-1] and "Traceback" not in err, err


def test_a_message_past_the_context_is_reported_and_the_chat_goes_on(
    chat_dirs, monkeypatch, capsys
):
    """A turn longer than the model's context (256 positions here) is one error line and
    is left out of the conversation; the next message is answered as if it had not been."""
    too_long = "a" * 300
    assert chat(chat_dirs, monkeypatch, f"ab\n{too_long}\ncd\n") == 0
    captured = capsys.readouterr()
    assert "error" in captured.err and "Traceback" not in captured.err
    first = alone(chat_dirs, [{"role": "user", "content": "ab"}])
    second = alone(
        chat_dirs,
        [
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "cd"},
        ],
    )
    assert captured.out == f"{first}\n{second}\n"
