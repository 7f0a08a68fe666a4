"""Speculative decoding: a drafter (DFlash in `dflash.py`, GLM's MTP layer in `mtp.py`) proposes a block,
the target verifies it in one pass, the accepted prefix stays in the KV cache and the rest is rewound
(`generate.py`, `step.py`, `accept.py`); the block
size of each step is chosen from measured acceptance and the predicted cost of the pass (`policy.py`,
`sizer.py`); the pass's first experts are copied before it starts (`routing.py`)."""
