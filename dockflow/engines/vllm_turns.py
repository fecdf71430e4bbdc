"""Tool-loop turns on vLLM as requests of their own (``VLLMGenerationEngine.turn_stream``): the engine loop of
``vllm.LLM`` driven a step at a time (``LLMEngine.add_request`` / ``step``, what ``LLM.generate`` runs inside),
so a trajectory whose tool answered joins the running batch at the next step (continuous batching) instead of
waiting for the slowest trajectory of its batch (``dockflow.agents.stream_loop``).

Turn ``t`` of trajectory ``k`` samples with its own seed (``turn_seed``): vLLM seeds each request's generator,
so what a turn samples does not depend on which requests share its steps. Tokens in and out as ids; the
log-probs are vLLM's processed ones, as in ``VLLMGenerationEngine.generate``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from dockflow.engines.interfaces import SamplingParams
from dockflow.engines.turn_sampler import TurnLedger
from dockflow.engines.vllm_convert import FINISHED, VLLMOutputError, completion_of, sampling_kwargs

if TYPE_CHECKING:
    from dockflow.engines.vllm_generation import VLLMGenerationEngine


def turn_seed(seed: int, trajectory: int, turn: int) -> int:
    """The seed of one turn's request: distinct for every (trajectory, turn) of a call, within vLLM's int64."""
    return (seed * 1_000_003 + trajectory * 7_919 + turn) % 2**62


class VLLMTurnStream(TurnLedger):
    """``submit`` a trajectory's next turn, ``step`` the engine: the turns that step finished come back as
    ``(k, new ids)``; ``busy`` while any request runs."""

    def __init__(self, engine: VLLMGenerationEngine, tokenizer: Any, params: SamplingParams, seed: int) -> None:
        super().__init__(tokenizer, params)
        engine.ready()  # a pending restore loaded and the memory awake, as before any vLLM call
        self.engine, self.seed = engine, seed
        self.asked: dict[int, int] = defaultdict(int)
        self.running: dict[str, tuple[int, int]] = {}  # request id -> (trajectory, cap)

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def submit(self, k: int, ids: list[int], budget: int) -> bool:
        """Ask for trajectory ``k``'s next turn (at most ``budget`` tokens); False, with nothing asked, when its
        response width is spent."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        cap = self.room(k, ids, budget)
        if cap <= 0:
            return False
        turn = self.asked[k]
        self.asked[k] += 1
        sp = VLLMSamplingParams(**sampling_kwargs(self.params, cap, self.eos, turn_seed(self.seed, k, turn), 1))
        sp.output_kind = RequestOutputKind.FINAL_ONLY  # the finished turn only, as LLM.generate asks
        request_id = f"turn-{k}-{turn}"
        self.engine.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(ids)), sp,
                                               lora_request=self.engine.lora_request())
        self.running[request_id] = (k, cap)
        return True

    def step(self) -> list[tuple[int, list[int]]]:
        """One step of vLLM's engine loop; the turns it finished."""
        done = []
        for out in self.engine.llm.llm_engine.step():
            if not out.finished or out.request_id not in self.running:
                continue
            k, cap = self.running.pop(out.request_id)
            completion = completion_of(out.outputs[0])
            tokens = completion.token_ids[:cap]
            if completion.finish_reason not in FINISHED or (len(tokens) < cap and self.eos not in tokens):
                raise VLLMOutputError(
                    f"vLLM ended trajectory {k}'s turn after {len(tokens)} of {cap} tokens with reason "
                    f"{completion.finish_reason!r}: raise engine.vllm.max_model_len or lower tools.max_total_tokens")
            done.append((k, self.record(k, tokens, completion.logprobs)))
        return done

    def close(self) -> None:
        """Abort what still runs (a trajectory whose tool raised): the engine is left idle for the next call."""
        if self.running:
            self.engine.llm.llm_engine.abort_request(list(self.running))
            self.running.clear()
