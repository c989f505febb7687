"""Prompt text -> token ids: raw completion or the model's chat template."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CODE_STARTS = (
    "def ",
    "class ",
    "import ",
    "from ",
    "#",
    "//",
    "/*",
    "fn ",
    "func ",
    "package ",
    "public ",
    "#include",
    "function ",
    "const ",
    "let ",
    "var ",
    "<?php",
    "<!DOCTYPE",
)


def looks_like_code(prompt: str) -> bool:
    """A code-looking prompt is completed raw; anything else is a chat message."""
    stripped = prompt.strip()
    if not stripped:
        return False
    first_line = stripped.splitlines()[0]
    return first_line.startswith(CODE_STARTS) or prompt.rstrip(" ").endswith((":", "{", "(", "\n"))


def encode_prompt(tokenizer, prompt: str, template: str = "auto") -> list[int]:
    """Token ids of ``prompt``; ``template`` is "raw", "chat" or "auto" (see looks_like_code)."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if template not in ("raw", "chat", "auto"):
        raise ValueError(f"template must be raw, chat or auto, got {template!r}")
    use_chat = template == "chat" or (template == "auto" and not looks_like_code(prompt))
    if use_chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, [{"role": "user", "content": prompt}])
    if use_chat and template == "chat":
        raise ValueError("this model's tokenizer has no chat template: use raw completion")
    return list(tokenizer.encode(prompt))


# Fill-in-the-middle markers of the model families trained with them, in prefix-suffix-middle
# order: the tokens before the prefix, before the suffix, and before the middle to generate.
FIM_MARKERS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder (the default target)
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)

NO_FIM = (
    "suffix needs a model trained to fill in the middle; this tokenizer has none of the "
    f"markers ({', '.join(names[0] for names in FIM_MARKERS)}, ...)"
)


def fim_markers(tokenizer) -> tuple[int, int, int] | None:
    """The ids of the tokenizer's fill-in-the-middle markers (``FIM_MARKERS``), if it has
    a set."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return None
    unknown = getattr(tokenizer, "unk_token_id", None)
    for names in FIM_MARKERS:
        ids = convert(list(names))  # a lookup each; get_vocab() copies the vocabulary
        if all(isinstance(i, int) and i != unknown for i in ids):
            before, after, middle = ids
            return before, after, middle
    return None


def fim_ids(tokenizer, prefix: str | list[int], suffix: str) -> list[int]:
    """Token ids that ask the model for the text between ``prefix`` (a text or its ids)
    and ``suffix``: prefix-suffix-middle with the tokenizer's markers (a ValueError where
    it has none)."""
    markers = fim_markers(tokenizer)
    if markers is None:
        raise ValueError(NO_FIM)
    before, after, middle = markers
    head = prefix if isinstance(prefix, list) else tokenizer.encode(prefix)
    return [before, *head, after, *tokenizer.encode(suffix), middle]


def checked_ids(token_ids: list[int], vocab_size: int, what: str = "prompt token ids") -> list[int]:
    """A prompt given as token ids, each in the vocabulary (else a ValueError naming them,
    ``what`` they are first)."""
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what} outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return list(token_ids)


def chat_ids(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    opens_turn: bool = True,
    continues: bool = False,
) -> list[int]:
    """Token ids of a conversation, ending with the assistant's turn prompt (``opens_turn``),
    as it stands, or inside its last message (``continues``: the model goes on with its
    text); ``tools`` (OpenAI's function definitions) shown to the model by its template. A
    tokenizer without a chat template, a template that refuses the messages (its own
    ``raise_exception``, or any Jinja error), or one that does not show tools is a
    ValueError saying so."""
    import jinja2

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use raw completion")
    ending = {"add_generation_prompt": opens_turn, "continue_final_message": continues}
    try:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, **ending)
        if tools:
            plain, ids = (
                ids,
                tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, **ending),
            )
            if list(_ids(ids)) == list(_ids(plain)):
                raise ValueError("this model's chat template does not show tools to the model")
    except jinja2.TemplateError as error:
        raise ValueError(f"the model's chat template refused these messages: {error}") from None
    return list(_ids(ids))


def _ids(encoded) -> list[int]:
    """``apply_chat_template``'s ids, whether it gives a list or a mapping."""
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded


@dataclass(frozen=True)
class PromptLine:
    """One prompt of a prompt file: its line number, text, template and id (if given)."""

    number: int
    prompt: str
    template: str
    id: str | None


def read_prompt_file(
    path: str | Path,
    flag: str,
    default_template: str = "auto",
    templates: tuple[str, ...] = ("raw", "chat", "auto"),
    json_lines_only: bool = False,
) -> list[PromptLine]:
    """The prompts of a file given with ``flag``: JSON lines (``prompt``, required;
    ``template``, one of ``templates``; ``id``) for a .jsonl file, or for any file when
    ``json_lines_only``; else one prompt a line, ``\\n`` for a newline. Empty lines are
    skipped; a bad line is a ValueError naming the flag, the file and the line."""
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{flag} {path}: cannot read it ({error})") from None
    json_lines = json_lines_only or file.suffix == ".jsonl"
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not json_lines:
            prompts.append(PromptLine(number, line.replace("\\n", "\n"), default_template, None))
            continue
        where = f"{flag} {path}, line {number}"
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"{where}: not valid JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ValueError(f"{where}: needs a non-empty string field 'prompt'")
        template = row.get("template", default_template)
        if template not in templates:
            raise ValueError(
                f"{where}: template must be {' or '.join(templates)}, got {template!r}"
            )
        found_id = row.get("id")
        prompts.append(
            PromptLine(number, row["prompt"], template, None if found_id is None else str(found_id))
        )
    if not prompts:
        raise ValueError(f"{flag} {path}: no prompts in it")
    return prompts
