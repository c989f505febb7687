"""Request bodies of the OpenAI API subset we serve, validated by pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator


class _Common(BaseModel):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="extension: keep the k most likely tokens")
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    # Extensions for speculation (vLLM calls the first one num_speculative_tokens too).
    num_speculative_tokens: int | Literal["auto"] | None = None
    drafter: str | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _non_negative(cls, value):
        if isinstance(value, int) and value < 0:
            raise ValueError("num_speculative_tokens must be >= 0 or 'auto'")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def token_budget(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class CompletionRequest(_Common):
    prompt: str | list[str]

    def prompt_text(self) -> str:
        """The one prompt (the validator has unwrapped a one-element list)."""
        assert isinstance(self.prompt, str), "validated to one string"
        return self.prompt

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("give one prompt (a string or a list of one string)")
            value = value[0]
        if not value:
            raise ValueError("prompt is empty")
        return value


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
