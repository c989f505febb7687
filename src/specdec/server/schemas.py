"""Request bodies of the OpenAI API subset we serve, validated by pydantic.

Strict: numbers must be JSON numbers (``true`` or ``"3"`` is refused, not coerced), fields
this server does not implement are refused by name, and OpenAI fields with a neutral value
(``suffix: null``) are accepted only with that value.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from specdec.config import MAX_TOP_LOGPROBS, REPETITION_RANGE, Constraint
from specdec.server.tools import Function, ToolUse


def _valid_text(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} contains a lone surrogate (not valid Unicode)") from None
    return value


MAX_PROMPTS = 128  # a completion request's prompts (each with its n choices)


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """A completion's ``prompt`` as a list of prompts: a list of texts or of id lists as it
    is, one text or one list of ids (an empty one included) in a list of its own."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return cast(list[str | list[int]], prompt)
    return [cast(str | list[int], prompt)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class JsonSchemaFormat(_Strict):
    name: str = "output"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('json_schema goes with type "json_schema" (and only with it)')
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Prediction(_Strict):
    """OpenAI's predicted output: text the output is expected to be, mostly (its tokens are
    drafts; the output stays the target's)."""

    type: Literal["content"]
    content: str | list[TextPart]

    @field_validator("content")
    @classmethod
    def _text(cls, value):
        text = value if isinstance(value, str) else "".join(part.text for part in value)
        return _valid_text(text, "prediction")

    def text(self) -> str:
        assert isinstance(self.content, str), "validated to its text"
        return self.content


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(
        default=1.0,
        ge=0.0,
        le=2.0,
        description="0 is greedy; so is anything below 1.2e-38, where float32 cannot divide",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="extension: keep the k most likely tokens")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = None
    n: int = Field(
        default=1,
        ge=1,
        le=128,
        description="choices to generate; choice i of a seeded request is the request with "
        "seed + i",
    )
    stream: bool = False
    stream_options: dict[str, bool] | None = Field(
        default=None,
        description="include_usage: every chunk has usage null and one more, with no "
        "choices, ends the stream with the usage (without it the last choice's last chunk "
        "carries the usage); with it, continuous_usage_stats (vLLM's): every chunk of a "
        "choice carries that choice's prompt and completion tokens so far instead of null",
    )
    user: str | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="token id (as a string) -> bias in [-100, 100]"
    )
    repetition_penalty: float = Field(
        default=1.0,
        ge=REPETITION_RANGE[0],
        le=REPETITION_RANGE[1],
        description="extension (vLLM's): 1 is off; > 1 penalises repeats",
    )
    prediction: Prediction | None = Field(
        default=None,
        description="predicted output: its tokens are drafted while the output follows it",
    )
    # vLLM's extensions to end the output
    ignore_eos: bool = Field(default=False, description="extension: EOS does not end the output")
    min_tokens: int = Field(
        default=0,
        ge=0,
        description="extension: neither EOS, nor a stop token or string, ends the output "
        "before it has this many tokens",
    )
    stop_token_ids: list[int] | None = Field(
        default=None,
        max_length=256,
        description="extension: token ids that end the output as EOS does (not in the text)",
    )
    prompt_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="extension (vLLM's): each prompt token's log-probability, rank and this "
        "many most likely tokens (the first null); not streamed",
    )
    # Extensions for speculation (vLLM calls the first one num_speculative_tokens too).
    num_speculative_tokens: int | Literal["auto"] | None = None
    drafter: str | None = None
    verification: Literal["auto", "rejection", "coupled"] = "auto"
    # Structured output: OpenAI's response_format, and vLLM's names for a regular expression
    # and a grammar (llguidance's Lark syntax) as extensions.
    response_format: ResponseFormat | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _prompt_logprobs_whole(self):
        if self.stream and self.prompt_logprobs is not None:
            raise ValueError("prompt_logprobs are not streamed (vLLM's rule): stream: false")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value):
        for key, bias in (value or {}).items():
            if not key.isdecimal():
                raise ValueError(f"logit_bias keys are token ids written as strings, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for {key}")
        return value

    def bias(self) -> dict[int, float]:
        """``SamplingParams.logit_bias``: the token ids as integers."""
        return {int(key): bias for key, bias in (self.logit_bias or {}).items()}

    @field_validator("num_speculative_tokens")
    @classmethod
    def _non_negative(cls, value):
        if isinstance(value, int) and value < 0:
            raise ValueError("num_speculative_tokens must be >= 0 or 'auto'")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_text(cls, value):
        for text in [value] if isinstance(value, str) else value or []:
            _valid_text(text, "stop")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def token_budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def constraint(self) -> Constraint | None:
        """What the output must follow (``SamplingParams.constraint``), if anything."""
        given = []
        form = self.response_format
        if form is not None and form.type == "json_object":
            given.append(Constraint("json_object"))
        if form is not None and form.json_schema is not None:
            given.append(Constraint("json_schema", json.dumps(form.json_schema.schema_)))
        if self.guided_regex is not None:
            given.append(Constraint("regex", self.guided_regex))
        if self.guided_grammar is not None:
            given.append(Constraint("lark", self.guided_grammar))
        if len(given) > 1:
            raise ValueError("give one of response_format (json), guided_regex and guided_grammar")
        return given[0] if given else None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text or its token ids, or a list of several (each completed as a "
        "request of its own: choice index = prompt's place x n + choice)"
    )
    max_tokens: int | None = Field(
        default=None,
        ge=0,
        description="0 only with echo: the prompt scored, nothing generated (OpenAI's)",
    )
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="each token's log-probability and this many most likely tokens (raw model)",
    )
    echo: bool = Field(
        default=False,
        description="the prompt before the completion in each choice (with logprobs: its "
        "tokens' too, the first's null)",
    )
    best_of: int | None = Field(
        default=None,
        ge=1,
        le=128,
        description="completions to make (>= n), of which the n with the highest mean "
        "log-probability per token are returned; not streamed",
    )
    suffix: str | None = Field(
        default=None,
        description="fill in the middle: the text after the completion (the model's own "
        "fill-in-the-middle tokens around the prompt and it)",
    )

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value):
        prompts = _prompt_list(value)
        for prompt in prompts:
            if isinstance(prompt, list):
                if not prompt:
                    raise ValueError("prompt is empty")
                if any(token < 0 for token in prompt):
                    raise ValueError("prompt token ids must be >= 0")
            else:
                _valid_text(prompt, "prompt")
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts a request, got {len(prompts)}")
        return value

    @field_validator("suffix")
    @classmethod
    def _suffix_text(cls, value):
        return value if value is None else _valid_text(value, "suffix")

    @model_validator(mode="after")
    def _something_to_complete(self):
        empty = any(prompt == "" for prompt in self.prompts())
        if empty and self.suffix is None:  # before a suffix, "" is a file's start
            raise ValueError("prompt is empty")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 goes with echo (the prompt scored, nothing generated)")
        if self.scores_only() and self.min_tokens:
            raise ValueError("min_tokens must be 0 with max_tokens 0")
        return self

    def scores_only(self) -> bool:
        """``echo`` with ``max_tokens`` 0: the prompt (and its tokens' logprobs) returned,
        nothing generated; how lm-evaluation-harness and others score a text."""
        return self.echo and self.max_tokens == 0

    def token_budget(self, default: int) -> int:
        """Scoring only: 1, the token the prompt's pass gives anyway (not returned)."""
        return 1 if self.scores_only() else super().token_budget(default)

    def prompts(self) -> list[str | list[int]]:
        """The prompts to complete, each a text or its token ids."""
        return _prompt_list(self.prompt)

    def logprobs_wanted(self) -> int | None:
        """``SamplingParams.logprobs``: None, or how many most likely tokens to return."""
        return self.logprobs

    def prompt_logprobs_wanted(self) -> int | None:
        """``SamplingParams.prompt_logprobs``: the request's own, else an echoed prompt's,
        with ``logprobs`` (vLLM's rule)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


class CalledFunction(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI gives it back


class CallInHistory(_Strict):
    """An earlier reply's tool call, sent back in ``messages``."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[CallInHistory] | None = None
    tool_call_id: str | None = None  # a tool's answer: the call it answers
    refusal: None = None  # OpenAI's clients send a reply back with it

    @field_validator("content")
    @classmethod
    def _content_text(cls, value):
        if value is None:
            return value
        text = value if isinstance(value, str) else "".join(part.text for part in value)
        return _valid_text(text, "content")

    @model_validator(mode="after")
    def _calls_of_a_reply(self):
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls go with an assistant message")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is needed (only an assistant's tool calls go without)")
        for call in self.tool_calls or []:
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                raise ValueError("tool_calls: function.arguments must be a JSON object's text")
        return self

    def as_template_message(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.content or ""}
        if self.tool_calls:  # templates take the arguments as an object (transformers' form)
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": json.loads(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.role == "tool" and self.name is not None:
            message["name"] = self.name
        return message


class FunctionSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False},
        description="the arguments' JSON schema (none given: no arguments, as OpenAI's)",
    )
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str


class NamedTool(_Strict):
    type: Literal["function"]
    function: NamedFunction


class _Turn(_Strict):
    """How a conversation's prompt ends (vLLM's fields): with the assistant's turn opened
    (the default), as the conversation stands, or inside its last message, whose text the
    model goes on with (a prefill of the reply)."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool | None = Field(
        default=None,
        description="end the prompt with the assistant's turn opened (vLLM's; left out: true, "
        "or false with continue_final_message); false: the conversation as it stands",
    )
    continue_final_message: bool = Field(
        default=False,
        description="leave the last message open: the model goes on with its text, e.g. the "
        "beginning of a reply (vLLM's); add_generation_prompt true with it is a 400",
    )

    @field_validator("continue_final_message")
    @classmethod
    def _one_ending(cls, value, info):
        if value and info.data.get("add_generation_prompt"):
            raise ValueError(
                "goes on with the last message: add_generation_prompt must be false or left out"
            )
        return value

    def opens_turn(self) -> bool:
        """Whether the prompt ends with the assistant's turn opened."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    def reply_role(self) -> str:
        """The role of the reply (vLLM's rule): the assistant's where the prompt opens its
        turn, else the last message's, which the model goes on with or after."""
        return "assistant" if self.opens_turn() else self.messages[-1].role


class ChatCompletionRequest(_Common, _Turn):
    logprobs: bool | None = Field(
        default=None, description="each token's log-probability (raw model)"
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="with logprobs: this many most likely tokens at each position",
    )

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    echo: bool = Field(
        default=False,
        description="the reply's content begins with the last message's where that is in the "
        "reply's role (vLLM's): with continue_final_message, the whole text continued",
    )

    @field_validator("echo")
    @classmethod
    def _echo_without_tools(cls, value, info):
        if value and info.data.get("tools") and info.data.get("tool_choice") != "none":
            raise ValueError('goes without tools (or with tool_choice "none")')
        return value

    def echoed(self) -> str | None:
        """The text the reply's content begins with (``echo``; None: none)."""
        last = self.messages[-1]
        if not self.echo or last.role != self.reply_role():
            return None
        assert last.content is None or isinstance(last.content, str)  # parts joined
        return last.content or ""

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @model_validator(mode="after")
    def _tools_fit(self):
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise ValueError("tools: each function needs a name of its own")
        choice = self.tool_choice
        if isinstance(choice, NamedTool) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no function {choice.function.name!r} in tools")
        if choice == "required" and not names:
            raise ValueError('tool_choice "required" needs tools')
        other = (self.response_format is not None and self.response_format.type != "text") or (
            self.guided_regex is not None or self.guided_grammar is not None
        )
        if other and self.tool_use() is not None:
            raise ValueError(
                'give tools or response_format (or guided_*), not both, or tool_choice "none"'
            )
        return self

    def tool_use(self) -> ToolUse | None:
        """What the model may do with the tools (None: no tools, or tool_choice "none")."""
        choice = self.tool_choice or "auto"
        if not self.tools or choice == "none":
            return None
        functions = [Function(t.function.name, t.function.parameters) for t in self.tools]
        if isinstance(choice, NamedTool):
            functions = [f for f in functions if f.name == choice.function.name]
        return ToolUse(
            functions=tuple(functions),
            required=choice != "auto",
            parallel=self.parallel_tool_calls is not False,
        )

    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template shows them to the model (none for "none")."""
        if self.tool_use() is None:
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools or []]

    def logprobs_wanted(self) -> int | None:
        """``SamplingParams.logprobs``: None, or how many most likely tokens to return."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def prompt_logprobs_wanted(self) -> int | None:
        """``SamplingParams.prompt_logprobs``: the conversation's, where asked for."""
        return self.prompt_logprobs


CompletionBody = CompletionRequest | ChatCompletionRequest  # what the two routes take


class TokenizeText(_Strict):
    """vLLM's ``/tokenize`` of a completion's prompt: the ids ``/v1/completions`` gives it."""

    model: str | None = None
    prompt: str = Field(min_length=1)
    add_special_tokens: bool = True
    return_token_strs: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_text(cls, value):
        return _valid_text(value, "prompt")


class TokenizeChat(_Turn):
    """vLLM's ``/tokenize`` of a conversation: the ids ``/v1/chat/completions`` gives it
    (its template, ending as ``add_generation_prompt`` / ``continue_final_message`` say,
    ``tools`` shown)."""

    model: str | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False

    def template_tools(self) -> list[dict] | None:
        return [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None


def _tokenize_kind(body: Any) -> str:
    """A ``/tokenize`` body with ``messages`` is a conversation's, any other a prompt's (so
    that a bad one is told what is wrong with it as what it is, not as the other kind)."""
    return "TokenizeChat" if isinstance(body, dict) and "messages" in body else "TokenizeText"


TokenizeBody = Annotated[
    Annotated[TokenizeText, Tag("TokenizeText")] | Annotated[TokenizeChat, Tag("TokenizeChat")],
    Discriminator(_tokenize_kind),
]


class Detokenize(_Strict):
    """vLLM's ``/detokenize``: token ids back to their text."""

    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)
