"""Greedy DFlash acceptance replayed on a known greedy continuation (float32, transformers target + the
drafter's training forward): what the engine's speculative loop does at temperature 0, step by step.

Greedy speculation emits exactly the greedy continuation, so each step's anchor position p is known in
advance: the drafter sees the target's features of positions < p and the anchor token, its block's
leading drafts that equal the continuation are accepted (a), and the next step starts at p + a + 1.
τ = tokens emitted / steps. tests/tools checks it against the engine's own count.
"""

import torch

from tools.demo.drafter import DFlashTrainee


@torch.no_grad()
def greedy_tau(target, trainee: DFlashTrainee, prompt: list[int], continuation: list[int],
               block_size: int) -> tuple[int, int]:
    """(tokens emitted, verify steps) of greedy speculation with `block_size` over `continuation`."""
    config = trainee.config
    sequence = torch.tensor([prompt + continuation])
    layer_ids = config["dflash_config"]["target_layer_ids"]
    hidden = target(input_ids=sequence, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i + 1] for i in layer_ids], dim=-1).float()
    embed, lm_head = target.get_input_embeddings().weight, target.lm_head.weight
    mask = config["dflash_config"]["mask_token_id"]
    position, end, steps = len(prompt), len(prompt) + len(continuation), 0
    # The first token comes from the prefill; each step then verifies an anchor and its drafts.
    while position < end - 1:
        count = min(block_size, end - 1 - position)  # the last block stops at the last token
        block = torch.full((1, 1, count), mask)
        block[0, 0, 0] = sequence[0, position]
        out = trainee(embed[block].float(), features[:, :position], torch.tensor([[position]]))
        drafts = (out[0, 0, 1:] @ lm_head.T.float()).argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == int(sequence[0, position + 1 + accepted]):
            accepted += 1
        position += accepted + 1
        steps += 1
    return end - len(prompt) - 1, steps
