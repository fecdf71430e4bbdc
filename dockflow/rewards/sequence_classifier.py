"""A reward model: a Hugging Face sequence classifier with one label that scores (prompt, response) pairs.

    rm = RewardModel("s3://models/my-rm", cfg.checkpoint, device="cpu", batch_size=64)
    rm.score(["What is 2 + 2?\\nAnswer: "], ["4"])        # [0.73]

What is scored: when the reward model's tokenizer has a chat template (``rm.chat``), the pair as a user turn and
an assistant turn in that template, after ``system_prompt`` as a system turn if given (as TRL and OpenRLHF
format conversations for reward models): pass the task's own prompts then (a conversational row's messages as
they are), not the policy's formatted ones.
Otherwise the plain text ``prompt + response`` with the tokenizer's own special tokens (e.g. BOS). The score is
the head's output at the last non-pad token. Sequences pad on the right (positions then do not depend on the batch, so the scores do not
depend on the batch size) and longer ones lose their beginning, never the response's end.

No Ray here: the reward-model worker (``dockflow.workers.reward_model``) holds one per ``reward.models`` entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from dockflow.config import CheckpointConfig
from dockflow.dtypes import torch_dtype
from dockflow.models.factory import load_tokenizer, missing_model_files
from dockflow.storage.objects import fetch_model
from dockflow.storage.remote import is_s3_uri

MAX_LENGTH = 4096  # when neither the tokenizer nor the config bounds the length


class RewardModelError(ValueError):
    """A reward model cannot be used; the one-line message names its path and what to do."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RewardModel:
    """One reward model, loaded for inference (eval mode, no gradients) on ``device``."""

    def __init__(self, path: str | Path, storage_cfg: CheckpointConfig, device: str | torch.device = "cpu",
                 batch_size: int = 64, dtype: str | torch.dtype = "float32", system_prompt: str | None = None):
        self.path = str(path)
        self.system_prompt = system_prompt
        self.device = torch.device(device)
        self.batch_size = batch_size
        local = self._local_dir(storage_cfg)
        config = self._config(local)
        self.tokenizer = self._load(lambda: load_tokenizer(local))
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "left"
        model, info = self._load(lambda: AutoModelForSequenceClassification.from_pretrained(
            local, config=config, local_files_only=True, dtype=torch_dtype(dtype), output_loading_info=True))
        missing = info.get("missing_keys") or []
        if missing:
            raise RewardModelError(
                f"reward model '{self.path}' has no weights for {sorted(missing)[:3]}: it is not a trained sequence "
                "classifier; save one with AutoModelForSequenceClassification.save_pretrained"
            )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id  # the head finds the last token by it
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        bounds = [b for b in (self.tokenizer.model_max_length, getattr(config, "max_position_embeddings", None))
                  if isinstance(b, int) and 0 < b < 10**8]
        self.max_length = min(bounds, default=MAX_LENGTH)

    def _local_dir(self, storage_cfg: CheckpointConfig) -> Path:
        if not is_s3_uri(self.path) and not Path(self.path).is_dir():
            raise RewardModelError(
                f"reward model '{self.path}' does not exist: set reward.models[].path to a local Hugging Face "
                "model directory or an s3://bucket/prefix URI"
            )
        local = self._load(lambda: fetch_model(self.path, storage_cfg))
        missing = missing_model_files(local)
        if missing:
            raise RewardModelError(
                f"reward model '{self.path}' is missing {', '.join(missing)}: it must hold a complete Hugging Face "
                "sequence classifier with its tokenizer (save both with save_pretrained)"
            )
        return local

    def _config(self, local: Path):
        config = self._load(lambda: AutoConfig.from_pretrained(local, local_files_only=True))
        archs = getattr(config, "architectures", None) or []
        if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
            raise RewardModelError(
                f"reward model '{self.path}' is a {archs[0]}, not a sequence classifier: a reward model must be "
                "saved from AutoModelForSequenceClassification with num_labels=1"
            )
        if config.num_labels != 1:
            raise RewardModelError(
                f"reward model '{self.path}' has num_labels={config.num_labels}; a reward model gives one score per "
                "sequence: use a classifier trained with num_labels=1"
            )
        return config

    def _load(self, fn):
        try:
            return fn()
        except RewardModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - any loader failure becomes one line naming the model
            raise RewardModelError(f"reward model '{self.path}' could not be loaded: {_first_line(exc)}") from None

    def texts(self, prompts: list[Any], responses: list[str]) -> list[str]:
        """What the model reads for each pair (see the module's docstring); a conversational prompt (a list of
        messages, chat only) is its messages, after the system turn unless it has its own."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        if not self.chat:
            return [p + r for p, r in zip(prompts, responses, strict=True)]
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

        def turns(p: Any) -> list[dict[str, Any]]:
            if isinstance(p, list):
                return [*(system if p[0].get("role") != "system" else []), *p]
            return [*system, {"role": "user", "content": p}]

        return [
            self.tokenizer.apply_chat_template([*turns(p), {"role": "assistant", "content": r}], tokenize=False)
            for p, r in zip(prompts, responses, strict=True)
        ]

    def score(self, prompts: list[Any], responses: list[str]) -> list[float]:
        """One float per (prompt, response), computed ``batch_size`` pairs per forward pass."""
        texts = self.texts(prompts, responses)
        scores: list[float] = []
        for lo in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[lo: lo + self.batch_size], padding=True, truncation=True, max_length=self.max_length,
                add_special_tokens=not self.chat,  # a chat template writes its own special tokens
                return_tensors="pt",
            )
            with torch.inference_mode():
                logits = self.model(input_ids=enc["input_ids"].to(self.device),
                                    attention_mask=enc["attention_mask"].to(self.device)).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
