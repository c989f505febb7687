"""Prompt text -> token ids: raw completion or the model's chat template."""

from __future__ import annotations

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


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation, ending with the assistant's turn prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
