import pytest
import torch

from app.engine.layers.kv_cache import KVCache
from app.engine.loader import load_model
from app.errors import UserError
from app.model_folder import ModelFolder
from tests.engine.greedy import rewound_and_fresh_logits


def test_update_returns_committed_rows_plus_new_ones():
    cache = KVCache(2, 8, {"k": (1, 2)}, torch.float32, torch.device("cpu"))
    first = torch.ones(3, 1, 2)
    assert torch.equal(cache.update(1, "k", first), first)
    cache.advance(3)
    second = torch.full((2, 1, 2), 2.0)
    assert torch.equal(cache.update(1, "k", second), torch.cat([first, second]))
    assert cache.update(0, "k", second).shape[0] == 5


def test_context_full_is_a_user_error():
    cache = KVCache(1, 4, {"k": (1,)}, torch.float32, torch.device("cpu"))
    cache.advance(3)
    with pytest.raises(UserError, match="context is full"):
        cache.check_room(2)


def test_truncate_rewinds_the_model_exactly(tiny_gpt_oss):
    """After a rewind, re-feeding other tokens gives what a fresh cache would give: the speculation rewind."""
    model = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=40).model
    prompt = torch.arange(10, 22)  # longer than the sliding window
    rewound, fresh, length = rewound_and_fresh_logits(model, prompt)
    assert length == len(prompt) + 2
    assert torch.allclose(rewound, fresh, atol=1e-5)


def test_static_positions_see_every_row_and_match_the_eager_step(tiny_gpt_oss):
    """The shape-stable path a CUDA graph replays gives the same logits as the eager decode step."""
    model = load_model(ModelFolder.open(tiny_gpt_oss), dtype="float32", context=40).model
    eager, static = model.new_kv_cache(40), model.new_kv_cache(40)
    prompt = torch.arange(40, 52)
    with torch.inference_mode():
        model.forward(prompt, eager)
        model.forward(prompt, static)
        static.static_positions = torch.tensor([static.length])
        for token in (7, 8, 9):
            expected = model.forward(torch.tensor([token]), eager)
            static.static_positions.fill_(static.length)
            assert torch.allclose(model.forward(torch.tensor([token]), static), expected, atol=1e-5)
    assert static.length == eager.length == len(prompt) + 3
