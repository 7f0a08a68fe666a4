"""Done's figures as the CLI prints them and the server sends them: the keys the documented contract names, in
the order the engine always wrote them, and read back by a client to the same figures."""

import json

from app.engine.generation.sampling import SamplingParams
from app.engine.session import Prompt, Session, collect
from app.engine.spec.options import SpecOptions
from app.protocol.stats import BatchStats, CacheStats, GenerationStats, SpecStats, stats_dict

CACHE_KEYS = ["hits", "misses", "bytes_fetched", "disk_reads", "evictions", "prefetches", "predicted",
              "predicted_used", "used_after_prediction", "cpu_computed", "prefetch_coverage", "prefetch_waste"]


def test_a_speculative_generations_json_has_the_contracts_keys_in_order(tiny_gpt_oss, tiny_dflash):
    session = Session.load(tiny_gpt_oss, SpecOptions("dflash", str(tiny_dflash), 3), context=128, dtype="float32")
    ids = session.prompt_ids(Prompt(token_ids=list(range(40, 52))))
    result = json.loads(json.dumps(collect(session.generate(ids, SamplingParams(), 10))))
    stats = result["stats"]
    assert list(stats) == ["prefill_tokens", "decode_tokens", "ttft_s", "decode_tok_s", "expert_cache", "spec"]
    assert list(stats["expert_cache"]) == CACHE_KEYS
    assert list(stats["spec"]) == ["policy", "steps", "block_sizes", "accepted_per_step", "mean_accepted"]
    assert stats["prefill_tokens"] == 12 and stats["decode_tokens"] == len(result["token_ids"]) - 1
    assert GenerationStats.from_dict(stats).as_dict() == stats


def test_figures_read_back_from_json_are_the_same_figures():
    cache = CacheStats(hits=7, misses=3, bytes_fetched=300, prefetches=2, predicted=4, predicted_used=3,
                       used_after_prediction=6)
    stats = GenerationStats(5, 9, 0.25, 31.5, cache, batch=BatchStats(9, 1.5))
    figures = json.loads(json.dumps(stats.as_dict()))
    assert "spec" not in figures and figures["batch"] == {"steps": 9, "mean_size": 1.5}
    assert figures["expert_cache"]["prefetch_coverage"] == 0.5 and figures["expert_cache"]["prefetch_waste"] == 0.25
    assert GenerationStats.from_dict(figures) == stats
    speculated = GenerationStats(5, 4, 0.1, 12.0, CacheStats(), spec=SpecStats("cost-aware", 2, [3, 2], [2, 0], 1.0))
    assert GenerationStats.from_dict(json.loads(json.dumps(speculated.as_dict()))) == speculated
    assert stats_dict(None) == {}  # a generation cancelled before it had figures
