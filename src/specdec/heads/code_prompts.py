"""Built-in code prompts for ``specdec heads data --code``: the standard library's documented
functions cut after their docstrings, for the target to complete as raw code.

Code is drafted where a user's prompt is a signature and a docstring and the target writes the
body; the standard library's text as it stands (``heads data``'s default corpus) is other
people's bodies. So the target writes its own: each prompt is a public top-level function of
this Python's standard library up to the end of its docstring (the source's own lines, its
indentation kept), and the target's completion is the code the heads learn to guess.

The order is fixed and shuffled (a time budget samples every module). Functions named like
one in the shipped benchmarks' prompts or the unseen prompts ``heads eval`` measures on are
left out (``tests/heads/test_heads_data.py`` checks it).
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

MIN_DOCSTRING = 40  # characters: shorter docstrings ("Return x.") say too little to complete
MAX_PROMPT = 1500  # characters: a signature and docstring longer than this is left out


def builtin_code_prompts(files: Iterable[Path], seed: int = 0) -> list[str]:
    """Signature and docstring of each public, documented top-level function in ``files``
    (Python sources), shuffled with ``seed``; functions named as in a benchmark are left out."""
    taken = _benchmark_names()
    prompts = []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name not in taken:
                prompt = _head(node, lines)
                if prompt is not None:
                    prompts.append(prompt)
    random.Random(seed).shuffle(prompts)
    return prompts


def _head(node: ast.FunctionDef, lines: list[str]) -> str | None:
    """``node``'s source up to the end of its docstring, or None if it is not public or has
    no docstring worth completing."""
    if node.name.startswith("_"):
        return None
    first = node.body[0]
    docstring = ast.get_docstring(node)
    if docstring is None or len(docstring) < MIN_DOCSTRING or len(node.body) < 2:
        return None  # a function that is only its docstring has no body to write
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    end = first.end_lineno
    if end is None:
        return None
    text = "".join(lines[start:end])
    return text if len(text) <= MAX_PROMPT else None


def _benchmark_names() -> set[str]:
    """Functions and classes defined in the shipped benchmarks' prompts and the unseen
    prompts: no built-in code prompt is one of them."""
    names: set[str] = set()
    package = resources.files("specdec")
    texts = [package / "bench" / "workloads" / f"{w}.jsonl" for w in ("code", "edit", "summary")]
    texts.append(package / "data" / "unseen_prompts.jsonl")
    for text in texts:
        for line in text.read_text().splitlines():
            prompt = json.loads(line)["prompt"]
            names.update(re.findall(r"(?:def|class)\s+(\w+)", prompt))
    return names
