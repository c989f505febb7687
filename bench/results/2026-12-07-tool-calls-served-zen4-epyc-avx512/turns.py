"""Where a speculative request's time goes (prefill, draft, target), turn by turn, for
conversations of bench/tool_calls.py sent to `specdec serve --port 8794` PASSES times.

    python turns.py weather:required,weather:auto [PASSES]   # from the repository root
"""

import sys

sys.path.insert(0, "bench")
import tool_calls  # noqa: E402
from openai import OpenAI  # noqa: E402
from serving import wait_ready  # noqa: E402

cases = [case.split(":") for case in sys.argv[1].split(",")]
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
wait_ready(8794)
client = OpenAI(base_url="http://127.0.0.1:8794/v1", api_key="unused", timeout=900)
for done in range(passes):
    for name, choice in cases:
        turns = tool_calls.conversation(client, name, choice, True, 96)
        for turn, (seconds, reply) in enumerate(turns, 1):
            st = reply.model_extra["spec_stats"]
            print(
                done,
                name,
                choice,
                turn,
                f"{seconds:.2f}s pre={st['prefill_seconds']:.3f} drf={st['drafter_seconds']:.3f}",
                f"tgt={st['target_seconds']:.3f} rounds={st['rounds']}",
                f"gen={st['generated_tokens']} prompt={st['prompt_tokens']}",
                f"acc={st['accepted_tokens']}/{st['drafted_tokens']}",
            )
