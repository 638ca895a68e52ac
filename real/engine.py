"""The speculative-decoding engine (batch 1), driven by any ``control`` controller.

Each round: ``controller.decide(now_s)`` -> the drafter proposes up to k tokens (stopping below
τ) -> ONE target forward over ``[last token + drafted]`` under a causal mask -> the longest valid
prefix plus one target token is committed -> an ``Observation`` with measured seconds goes to
``controller.observe`` and a ``RoundRecord`` is kept. The target's KV cache is static, sized
``max_len + k_max + 1``; rollback is not advancing the position.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from control.configio import param
from control.errors import DSparkError
from control.types import Decision, Observation, RoundRecord
from real import DRAFTERS
from real.checkpoint import DTYPES
from real.sampling import SamplingParams, verify_greedy, verify_sampling, verify_threshold


@dataclass(frozen=True)
class EngineConfig:
    # 16: above the controllers' k range [3, 15] (DESIGN.md), so no decision is cut.
    k_max: int = param(16, lo=0, hi=64, doc="largest draft length a round may use")
    # 1024 tokens of context: prompts + outputs of the benchmarks fit with room to spare.
    max_len: int = param(1024, lo=8, hi=2048, doc="longest sequence (prompt + output)")
    # greedy by default: lossless and token-identical to target-only decoding.
    temperature: float = param(0.0, lo=0.0, hi=10.0, doc="sampling temperature (0 = greedy)")
    top_k: int = param(0, lo=0, hi=65536, doc="top-k filter (0 = off)")
    top_p: float = param(1.0, lo=0.0, hi=1.0, doc="top-p (nucleus) filter (1 = off)")
    seed: int = param(0, lo=0, hi=2**31 - 1, doc="seed of the sampling generator")
    device: str = param("cpu", choices=("cpu", "cuda"), doc="device of both models")
    # bf16 target: 2x less memory traffic; verifying 9 tokens ~ 1 token on this CPU.
    target_dtype: str = param("bfloat16", choices=tuple(DTYPES), doc="target precision")
    # drafters stay fp32 (issue 4): their confidences feed the controllers.
    drafter_dtype: str = param("float32", choices=tuple(DTYPES), doc="drafter precision")
    # the seed's drafter.
    drafter: str = param("conv", choices=DRAFTERS,
                         doc="which drafter (ngram+X: prompt lookup, else model X)")
    # shorter matches are often coincidences that a model drafter continues better.
    lookup_min_match: int = param(4, lo=1, hi=32, doc="ngram+X: match length that triggers lookup")
    # stop at the end-of-text token, as a user would; benchmarks turn it off.
    stop_at_eot: bool = param(True, doc="stop after emitting the end-of-text token")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


@dataclass
class Generation:
    tokens: list[int]
    records: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0
    text: str = ""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Engine:
    """Speculative decoding with ``target`` (a ``real.models`` model) and a drafter object."""

    def __init__(self, target: torch.nn.Module, drafter, config: EngineConfig | None = None,
                 tokenizer=None, eot_id: int | None = None,
                 sentence_end_ids: frozenset[int] = frozenset()) -> None:
        self.cfg = c = config or EngineConfig()
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.device = c.device
        self.dtype = next(target.parameters()).dtype
        self.length = c.max_len + c.k_max + 1
        self.state = target.new_state(self.length, self.dtype, self.device)
        self.seq = torch.zeros(1, self.length, dtype=torch.long, device=self.device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(c.seed)
        self.eot_id = eot_id
        self.sentence_end_ids = sentence_end_ids
        if self.drafter is not None and hasattr(self.drafter, "state"):
            if self.drafter.state["length"] < self.length:
                raise DSparkError(f"drafter cache holds {self.drafter.state['length']} positions, "
                                  f"engine needs {self.length}")

    # ------------------------------------------------------------------ helpers
    def _check_prompt(self, prompt_ids, max_new_tokens: int) -> list[int]:
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise DSparkError("empty prompt: at least one token is needed")
        if len(ids) + max_new_tokens > self.cfg.max_len:
            raise DSparkError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                              f"exceeds max_len {self.cfg.max_len}")
        return ids

    def _prefill(self, ids: list[int]) -> int:
        L = len(ids)
        self.seq[0, :L] = torch.tensor(ids, dtype=torch.long, device=self.device)
        if L > 1:
            self.target.step(self.seq[:, :L - 1], 0, self.state)
        if self.drafter is not None:
            self.drafter.reset()
        return L

    def _reseed(self) -> None:
        self.gen.manual_seed(self.cfg.seed)

    # ------------------------------------------------------------------ decoding
    @torch.inference_mode()
    def stream(self, prompt_ids, max_new_tokens: int, controller, request_id: int = 0,
               records: list | None = None) -> Iterator[list[int]]:
        """Yield the tokens committed by each round (a list per round)."""
        c, sp = self.cfg, self.cfg.sampling
        ids = self._check_prompt(prompt_ids, max_new_tokens)
        self._reseed()
        controller.reset()
        L = self._prefill(ids)
        end = L + max_new_tokens
        seq, dev = self.seq, self.device
        t_start = time.perf_counter()
        rnd = 0
        name = getattr(controller, "name", "")
        while L < end:
            now = time.perf_counter() - t_start
            dec: Decision = controller.decide(now)
            k = max(0, min(dec.k, c.k_max, end - L - 1))
            if self.drafter is None:
                k = 0
            t0 = time.perf_counter()
            drafted, confs, q = (self.drafter.propose(seq, L, k, dec.tau, sp, self.gen)
                                 if k else (0, [], None))
            _sync(dev)
            t1 = time.perf_counter()
            logits = self.target.step(seq[:, L - 1:L + drafted], L - 1, self.state)
            draft = seq[0, L:L + drafted]
            if dec.mode == "threshold":
                n, nxt, lossy = verify_threshold(draft, logits, dec.beta, sp, self.gen)
            elif sp.greedy:
                n, nxt, lossy = verify_greedy(draft, logits)
            else:
                n, nxt, lossy = verify_sampling(draft, q if drafted else None, logits, sp,
                                                self.gen)
            seq[0, L + n] = nxt
            _sync(dev)
            t2 = time.perf_counter()
            if self.drafter is not None:
                self.drafter.accept(L, drafted, n)
            out = seq[0, L:L + n + 1].tolist()
            if c.stop_at_eot and self.eot_id is not None and self.eot_id in out:
                out = out[:out.index(self.eot_id) + 1]
                end = L + len(out)
            ends = tuple(i for i, t in enumerate(out) if t in self.sentence_end_ids)
            obs = Observation(now_s=t2 - t_start, drafted=drafted, accepted=n,
                              confidences=tuple(confs), draft_s=t1 - t0, verify_s=t2 - t1,
                              context_tokens=L, lossy_accepts=lossy, emitted=len(out),
                              sentence_ends=ends)
            controller.observe(obs)
            if records is not None:
                records.append(RoundRecord.from_round(request_id, rnd, dec, obs, name))
            rnd += 1
            L += len(out)
            yield out

    def generate(self, prompt_ids, max_new_tokens: int, controller,
                 request_id: int = 0) -> Generation:
        records: list[RoundRecord] = []
        t0 = time.perf_counter()
        toks: list[int] = []
        for piece in self.stream(prompt_ids, max_new_tokens, controller, request_id, records):
            toks.extend(piece)
        g = Generation(toks, records, time.perf_counter() - t0)
        if self.tokenizer is not None:
            g.text = self.tokenizer.decode(toks)
        return g

    def stream_text(self, prompt_ids, max_new_tokens: int, controller) -> Iterator[str]:
        """Text pieces as they become printable (byte-level BPE may split a character)."""
        toks: list[int] = []
        shown = ""
        for piece in self.stream(prompt_ids, max_new_tokens, controller):
            toks.extend(piece)
            text = self.tokenizer.decode(toks)
            if text.endswith("\ufffd"):
                continue
            yield text[len(shown):]
            shown = text
        text = self.tokenizer.decode(toks)
        if len(text) > len(shown):
            yield text[len(shown):]

    @torch.inference_mode()
    def greedy_reference(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """Target-only greedy decoding (the baseline): one token per forward, no drafter."""
        ids = self._check_prompt(prompt_ids, max_new_tokens)
        L = self._prefill(ids)
        seq, step, st = self.seq, self.target.step, self.state
        out = []
        for _ in range(max_new_tokens):
            nxt = step(seq[:, L - 1:L], L - 1, st)[-1].argmax()
            seq[0, L] = nxt
            L += 1
            if self.cfg.stop_at_eot and self.eot_id is not None:
                t = int(nxt)
                out.append(t)
                if t == self.eot_id:
                    break
        if not (self.cfg.stop_at_eot and self.eot_id is not None):
            out = seq[0, len(ids):L].tolist()
        return out

    @torch.inference_mode()
    def sample_reference(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """Target-only sampling with the engine's sampling parameters and generator."""
        from real.sampling import probs

        ids = self._check_prompt(prompt_ids, max_new_tokens)
        self._reseed()
        L = self._prefill(ids)
        out = []
        for _ in range(max_new_tokens):
            p = probs(self.target.step(self.seq[:, L - 1:L], L - 1, self.state), self.cfg.sampling)
            t = int(torch.multinomial(p[-1], 1, generator=self.gen))
            self.seq[0, L] = t
            L += 1
            out.append(t)
            if self.cfg.stop_at_eot and t == self.eot_id:
                break
        return out
