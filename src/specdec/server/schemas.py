"""Request bodies of the OpenAI API subset we serve, validated by pydantic.

Strict: numbers must be JSON numbers (``true`` or ``"3"`` is refused, not coerced), fields
this server does not implement are refused by name, and OpenAI fields with a neutral value
(``logprobs: null``, ``presence_penalty: 0``, ...) are accepted only with that value.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _valid_text(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} contains a lone surrogate (not valid Unicode)") from None
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


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
    n: int = 1
    stream: bool = False
    stream_options: dict[str, bool] | None = None  # usage is always in the last chunk
    user: str | None = None
    # Accepted only at their neutral values: this server does not implement them.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # Extensions for speculation (vLLM calls the first one num_speculative_tokens too).
    num_speculative_tokens: int | Literal["auto"] | None = None
    drafter: str | None = None
    verification: Literal["auto", "rejection", "coupled"] = "auto"

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported (they change the target's distribution)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported")
        return value

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


class CompletionRequest(_Common):
    prompt: str | list[str]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("give one prompt (a string or a list of one string)")
            value = value[0]
        if not value:
            raise ValueError("prompt is empty")
        return _valid_text(value, "prompt")

    @model_validator(mode="after")
    def _neutral_fields(self):
        unsupported = [
            name
            for name, neutral in (("logprobs", None), ("echo", False), ("suffix", None))
            if getattr(self, name) not in (neutral, 0 if name == "logprobs" else neutral)
        ]
        if self.best_of not in (None, 1):
            unsupported.append("best_of")
        if unsupported:
            raise ValueError(f"not supported by this server: {', '.join(unsupported)}")
        return self

    def prompt_text(self) -> str:
        """The one prompt (the validator has unwrapped a one-element list)."""
        assert isinstance(self.prompt, str), "validated to one string"
        return self.prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_text(cls, value):
        text = value if isinstance(value, str) else "".join(part.text for part in value)
        return _valid_text(text, "content")

    def as_template_message(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.content}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @model_validator(mode="after")
    def _neutral_fields(self):
        if self.logprobs or self.top_logprobs:
            raise ValueError("not supported by this server: logprobs")
        return self
