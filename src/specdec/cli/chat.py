"""``specdec chat``: a conversation with the target in the terminal, each reply decoded
speculatively (exactly the target's: greedy replies are plain decoding's) and streamed as
its rounds are verified. The conversation stays in the models' caches from turn to turn, so
a turn computes only what it adds."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TextIO

from specdec.arguments import drafter_kinds
from specdec.cli.generate import add_generate_arguments, build_engine, sampling_params, spec_config
from specdec.config import SamplingParams, SpecConfig
from specdec.prompting import chat_ids

COMMANDS = "/reset forgets the conversation, /exit or Ctrl-D leaves, Ctrl-C stops a reply"


def add_parser(commands) -> None:
    chat = commands.add_parser(
        "chat",
        help="talk with the target model in the terminal (speculative, exact)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "A conversation with the target model through its chat template. Each reply is\n"
            "decoded speculatively and streamed; it is exactly the target's own (greedy:\n"
            "plain decoding's text). The conversation stays in the caches, so a turn\n"
            "computes only its new tokens.\n\n"
            f"At the prompt: {COMMANDS}.\n"
            "Standard input that is not a terminal is read as one message a line\n"
            "(printf 'hi\\nand then?\\n' | specdec chat): only the replies go to stdout."
        ),
    )
    chat.add_argument("--system", metavar="TEXT", help="a system message to begin with")
    add_generate_arguments(chat, chat=True)


def run(args: argparse.Namespace) -> int:
    params, kinds = sampling_params(args), drafter_kinds(args.drafter)
    spec = spec_config(args, kinds)
    opening = [{"role": "system", "content": args.system}] if args.system else []

    def encode(tokenizer: Any, _: argparse.Namespace) -> list[int]:
        # a short first turn: what --drafter auto goes by; a template's absence shows here
        return chat_ids(tokenizer, [*opening, {"role": "user", "content": "hello"}])

    engine, _ = build_engine(args, args.drafter, encode)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        sys.stderr.write(f"specdec chat with {args.target}: {COMMANDS}\n")
    Conversation(engine, params, spec, opening, args.show_drafts).run(read_messages(interactive))
    return 0


def read_messages(interactive: bool) -> Iterator[str]:
    """The user's messages: on a terminal, lines typed after a prompt (line editing where
    Python has readline; Ctrl-C drops the line), else standard input's lines; they end
    with the input."""
    if not interactive:
        yield from (line.rstrip("\n") for line in sys.stdin)
        return
    with suppress(ImportError):
        import readline  # noqa: F401  (input() edits lines and keeps a history with it)
    while True:
        try:
            yield input("you> ")
        except KeyboardInterrupt:
            sys.stderr.write("\n")
        except EOFError:
            sys.stderr.write("\n")
            return


class Conversation:
    """The messages so far and the engine that answers them, turn by turn."""

    def __init__(
        self,
        engine,
        params: SamplingParams,
        spec: SpecConfig,
        opening: list[dict],
        show_drafts: bool = False,
        out: TextIO | None = None,
    ):
        self.engine, self.params, self.spec = engine, params, spec
        self.opening, self.messages = opening, list(opening)
        self.show_drafts, self.out = show_drafts, out or sys.stdout

    def run(self, messages: Iterator[str]) -> None:
        for text in messages:
            command = text.strip()
            if command in ("/exit", "/quit"):
                return
            if command == "/reset":
                self.messages = list(self.opening)
                sys.stderr.write("(conversation forgotten)\n")
                continue
            if command:
                self.turn(text)

    def turn(self, text: str) -> None:
        """Answer ``text``: the reply streamed, kept in the conversation (a reply stopped
        with Ctrl-C as far as it came). A request the engine refuses (a conversation
        longer than the model's context) is reported and left out; the rest stays."""
        from specdec.cli.output import print_summary, write_chunk

        asked = [*self.messages, {"role": "user", "content": text}]
        try:
            prompt_ids = chat_ids(self.engine.target.tokenizer, asked)
            reply, chunks, stopped = "", [], False
            with _ctrl_c_stops() as stop:
                stream = self.engine.stream(prompt_ids, self.params, self.spec)
                try:
                    for chunk in stream:
                        chunks.append(chunk)
                        reply += chunk.text
                        write_chunk(chunk, self.engine.target.tokenizer, self.show_drafts, self.out)
                        if stop.asked and chunk.finish_reason is None:
                            stopped = True  # the reply had more to come
                            break
                finally:
                    stream.close()  # between rounds: the caches hold whole rounds
        except ValueError as error:
            sys.stderr.write(f"specdec: error: {error} (/reset starts again)\n")
            return
        self.out.write("\n")
        self.out.flush()
        if chunks:
            print_summary(chunks[-1], "stopped" if stopped else None)
        self.messages = [*asked, {"role": "assistant", "content": reply}]


class _Stop:
    asked = False


@contextmanager
def _ctrl_c_stops() -> Iterator[_Stop]:
    """Ctrl-C while a reply streams stops it after the round under way (the caches are
    never left inside a pass), not the program; outside the main thread, as it was."""
    stop = _Stop()

    def ask(*_) -> None:
        stop.asked = True

    try:
        before = signal.signal(signal.SIGINT, ask)
    except ValueError:  # not the main thread: signals are not ours to take
        yield stop
        return
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, before)
