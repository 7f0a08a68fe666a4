"""The step runner (runner.py) keeps a session's passes: later answers reuse the programs of the first."""

from app.engine.generation.sampling import SamplingParams
from app.engine.session import Prompt, Session, collect
from app.engine.spec.options import SpecOptions


def test_a_session_runs_every_answer_over_one_cache_and_its_programs(tiny_gpt_oss, tiny_dflash):
    for spec in (SpecOptions(), SpecOptions("dflash", str(tiny_dflash), 3)):
        session = Session.load(tiny_gpt_oss, spec, context=128, dtype="float32")
        ids = session.prompt_ids(Prompt(token_ids=list(range(40, 52))))
        first = collect(session.generate(ids, SamplingParams(), 10))
        runner, programs = session.runner, dict(session.runner.programs)
        second = collect(session.generate(ids, SamplingParams(), 10))
        assert session.runner is runner and runner.programs == programs and programs
        assert all(runner.programs[key] is program for key, program in programs.items())
        assert second["token_ids"] == first["token_ids"] and runner.cache.capacity == 128
