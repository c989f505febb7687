"""Trained heads as a drafter for a loaded target."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from torch import nn

from specdec.drafters.recipe import is_choice
from specdec.heads import store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.nets import EagleHead, HeadsConfig, build
from specdec.runtime import model_runtime
from specdec.theory import best_speedup_by_position


@dataclass
class Heads:
    """Loaded heads of one kind for one target model; ``drafter(target)`` makes a drafter
    for one request's backend over that model (EAGLE's drafter holds a per-request cache)."""

    config: HeadsConfig
    net: nn.Module
    output: nn.Module  # the target's output layer, trimmed to the heads' vocabulary

    def drafter(self, target):
        from specdec.drafters.heads import EagleDrafter, MedusaDrafter

        if self.config.kind == "medusa":
            return MedusaDrafter(target, self.net, self.output)
        return EagleDrafter(target, self.net, self.output, target.model.get_input_embeddings())


def load_drafter(kind: str, target, cache_dir: str | None = None, target_name: str = "target"):
    """A ``MedusaDrafter`` or ``EagleDrafter`` over ``target`` (an ``HFModel``)."""
    return load_heads(kind, target, cache_dir, target_name).drafter(target)


def load_heads(kind: str, target, cache_dir: str | None = None, target_name: str = "target"):
    """The heads of ``kind`` trained for ``target`` (an ``HFModel``); ValueError with the
    next step if there are none, or they are another target's, or damaged."""
    from specdec.backends.hf import HFModel

    if not isinstance(target, HFModel):
        raise ValueError(
            f"--drafter {kind} reads the target's hidden states, which only the transformers "
            "runtime gives: use --target-runtime transformers"
        )
    fingerprint = target_fingerprint(target.model)
    entry = store.entry_dir(cache_dir, fingerprint, target_name)
    payload, state = store.load(entry, kind, fingerprint)
    config = HeadsConfig.from_dict(payload)
    net = build(config)
    try:
        net.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{entry}: {kind} heads do not fit their config ({error})") from None
    return drafting(config, net, target.model)


def drafting(config: HeadsConfig, net: nn.Module, model) -> Heads:
    """Trained ``net`` (quantized in place) as the heads that draft beside the target
    ``model``: on int4 or int8 as ``quantize`` says, over its output layer trimmed to the
    heads' vocabulary."""
    from specdec.backends.trim import TrimmedHead

    net = quantize(net, int4=config.kind == "eagle" and eagle_on_int4(model)).eval()
    output = TrimmedHead(model.get_output_embeddings(), config.token_ids, config.vocab_size)
    return Heads(config, net, output)


def quantize(net: nn.Module, int4: bool = False) -> nn.Module:
    """The heads' linear layers in int8 (``RowInt8Linear``, as the target's): a draft step
    reads a quarter of the bytes. Drafts need no batch invariance, only that ``draft_probs``
    be the distribution sampled from, which holds for any weights.

    EAGLE's input layer ``fc`` stays float32 in int8: its input row joins a token embedding
    (values around 0.01) to a feature with outlier dimensions (hundreds), and one int8 scale
    per row rounds the whole embedding to zero, which blinds the head to the token it is
    told. Measured on held-out code: first-draft acceptance 0.38 with ``fc`` in int8.

    ``int4`` (EAGLE beside an int4 target): the whole head on the int4 runtime, ``fc``
    included, and the layer on its row kernels. int4 activations are scaled per group of 32
    inputs, so the embedding's groups keep their own scales. Measured beside the int4 1.5B
    on the AMD EPYC (2 code and 2 chat prompts, greedy): 2.0-2.2 ms a draft against 4.0-4.4
    with the int8 layer and float32 ``fc``, acceptance alike (15/42, 21/45, 8/42, 11/39
    against 15/38, 19/41, 3/26, 12/38)."""
    from specdec.backends.quant.convert import make_int4_batch_invariant
    from specdec.backends.quant.int4 import RowInt4Linear, fits
    from specdec.backends.quant.int8 import RowInt8Linear

    if int4 and isinstance(net, EagleHead):
        net.body = make_int4_batch_invariant(net.body)
        if fits(net.fc):
            net.fc = RowInt4Linear(net.fc)  # type: ignore[assignment]  # fc's int4 form
        return net
    for module in list(net.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and not (module is net and name == "fc"):
                setattr(module, name, RowInt8Linear(child))
    return net


NO_HEADS = "no heads trained and evaluated for this target"


# ``--drafter auto`` for one prompt of this many tokens or more (``generate``): where heads are
# trained and the draft model is picked, the heads with prompt lookup in front instead.
LONG_PROMPT = 64


def auto_recipe(
    target,
    cache_dir: str | None = None,
    target_name: str = "target",
    can_choose: bool = True,
    lookup_in_front: bool = True,
    prompt_tokens: int | None = None,
):
    """``--drafter auto``: (recipe, why). Prompt lookup in front of the drafter predicted fastest
    (``_auto_drafter``; not in front of a choice) when ``lookup_in_front``, as for ``generate``
    and ``bench``; ``serve`` leaves it out, for under load on chat it ran behind the drafter
    alone: ``python bench/load.py --concurrency 4,8 --workloads code,chat --bursts 2 --modes
    batched --drafter D`` on the int8 pair, two pairs of runs in ABBA order, lookup+model over
    model at 4 and 8 clients 0.947 and 0.928, then 0.83 and 0.80 on chat, 0.945-1.00 on code
    (bench/results/2026-12-01-lookup-in-front-epyc-avx512/load1-4; not understood yet); again at
    4 chat clients 0.82 and 0.80, while ahead at 1 and 8 editing clients
    (bench/results/2026-12-01-lookup-under-load-epyc-avx512). Single-stream, a copy from the
    prompt is taken where it matches 2+ tokens and copies have paid in the run
    (``drafters.lookup``, ``controller.FallbackK``). Measured on the AMD EPYC (Zen 4, 2 cores,
    int4 target, the 90-minute EAGLE head), run by run over the bench's four workloads, three
    runs, chat / code / edit / summary: in front of EAGLE 1.010 / 0.985 / 1.261 / 1.427, 1.011 /
    1.041 / 1.152 / 1.499 and 1.095 / 0.966 / 1.158 / 1.431 of EAGLE alone; in front of the 0.5B
    draft 1.003 / 1.029 / 1.095 / 1.290 of it (docs/notes/heads.md, "Prompt lookup in front")."""
    found = _predictions(target, cache_dir, target_name)
    recipe, why = _auto_drafter(found, can_choose)
    if lookup_in_front and prompt_tokens is not None and prompt_tokens >= LONG_PROMPT:
        heads = _long_prompt_heads(recipe, found)
        if heads is not None:
            return f"lookup+{heads}", (
                f"{why}; a prompt of {prompt_tokens} tokens (>= {LONG_PROMPT}): the {heads} "
                "heads, which need no prefill of their own, with prompt lookup in front"
            )
    if lookup_in_front and not is_choice(recipe):
        return f"lookup+{recipe}", why
    return recipe, why


def _long_prompt_heads(recipe: str, found: tuple[dict[str, float], bool, str] | None) -> str | None:
    """The heads kind a long prompt drafts with instead of the draft model ``recipe`` names
    (the one predicted fastest in ``found``, ``_predictions``), or None: ``recipe`` is not
    the draft model, or no heads are predicted above plain decoding.

    Why: ``heads eval``'s prediction counts neither the draft model's prefill of the prompt
    (about a third of the target's, before the first draft) nor its catching up on the
    tokens prompt lookup copied, and the heads, reading the target's own features, pay
    neither; on edits and summaries, whose replies copy from long prompts, lookup+eagle ran
    ahead of lookup+model where the prediction put the draft model first, and behind it on
    short code prompts (docs/notes/heads.md, "By the prompt's length")."""
    if recipe != "model" or found is None:
        return None
    predicted = {kind: x for kind, x in found[0].items() if kind != "model" and x > 1.0}
    return max(predicted, key=lambda kind: predicted[kind]) if predicted else None


def _predictions(
    target, cache_dir: str | None, target_name: str
) -> tuple[dict[str, float], bool, str] | None:
    """The speedups ``heads eval`` predicted on this machine by drafter kind, whether on
    unseen prompts, and the target runtime they were made with: this target's, else int8's
    where only those have heads among them. None: not a target heads draft for."""
    from specdec.backends.hf import HFModel

    if not isinstance(target, HFModel):
        return None
    entry = store.entry_dir(cache_dir, target_fingerprint(target.model), target_name)
    evals = store.read_evals(entry)
    runtime = model_runtime(target.model)
    predicted, on_unseen = _predicted(evals, runtime, entry)
    if not set(predicted) - {"model"} and runtime != "int8":
        (predicted, on_unseen), runtime = _predicted(evals, "int8", entry), "int8"
    return predicted, on_unseen, runtime


def _auto_drafter(
    found: tuple[dict[str, float], bool, str] | None, can_choose: bool
) -> tuple[str, str]:
    """The drafter with the highest speedup predicted by ``specdec heads eval`` on this
    machine (acceptance on the target's replies to unseen prompts, else on held-out chunks;
    measured costs) among trained heads and the draft model; ``model`` when no heads are
    trained or evaluated.

    Where the draft model was evaluated too, the one predicted fastest drafts alone. A
    choice of both (``model/eagle``: each round the one measured faster) ran behind the
    faster drafter alone: on the AMD EPYC (Zen 4), int4 target, 90-minute EAGLE head, three
    bench runs over the four workloads, by median 1-15% behind EAGLE alone in 11 of 12
    workload-runs (its switches and the rounds it gives the other member cost more than
    its picks gain), while EAGLE alone ran level with the draft model on code and 4-16%
    ahead on chat, editing and summaries (docs/notes/heads.md, "Adaptive k that drafts again").
    Where heads are predicted fastest but the draft model was not evaluated, nothing says
    which of the two is faster, so both as a choice when ``can_choose`` (k auto and a draft
    model at hand): a weak 12-minute EAGLE head taken alone made the README's quicksort
    prompt 1.15x, the choice 1.27x and 1.31x, the draft model 1.46-1.50x (AMD EPYC, int4).

    Costs differ by target runtime (an int4 step is about half an int8 one), so the
    evaluations made with this target's runtime are used (``heads eval --dtype``); where
    there are none with heads among them, those made with the int8 target, saying so."""
    if found is None:
        return "model", "heads need the transformers runtime"
    predicted, on_unseen, runtime = found
    if not set(predicted) - {"model"}:
        return "model", NO_HEADS
    best = max(predicted, key=lambda kind: predicted[kind])
    if best != "model" and "model" not in predicted and predicted[best] <= 1.0:
        return "model", f"{best} heads are predicted at {predicted[best]:.2f}x only"
    listed = ", ".join(f"{kind} {speedup:.2f}x" for kind, speedup in sorted(predicted.items()))
    basis = (
        "the target's replies to unseen prompts"
        if on_unseen
        else "held-out text of the heads' training sources, which favours them; "
        "'specdec heads eval' again predicts on unseen prompts"
    )
    why = f"predicted by 'specdec heads eval' on this machine ({runtime} target, {basis}): {listed}"
    if best != "model" and can_choose and "model" not in predicted:
        # no prediction to compare with: measure both online
        why += "; the draft model not evaluated ('specdec heads eval --kind model')"
        return f"model/{best}", f"{why}; both drafting, each round the one measured faster"
    if best != "model" and "model" in predicted:
        # which drafter is faster depends on the text, and online choices between the two ran
        # behind the better one (docs/notes/heads.md, "Which drafter for which prompts")
        why += (
            "; to compare the two on your own prompts: specdec bench --workload-file FILE "
            f"--systems lookup+model-auto,lookup+{best}-auto"
        )
    return best, why


def _predicted(
    evals: dict[tuple[str, str], dict], runtime: str, entry
) -> tuple[dict[str, float], bool]:
    """Predicted speedups by drafter kind of the evaluations made with a ``runtime`` target,
    of drafters still there, and whether they are on the target's replies to unseen prompts
    (``evaluate.UNSEEN_PROMPTS``: where every one of them measured those), else on held-out
    chunks."""
    results = {
        kind: result
        for (kind, evaluated_on), result in evals.items()
        if evaluated_on == runtime
        and "predicted_speedup" in result
        and (kind == "model" or store.current(entry, kind) is not None)
    }
    unseen = bool(results) and all("unseen_prompts" in result for result in results.values())
    shared = _shared_verify_costs(list(results.values()))
    predicted = {
        kind: _prediction(result["unseen_prompts"] if unseen else result, result, shared)
        for kind, result in results.items()
    }
    return predicted, unseen


def _shared_verify_costs(results: list[dict]) -> dict[int, float] | None:
    """By pass size, the median of the verify costs the compared evaluations measured; None
    where fewer than two are compared or one has none.

    Why: each evaluation times the target's passes itself, minutes apart on a shared
    machine, and the drafters' predictions moved with those moments more than with their
    drafts: over its own curve each, one make's heads were put ahead of the draft model on
    code, the reverse of what the bench measured; over the shared one, in its order
    (bench/results/2026-12-07-heads-make-code-replies-zen4-epyc-avx512)."""
    curves: list[dict] = [result.get("v_by_size") or {} for result in results]
    if len(curves) < 2 or not all(curves):
        return None
    sizes = set.intersection(*(set(curve) for curve in curves))
    return {int(n): statistics.median(float(curve[n]) for curve in curves) for n in sizes}


def _prediction(scored: dict, result: dict, shared: dict[int, float] | None) -> float:
    """The speedup predicted from ``scored`` (``result`` or its unseen prompts' part):
    recomputed over the ``shared`` verify costs from its acceptance and the draft's cost
    ``result`` measured, else as ``heads eval`` saved it."""
    acceptance, c = scored.get("acceptance_by_position"), result.get("c_per_draft")
    if shared is not None and acceptance and c is not None:
        recomputed = best_speedup_by_position(list(acceptance), float(c), shared)
        if recomputed is not None:
            return recomputed
    return float(scored["predicted_speedup"])


def eagle_on_int4(model: nn.Module) -> bool:
    """Whether an EAGLE head beside ``model`` runs on the int4 runtime (``quantize``): beside
    an int4 target, and beside an int8 one wherever the int4 kernel builds (a draft needs no
    particular numbers, only its own ``draft_probs``). Measured beside the int8 1.5B on the
    AMD EPYC (`python bench/eagle_int4.py --target-runtime int8`): docs/notes/heads.md, "EAGLE on
    int4 beside an int8 target"."""
    from specdec.backends.quant import kernels

    runtime = model_runtime(model)
    return runtime == "int4" or (runtime == "int8" and kernels.kernel_or_none() is not None)
