"""Chats as token ids for the demo's training: the prompt as the app renders it (the folder's own chat
template), then the answer the target must learn on the final channel, ending with <|return|>; packing
into training rows; the target's own continuations of prompts (the drafter's training data)."""

import time

import torch

from app.engine.text.tokenizer import ChatTokenizer
from tools.demo.corpus import Chat
from tools.demo.drafter_data import DrafterData

ANSWER_PREFIX = "<|channel|>final<|message|>"
ANSWER_END = "<|return|>"
PAD_ID = 1  # <|endoftext|>
STOP_IDS = [2, 1]  # <|return|>, <|endoftext|>: the generation_config's eos ids


def encode_chat(tokenizer: ChatTokenizer, chat: Chat) -> tuple[list[int], list[int]]:
    """(prompt ids ending with the generation prompt, answer ids ending with <|return|>)."""
    prompt = tokenizer.render_chat(chat.messages, chat.reasoning_effort)
    return prompt, tokenizer.encode(ANSWER_PREFIX + chat.answer + ANSWER_END)


def pack(chats: list[tuple[list[int], list[int]]], sequence: int) -> torch.Tensor:
    """All chats end to end, cut into rows [N, sequence] (the tail that fills no row is dropped)."""
    stream = torch.tensor([token for prompt, answer in chats for token in prompt + answer])
    rows = len(stream) // sequence
    return stream[: rows * sequence].view(rows, sequence)


@torch.no_grad()
def heldout_perplexity(model, chats: list[tuple[list[int], list[int]]], device: torch.device, batch: int = 16) -> float:
    """exp of the mean negative log-likelihood of the answer tokens given their prompts."""
    total, count = 0.0, 0
    for first in range(0, len(chats), batch):
        group = chats[first: first + batch]
        width = max(len(p) + len(a) for p, a in group)
        ids = torch.full((len(group), width), PAD_ID)
        scored = torch.zeros(len(group), width, dtype=torch.bool)
        for row, (prompt, answer) in enumerate(group):
            ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
            scored[row, len(prompt): len(prompt) + len(answer)] = True
        ids, scored = ids.to(device), scored.to(device)
        logits = model(input_ids=ids).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        mask = scored[:, 1:].flatten()
        total, count = total + float(nll[mask].sum()), count + int(mask.sum())
    return float(torch.exp(torch.tensor(total / count)))


@torch.no_grad()
def continuations(model, prompts: list[list[int]], max_new_tokens: int, temperature: float, batch: int,
                  device: torch.device, seed: int, seconds: float, log) -> DrafterData:
    """The target's own answers to `prompts` (greedy at temperature 0), batch by batch until `seconds`
    have passed: the rows a drafter learns to predict."""
    torch.manual_seed(seed)
    pairs, started = [], time.monotonic()
    for first in range(0, len(prompts), batch):
        group = prompts[first: first + batch]
        width = max(map(len, group))
        ids = torch.full((len(group), width), PAD_ID)
        attention = torch.zeros(len(group), width, dtype=torch.long)
        for row, prompt in enumerate(group):  # left padding
            ids[row, width - len(prompt):], attention[row, width - len(prompt):] = torch.tensor(prompt), 1
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature \
            else {"do_sample": False}
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            out = model.generate(input_ids=ids.to(device), attention_mask=attention.to(device),
                                 max_new_tokens=max_new_tokens, pad_token_id=PAD_ID, eos_token_id=STOP_IDS,
                                 **sampling).cpu()
        for row, prompt in enumerate(group):
            answer = out[row, width:].tolist()
            ends = [i for i, token in enumerate(answer) if token in STOP_IDS]
            pairs.append((prompt, answer[: ends[0] + 1] if ends else answer))
        log(f"continuations: {len(pairs)} at temperature {temperature}, {time.monotonic() - started:.0f} s")
        if time.monotonic() - started > seconds:
            break
    return DrafterData.from_pairs(pairs, PAD_ID)
